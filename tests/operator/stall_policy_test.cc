// Stalled ranks: the condition, status.stall and the once-per-stall event from the agents'
// readings and from a Stalled termination message; the Stalled failure's stack and
// retryability. Stragglers: the condition, status.straggler and the once-per-straggler event
// from the job's straggler, below a stall.
#include "operator/policy/stall_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "operator/policy/restart_policy.h"
#include "tests/operator/test_pods.h"

namespace spawnpoint::op {
namespace {

using namespace policy_test;  // json, seconds, HasSubstr, kT0, Pod, Terminated

constexpr const char* kNow = "2024-05-01T10:05:00Z";

// A stall as the agent's status document has it (docs/status.md).
json AgentStall(int rank, const std::string& pod, double silent) {
  return {{"rank", rank},
          {"pod", pod},
          {"silentSeconds", silent},
          {"medianStepSeconds", 0.41},
          {"beforeFirstStep", false},
          {"topFrame", "all_reduce"},
          {"stackSource", "eu-stack"},
          {"message", "rank " + std::to_string(rank) + " (pod " + pod + ") made no step for " +
                          std::to_string(static_cast<int>(silent)) +
                          " s; median step 0.41 s; top frame: all_reduce"},
          {"waiting", json::array({0})}};
}

TEST(StallPolicyTest, AReportedStallSetsTheConditionAndOneEvent) {
  StallUpdate u = DecideStallFromReading(nullptr, AgentStall(1, "big-node-0", 312), kNow);
  ASSERT_TRUE(u.stalled.has_value());
  EXPECT_TRUE(*u.stalled);
  EXPECT_EQ(u.reason, "RankStalled");
  EXPECT_EQ(u.message,
            "rank 1 (pod big-node-0) made no step for 312 s; median step 0.41 s; top frame: "
            "all_reduce");
  EXPECT_TRUE(u.event);
  EXPECT_EQ(u.event_message, u.message);
  EXPECT_EQ(u.stall["rank"], 1);
  EXPECT_EQ(u.stall["pod"], "big-node-0");
  EXPECT_EQ(u.stall["topFrame"], "all_reduce");
  EXPECT_EQ(u.stall["waiting"], json::array({0}));
  EXPECT_EQ(u.stall["since"], kNow);
  EXPECT_FALSE(u.stall.contains("message")) << "the message is the condition's";

  // The next reading of the same stall: the message follows, no second event, `since` kept.
  StallUpdate next =
      DecideStallFromReading(u.stall, AgentStall(1, "big-node-0", 342), "2024-05-01T10:05:30Z");
  EXPECT_TRUE(*next.stalled);
  EXPECT_FALSE(next.event);
  EXPECT_THAT(next.message, HasSubstr("342 s"));
  EXPECT_EQ(next.stall["since"], kNow);
  EXPECT_EQ(next.stall["silentSeconds"], 342);
}

TEST(StallPolicyTest, AnotherRankOrAStallAfterProgressIsANewEvent) {
  json previous = DecideStallFromReading(nullptr, AgentStall(1, "big-node-0", 40), kNow).stall;
  EXPECT_TRUE(DecideStallFromReading(previous, AgentStall(3, "big-node-1", 50), kNow).event);
  EXPECT_TRUE(DecideStallFromReading(previous, AgentStall(1, "big-node-1", 50), kNow).event);
  // Silent for less time than before: the rank stepped in between and stalled again.
  StallUpdate again = DecideStallFromReading(previous, AgentStall(1, "big-node-0", 6), kNow);
  EXPECT_TRUE(again.event);
  EXPECT_EQ(again.stall["since"], kNow);
}

TEST(StallPolicyTest, NoStallReportedClearsTheCondition) {
  json previous = DecideStallFromReading(nullptr, AgentStall(1, "big-node-0", 40), kNow).stall;
  StallUpdate u = DecideStallFromReading(previous, nullptr, kNow);
  ASSERT_TRUE(u.stalled.has_value());
  EXPECT_FALSE(*u.stalled);
  EXPECT_EQ(u.reason, "Progressing");
  EXPECT_FALSE(u.message.empty());
  EXPECT_TRUE(u.stall.is_null());
  EXPECT_FALSE(u.event);
}

PodFailure StalledFailure(bool retryable) {
  PodFailure f;
  f.node = 0;
  f.pod = "big-node-0";
  f.rank = 1;
  f.exit_code = 137;
  f.reason = "Stalled";
  f.message = "rank 1 (pod big-node-0) made no step for 5 s; median step 0.01 s";
  f.retryable = retryable;
  return f;
}

TEST(StallPolicyTest, AStalledFailureThatFailsTheJobLeavesTheConditionTrue) {
  StallUpdate u = DecideStallAfterFailure(nullptr, StalledFailure(false), /*restart=*/false,
                                          /*attempt=*/0, kNow);
  ASSERT_TRUE(u.stalled.has_value());
  EXPECT_TRUE(*u.stalled);
  EXPECT_EQ(u.reason, "RankStalled");
  EXPECT_THAT(u.message, HasSubstr("rank 1 (pod big-node-0) made no step"));
  EXPECT_TRUE(u.event);
  EXPECT_EQ(u.stall["rank"], 1);
  EXPECT_EQ(u.stall["pod"], "big-node-0");
}

TEST(StallPolicyTest, AStallTheAgentsAlreadyReportedIsNotAnotherEvent) {
  json previous = DecideStallFromReading(nullptr, AgentStall(1, "big-node-0", 5), kNow).stall;
  StallUpdate u = DecideStallAfterFailure(previous, StalledFailure(false), false, 0, kNow);
  EXPECT_FALSE(u.event);
  EXPECT_TRUE(*u.stalled);
  EXPECT_EQ(u.stall["since"], kNow);
}

TEST(StallPolicyTest, ARestartClearsTheStallAndStillRecordsTheEvent) {
  StallUpdate u = DecideStallAfterFailure(nullptr, StalledFailure(true), /*restart=*/true,
                                          /*attempt=*/2, kNow);
  ASSERT_TRUE(u.stalled.has_value());
  EXPECT_FALSE(*u.stalled);
  EXPECT_EQ(u.reason, "GangRestarted");
  EXPECT_THAT(u.message, HasSubstr("attempt 2"));
  EXPECT_TRUE(u.stall.is_null());
  EXPECT_TRUE(u.event);
  EXPECT_THAT(u.event_message, HasSubstr("made no step"));
}

TEST(StallPolicyTest, OtherFailuresLeaveTheStallAloneUnlessTheGangRestarts) {
  PodFailure oom;
  oom.node = 1;
  oom.pod = "big-node-1";
  oom.reason = "OOMKilled";
  json previous = DecideStallFromReading(nullptr, AgentStall(1, "big-node-0", 5), kNow).stall;
  StallUpdate fails = DecideStallAfterFailure(previous, oom, /*restart=*/false, 0, kNow);
  EXPECT_FALSE(fails.stalled.has_value());
  EXPECT_FALSE(fails.event);
  EXPECT_EQ(fails.stall, previous);
  StallUpdate restarts = DecideStallAfterFailure(previous, oom, /*restart=*/true, 0, kNow);
  EXPECT_FALSE(*restarts.stalled);
  EXPECT_FALSE(restarts.event);
  EXPECT_TRUE(restarts.stall.is_null());
}

// The job's straggler as JobStraggler names it (operator/utilisation/agent_status.h).
json JobStraggler(int rank, const std::string& pod, double ratio) {
  return {{"rank", rank},
          {"pod", pod},
          {"ratio", ratio},
          {"busySeconds", 0.05 * ratio},
          {"peersBusySeconds", 0.05},
          {"windowSteps", 20},
          {"message", "the operator's words"}};
}

// A slow rank is not a hang: the straggler has its own condition, and Stalled says only that
// no rank stalled.
TEST(StallPolicyTest, AStragglerSetsItsOwnConditionAndOneEventNeverStalled) {
  StallUpdate u = DecideStallFromReadings(nullptr, nullptr, json(nullptr),
                                          JobStraggler(1, "big-node-1", 1.98), kNow);
  ASSERT_TRUE(u.straggling.has_value());
  EXPECT_TRUE(*u.straggling);
  EXPECT_EQ(u.straggling_reason, "SlowerThanPeers");
  EXPECT_EQ(u.straggling_message,
            "rank 1 (pod big-node-1) is 1.98x slower than the other ranks: 0.099 s of its own "
            "work per step vs 0.05 s (medians of the last 20 steps)");
  ASSERT_TRUE(u.stalled.has_value());
  EXPECT_FALSE(*u.stalled) << "no rank stalled";
  EXPECT_EQ(u.reason, "Progressing");
  EXPECT_FALSE(u.event) << "no stall";
  EXPECT_TRUE(u.stall.is_null());
  EXPECT_TRUE(u.straggler_event);
  EXPECT_EQ(u.straggler_event_message, u.straggling_message);
  ASSERT_TRUE(u.straggler.has_value());
  EXPECT_EQ((*u.straggler)["rank"], 1);
  EXPECT_EQ((*u.straggler)["pod"], "big-node-1");
  EXPECT_EQ((*u.straggler)["ratio"], 1.98);
  EXPECT_EQ((*u.straggler)["peersBusySeconds"], 0.05);
  EXPECT_EQ((*u.straggler)["since"], kNow);
  EXPECT_FALSE(u.straggler->contains("message")) << "the message is the condition's";

  // Read again, slower still: the message follows, no second event, `since` kept.
  StallUpdate next =
      DecideStallFromReadings(nullptr, *u.straggler, json(nullptr),
                              JobStraggler(1, "big-node-1", 2.5), "2024-05-01T10:05:30Z");
  EXPECT_TRUE(*next.straggling);
  EXPECT_EQ(next.straggling_reason, "SlowerThanPeers");
  EXPECT_THAT(next.straggling_message, HasSubstr("is 2.50x slower"));
  EXPECT_FALSE(next.straggler_event);
  EXPECT_EQ((*next.straggler)["since"], kNow);
  EXPECT_EQ((*next.straggler)["ratio"], 2.5);
}

TEST(StallPolicyTest, AnotherStragglerOrOneNamedAgainAfterItClearedIsANewEvent) {
  json named = *DecideStallFromReadings(nullptr, nullptr, json(nullptr),
                                        JobStraggler(1, "big-node-1", 2), kNow)
                    .straggler;
  EXPECT_TRUE(
      DecideStallFromReadings(nullptr, named, json(nullptr), JobStraggler(3, "big-node-1", 2), kNow)
          .straggler_event);
  EXPECT_TRUE(
      DecideStallFromReadings(nullptr, named, json(nullptr), JobStraggler(1, "big-node-2", 2), kNow)
          .straggler_event);

  StallUpdate cleared = DecideStallFromReadings(nullptr, named, json(nullptr), json(nullptr), kNow);
  ASSERT_TRUE(cleared.straggling.has_value());
  EXPECT_FALSE(*cleared.straggling);
  EXPECT_EQ(cleared.straggling_reason, "NoStraggler");
  EXPECT_FALSE(cleared.straggling_message.empty());
  ASSERT_TRUE(cleared.straggler.has_value());
  EXPECT_TRUE(cleared.straggler->is_null());
  EXPECT_FALSE(cleared.straggler_event);
  EXPECT_TRUE(DecideStallFromReadings(nullptr, *cleared.straggler, json(nullptr),
                                      JobStraggler(1, "big-node-1", 2), kNow)
                  .straggler_event);
}

TEST(StallPolicyTest, AStalledRankAndAStragglerEachHaveTheirCondition) {
  StallUpdate both = DecideStallFromReadings(nullptr, nullptr, AgentStall(0, "big-node-0", 40),
                                             JobStraggler(1, "big-node-1", 2), kNow);
  EXPECT_TRUE(*both.stalled);
  EXPECT_EQ(both.reason, "RankStalled");
  EXPECT_THAT(both.message, HasSubstr("made no step"));
  EXPECT_TRUE(both.event);
  EXPECT_TRUE(*both.straggling);
  EXPECT_THAT(both.straggling_message, HasSubstr("rank 1 (pod big-node-1) is 2.00x slower"));
  EXPECT_TRUE(both.straggler_event);
  EXPECT_EQ((*both.straggler)["rank"], 1);

  // The stall is over, the straggler is not: Stalled clears, Straggler stays, no new event.
  StallUpdate after = DecideStallFromReadings(both.stall, *both.straggler, json(nullptr),
                                              JobStraggler(1, "big-node-1", 2), kNow);
  EXPECT_FALSE(*after.stalled);
  EXPECT_EQ(after.reason, "Progressing");
  EXPECT_TRUE(*after.straggling);
  EXPECT_FALSE(after.straggler_event);
  EXPECT_FALSE(after.event);
  EXPECT_TRUE(after.stall.is_null());
}

TEST(StallPolicyTest, WhatCannotBeReadIsKept) {
  json named = *DecideStallFromReadings(nullptr, nullptr, json(nullptr),
                                        JobStraggler(1, "big-node-1", 2), kNow)
                    .straggler;
  // Every agent was read for the stall but not all for the straggler: the straggler stands.
  StallUpdate u = DecideStallFromReadings(nullptr, named, json(nullptr), std::nullopt, kNow);
  EXPECT_FALSE(u.straggler.has_value()) << "status.straggler is left as it is";
  ASSERT_TRUE(u.straggling.has_value());
  EXPECT_TRUE(*u.straggling);
  EXPECT_THAT(u.straggling_message, HasSubstr("rank 1 (pod big-node-1) is 2.00x slower"));
  EXPECT_FALSE(u.straggler_event);
  EXPECT_FALSE(*u.stalled);

  // No straggler, and the stall not known: a stall named before stands.
  json stall = DecideStallFromReading(nullptr, AgentStall(0, "big-node-0", 40), kNow).stall;
  u = DecideStallFromReadings(stall, named, std::nullopt, json(nullptr), kNow);
  EXPECT_FALSE(u.stalled.has_value()) << "the condition stays RankStalled";
  EXPECT_EQ(u.stall, stall);
  EXPECT_TRUE(u.straggler->is_null());
  EXPECT_FALSE(*u.straggling);

  // Only the stall known, and nothing named: as DecideStallFromReading says.
  u = DecideStallFromReadings(nullptr, nullptr, json(nullptr), std::nullopt, kNow);
  EXPECT_FALSE(*u.stalled);
  EXPECT_EQ(u.reason, "Progressing");
  EXPECT_FALSE(u.straggler.has_value());
  EXPECT_FALSE(u.straggling.has_value());
}

TEST(StallPolicyTest, ARestartClearsTheStraggler) {
  PodFailure oom;
  oom.node = 1;
  oom.pod = "big-node-1";
  oom.reason = "OOMKilled";
  StallUpdate restarts = DecideStallAfterFailure(nullptr, oom, /*restart=*/true, 0, kNow);
  ASSERT_TRUE(restarts.straggler.has_value());
  EXPECT_TRUE(restarts.straggler->is_null());
  ASSERT_TRUE(restarts.straggling.has_value());
  EXPECT_FALSE(*restarts.straggling);
  EXPECT_EQ(restarts.straggling_reason, "GangRestarted");
  EXPECT_FALSE(
      DecideStallAfterFailure(nullptr, oom, /*restart=*/false, 0, kNow).straggler.has_value());
}

// The termination message of a rank the agent stopped for a stall.
json StalledMessage(bool retryable, const std::string& stack) {
  return {{"rank", 1},
          {"localRank", 1},
          {"nodeRank", 0},
          {"exitCode", 137},
          {"signal", "SIGKILL"},
          {"reason", "Stalled"},
          {"message",
           "rank 1 (pod job-node-0) made no step for 5.1 s; median step 0.01 s; top "
           "frame: HangForever"},
          {"stack", stack},
          {"retryable", retryable},
          {"restarts", 0}};
}

TEST(StallPolicyTest, TheStalledTerminationMessageCarriesTheStackAndItsRetryability) {
  const std::string stack = "Thread 1:\n  #0 HangForever\n  #1 main\n";
  api::RestartPolicy policy;
  policy.max_restarts = 3;
  // Fail: not retryable although 137 (a SIGKILL) would be by its exit code.
  PodFailure fail = ClassifyPodFailure(
      Pod(0, "Failed", Terminated(1, "Error", StalledMessage(false, stack).dump())), "trainer",
      policy);
  EXPECT_EQ(fail.reason, "Stalled");
  EXPECT_EQ(fail.rank, 1);
  EXPECT_FALSE(fail.retryable);
  EXPECT_EQ(fail.stack, stack);
  json last = fail.ToJson();
  EXPECT_EQ(last["stack"], stack);
  EXPECT_EQ(last["retryable"], false);
  RestartDecision d = DecideRestart(fail, policy, 0, 1);
  EXPECT_FALSE(d.restart);
  EXPECT_EQ(d.reason, "NonRetryableFailure");
  EXPECT_THAT(d.message, HasSubstr("stallPolicy.action is Fail"));

  // Restart: retryable whatever the exit code says (retryableExitCodes leaves out 137 here).
  policy.retryable_exit_codes = {1};
  PodFailure restart = ClassifyPodFailure(
      Pod(0, "Failed", Terminated(1, "Error", StalledMessage(true, stack).dump())), "trainer",
      policy);
  EXPECT_TRUE(restart.retryable);
  EXPECT_TRUE(DecideRestart(restart, policy, 0, 1).restart);
}

TEST(StallPolicyTest, ALongStackIsTrimmedAtALine) {
  std::string stack;
  for (int i = 0; stack.size() < 20000; ++i) stack += "  #" + std::to_string(i) + " frame_ü\n";
  api::RestartPolicy policy;
  PodFailure f = ClassifyPodFailure(
      Pod(0, "Failed", Terminated(137, "Error", StalledMessage(false, stack).dump())), "trainer",
      policy);
  EXPECT_LE(f.stack.size(), kMaxFailureStackBytes);
  EXPECT_GT(f.stack.size(), kMaxFailureStackBytes / 2);
  EXPECT_EQ(f.stack.rfind("  #0 frame_ü\n", 0), 0u) << "the top frames are kept";
  EXPECT_THAT(f.stack, ::testing::EndsWith("frame_ü\n... (trimmed)"));
  EXPECT_NO_THROW(f.ToJson().dump()) << "valid UTF-8";
}

TEST(StallPolicyTest, WithoutRetryableTheExitCodeDecidesAsBefore) {
  json message = StalledMessage(false, "");
  message.erase("retryable");
  message.erase("stack");
  api::RestartPolicy policy;
  PodFailure f = ClassifyPodFailure(Pod(0, "Failed", Terminated(137, "Error", message.dump())),
                                    "trainer", policy);
  EXPECT_TRUE(f.retryable) << "137 is retryable by default";
  EXPECT_TRUE(f.stack.empty());
  EXPECT_FALSE(f.ToJson().contains("stack"));
}

}  // namespace
}  // namespace spawnpoint::op
