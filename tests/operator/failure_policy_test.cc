// Why a pod failed and whether it restarts the gang.
#include "operator/policy/failure_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/operator/test_pods.h"

namespace spawnpoint::op {
namespace {

using namespace policy_test;  // json, seconds, HasSubstr, kT0, Pod, Terminated

TEST(FailurePolicyTest, ExitCodesRetryable128To255ByDefault) {
  api::RestartPolicy p;
  EXPECT_FALSE(IsRetryableExitCode(p, 1));
  EXPECT_FALSE(IsRetryableExitCode(p, 127));
  EXPECT_TRUE(IsRetryableExitCode(p, 128));
  EXPECT_TRUE(IsRetryableExitCode(p, 137));
  EXPECT_TRUE(IsRetryableExitCode(p, 255));
  p.retryable_exit_codes = {3, 42};
  EXPECT_TRUE(IsRetryableExitCode(p, 42));
  EXPECT_FALSE(IsRetryableExitCode(p, 137)) << "the list replaces the default";
}

TEST(FailurePolicyTest, ContainerExitCodeAndReason) {
  PodFailure f = ClassifyPodFailure(Pod(1, "Failed", Terminated(137, "OOMKilled")), "trainer", {});
  EXPECT_EQ(f.node, 1);
  EXPECT_EQ(f.pod, "job-node-1");
  EXPECT_EQ(f.exit_code, 137);
  EXPECT_EQ(f.signal, 9);
  EXPECT_EQ(f.reason, "OOMKilled");
  EXPECT_TRUE(f.retryable);
  EXPECT_EQ(f.rank, -1);
  EXPECT_EQ(f.Describe(), "node 1 (pod job-node-1) exited 137 (OOMKilled)");
}

TEST(FailurePolicyTest, AgentTerminationMessageWins) {
  json agent = {{"rank", 5}, {"exitCode", 1}, {"reason", "UserError"}, {"message", "ValueError"}};
  PodFailure f =
      ClassifyPodFailure(Pod(1, "Failed", Terminated(1, "Error", agent.dump())), "trainer", {});
  EXPECT_EQ(f.rank, 5);
  EXPECT_EQ(f.reason, "UserError");
  EXPECT_EQ(f.message, "ValueError");
  EXPECT_FALSE(f.retryable);
  EXPECT_THAT(f.Describe(), HasSubstr("rank 5 exited 1 (UserError): ValueError"));
}

TEST(FailurePolicyTest, NonJsonTerminationMessageIsKeptAsTheMessage) {
  PodFailure f = ClassifyPodFailure(
      Pod(0, "Failed", Terminated(2, "Error", "Traceback (most recent call last)")), "trainer", {});
  EXPECT_EQ(f.message, "Traceback (most recent call last)");
  EXPECT_EQ(f.reason, "Error");
}

TEST(FailurePolicyTest, EvictionPreemptionAndNodeLossAreAlwaysRetryable) {
  api::RestartPolicy only_three;
  only_three.retryable_exit_codes = {3};
  PodFailure evicted =
      ClassifyPodFailure(Pod(0, "Failed", {{"reason", "Evicted"}, {"message", "low on memory"}}),
                         "trainer", only_three);
  EXPECT_EQ(evicted.reason, "Evicted");
  EXPECT_TRUE(evicted.retryable);
  json preempted_status = Terminated(143, "Error");
  preempted_status["conditions"] = json::array({{{"type", "DisruptionTarget"},
                                                 {"status", "True"},
                                                 {"reason", "PreemptionByScheduler"},
                                                 {"message", "preempted by ml/high"}}});
  PodFailure preempted =
      ClassifyPodFailure(Pod(0, "Failed", preempted_status), "trainer", only_three);
  EXPECT_EQ(preempted.reason, "Preempted");
  EXPECT_EQ(preempted.message, "preempted by ml/high");
  EXPECT_TRUE(preempted.retryable);
  EXPECT_EQ(ClassifyPodFailure(Pod(0, "Failed", {{"reason", "NodeLost"}}), "trainer", {}).reason,
            "NodeLost");
}

TEST(FailurePolicyTest, FailedAgentInstallIsNamed) {
  json status = {
      {"initContainerStatuses",
       json::array({{{"name", "spawnpoint-agent-install"},
                     {"state", {{"terminated", {{"exitCode", 1}, {"reason", "Error"}}}}}}})},
      {"containerStatuses",
       json::array(
           {{{"name", "trainer"}, {"state", {{"waiting", {{"reason", "PodInitializing"}}}}}}})}};
  PodFailure f = ClassifyPodFailure(Pod(0, "Failed", status), "trainer", {});
  EXPECT_EQ(f.exit_code, 1);
  EXPECT_FALSE(f.retryable);
}

TEST(FailurePolicyTest, FailedWithoutAnyContainerVerdict) {
  PodFailure f = ClassifyPodFailure(
      Pod(0, "Failed", {{"reason", "OutOfnvidia.com/gpu"}, {"message", "no GPU left"}}), "trainer",
      {});
  EXPECT_EQ(f.reason, "OutOfnvidia.com/gpu");
  EXPECT_EQ(f.message, "no GPU left");
  EXPECT_FALSE(f.retryable);
}

TEST(FailurePolicyTest, FirstFailureIsTheEarliestThenTheRetryableThenTheLowestNode) {
  PodFailure early{.node = 1, .exit_code = 1, .finished_at = "2024-05-01T10:00:01Z"};
  PodFailure late_kill{
      .node = 0, .exit_code = 137, .retryable = true, .finished_at = "2024-05-01T10:00:02Z"};
  EXPECT_EQ(FirstFailure({late_kill, early}).node, 1);
  PodFailure same_second_kill{
      .node = 2, .exit_code = 137, .retryable = true, .finished_at = "2024-05-01T10:00:01Z"};
  EXPECT_EQ(FirstFailure({early, same_second_kill}).node, 2);
  PodFailure unknown{.node = 0, .exit_code = 1};
  EXPECT_EQ(FirstFailure({unknown, early}).node, 1);
}

// Issue 16: the agent's account of the rank's own words reaches status.lastFailure.
TEST(FailurePolicyTest, TheRanksOwnWordsAreCarried) {
  json agent = {{"rank", 1},
                {"exitCode", 3},
                {"reason", "GpuOutOfMemory"},
                {"message", "GPU out of memory: \"RuntimeError: CUDA error: out of memory\""},
                {"line", "RuntimeError: CUDA error: out of memory"},
                {"exception", "RuntimeError"},
                {"logTail", "epoch 2\nRuntimeError: CUDA error: out of memory"},
                {"logStream", "stderr"},
                {"failedAt", "2024-05-01T10:00:04.250Z"},
                {"consequences", json::array({{{"rank", 0},
                                               {"nodeRank", 1},
                                               {"exitCode", 1},
                                               {"reason", "CollectiveError"},
                                               {"line", "gloo: Connection closed by peer"}}})}};
  PodFailure f =
      ClassifyPodFailure(Pod(1, "Failed", Terminated(1, "Error", agent.dump())), "trainer", {});
  EXPECT_EQ(f.reason, "GpuOutOfMemory");
  EXPECT_FALSE(f.retryable) << "exit 3 under the default rule";
  json j = f.ToJson();
  EXPECT_EQ(j["line"], "RuntimeError: CUDA error: out of memory");
  EXPECT_EQ(j["exception"], "RuntimeError");
  EXPECT_EQ(j["logTail"], "epoch 2\nRuntimeError: CUDA error: out of memory");
  EXPECT_EQ(j["logStream"], "stderr");
  EXPECT_EQ(j["failedAt"], "2024-05-01T10:00:04.250Z");
  EXPECT_EQ(j["consequences"][0]["reason"], "CollectiveError");
  EXPECT_EQ(j["consequences"][0]["node"], 1);
  EXPECT_EQ(f.Describe(),
            "node 1 (pod job-node-1) rank 1 exited 3 (GpuOutOfMemory): GPU out of memory: "
            "\"RuntimeError: CUDA error: out of memory\"");
  // A tail longer than status keeps is cut from the front, at a line.
  std::string tail;
  for (int i = 0; i < 1000; ++i) tail += "line " + std::to_string(i) + "\n";
  agent["logTail"] = tail + "the end";
  f = ClassifyPodFailure(Pod(1, "Failed", Terminated(1, "Error", agent.dump())), "trainer", {});
  EXPECT_LE(f.log_tail.size(), kMaxLogTailBytes);
  EXPECT_EQ(f.log_tail.rfind("...\nline ", 0), 0u) << f.log_tail.substr(0, 40);
  EXPECT_THAT(f.log_tail, ::testing::EndsWith("line 999\nthe end"));
}

TEST(FailurePolicyTest, RetryOnNamesCauses) {
  json agent = {{"rank", 1}, {"exitCode", 1}, {"reason", "CollectiveTimeout"}, {"message", "m"}};
  api::RestartPolicy p;
  json pod = Pod(1, "Failed", Terminated(1, "Error", agent.dump()));
  EXPECT_FALSE(ClassifyPodFailure(pod, "trainer", p).retryable);
  p.retry_on_causes = {"CollectiveTimeout"};
  EXPECT_TRUE(ClassifyPodFailure(pod, "trainer", p).retryable);
  // The kubelet's OOMKilled is a cause too; the default 128-255 no longer holds.
  p.retry_on_causes = {"Killed"};
  EXPECT_FALSE(
      ClassifyPodFailure(Pod(0, "Failed", Terminated(137, "OOMKilled")), "trainer", p).retryable);
  p.retry_on_causes = {"OOMKilled"};
  EXPECT_TRUE(
      ClassifyPodFailure(Pod(0, "Failed", Terminated(137, "OOMKilled")), "trainer", p).retryable);
}

// Node 1's pod ended first (node 0's agent was still tearing down), but node 0's rank was
// killed before node 1's rank saw its gloo error: the agents' times order them.
TEST(FailurePolicyTest, TheAgentsFailureTimesFindTheCauseAndThePeersAreItsConsequences) {
  PodFailure gloo{.node = 1,
                  .pod = "job-node-1",
                  .rank = 1,
                  .exit_code = 1,
                  .reason = "CollectiveError",
                  .finished_at = "2024-05-01T10:00:01Z",
                  .line = "gloo: Connection closed by peer",
                  .failed_at = "2024-05-01T10:00:00.900Z"};
  PodFailure kill{.node = 0,
                  .pod = "job-node-0",
                  .rank = 0,
                  .exit_code = 137,
                  .reason = "Killed",
                  .retryable = true,
                  .finished_at = "2024-05-01T10:00:03Z",
                  .failed_at = "2024-05-01T10:00:00.500Z"};
  for (const auto& order : {std::vector<PodFailure>{gloo, kill}, {kill, gloo}}) {
    PodFailure first = FirstFailure(order);
    EXPECT_EQ(first.node, 0);
    EXPECT_TRUE(first.retryable);
    ASSERT_EQ(first.consequences.size(), 1u);
    EXPECT_EQ(first.consequences[0]["node"], 1);
    EXPECT_EQ(first.consequences[0]["reason"], "CollectiveError");
    EXPECT_EQ(first.consequences[0]["line"], "gloo: Connection closed by peer");
  }
  // The collective error yields even when it was seen first (node 0's agent was slow to see
  // its rank die), and even to a non-retryable cause.
  kill.failed_at = "2024-05-01T10:00:01.500Z";
  EXPECT_EQ(FirstFailure({gloo, kill}).node, 0);
  kill.retryable = false;
  EXPECT_EQ(FirstFailure({gloo, kill}).node, 0);
  // Of two collective errors, the earlier.
  PodFailure other_gloo = gloo;
  other_gloo.node = 2;
  other_gloo.failed_at = "2024-05-01T10:00:00.800Z";
  EXPECT_EQ(FirstFailure({gloo, other_gloo}).node, 2);
}

TEST(FailurePolicyTest, TheSummaryIsOneBoundedLine) {
  PodFailure f{.node = 0, .pod = "p", .exit_code = 1, .reason = "UserError"};
  f.message = std::string(1000, 'x') + "\nsecond line";
  const std::string s = f.Describe();
  EXPECT_EQ(s.find('\n'), std::string::npos);
  EXPECT_LE(s.size(), kMaxSummaryMessageBytes + 60);
  EXPECT_THAT(s, ::testing::EndsWith("xxx..."));
}

}  // namespace
}  // namespace spawnpoint::op
