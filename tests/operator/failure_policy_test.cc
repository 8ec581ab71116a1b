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

}  // namespace
}  // namespace spawnpoint::op
