// The agent's restart decision: what each way an attempt ends leads to, with the shared
// restart rule (api/restart_rule.h) underneath.
#include "agent/run/attempt_decision.h"

#include <signal.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace spawnpoint::agent {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

GangResult FailedWith(int exit_code) {
  GangResult r;
  r.outcome = GangOutcome::kFailed;
  RankFailure f;
  f.rank = 1;
  f.status = {exit_code, 0};
  f.cause = ClassifyExit(f.status, {}, {});
  r.failure = f;
  return r;
}

api::RestartPolicy Policy(int max_restarts, int backoff_seconds) {
  api::RestartPolicy p;
  p.max_restarts = max_restarts;
  p.backoff_seconds = backoff_seconds;
  return p;
}

TEST(AttemptDecisionTest, SuccessEndsTheJobWithZero) {
  AttemptDecision d = Decide(GangResult{}, 0, Policy(3, 10), true, 1);
  EXPECT_FALSE(d.restart);
  EXPECT_EQ(d.phase, AgentPhase::kSucceeded);
  EXPECT_EQ(d.exit_code, 0);
  EXPECT_STREQ(AgentPhaseName(d.phase), "Succeeded");
}

TEST(AttemptDecisionTest, AStopEndsTheJobWith128PlusTheSignal) {
  GangResult r;
  r.outcome = GangOutcome::kInterrupted;
  r.interrupt_signal = SIGTERM;
  AttemptDecision d = Decide(r, 0, Policy(3, 10), true, 1);
  EXPECT_FALSE(d.restart);
  EXPECT_EQ(d.phase, AgentPhase::kTerminated);
  EXPECT_EQ(d.exit_code, 128 + SIGTERM);
  EXPECT_EQ(d.message, "stopped by SIGTERM");
}

TEST(AttemptDecisionTest, RetryableFailuresRestartNowThenBackOffWhileTheyComeQuickly) {
  const api::RestartPolicy p = Policy(10, 100);
  AttemptDecision first = Decide(FailedWith(137), 0, p, true, 1);
  EXPECT_TRUE(first.restart);
  EXPECT_EQ(first.phase, AgentPhase::kRestarting);
  EXPECT_EQ(first.reason, "UserError");
  EXPECT_EQ(first.backoff, milliseconds(0));
  EXPECT_EQ(first.message, "now");
  AttemptDecision second = Decide(FailedWith(137), 1, p, true, 2);
  EXPECT_EQ(second.backoff, milliseconds(100'000));
  EXPECT_EQ(second.message, "in 100s: 2nd quick failure in a row (attempts under 600s)");
  EXPECT_EQ(Decide(FailedWith(137), 2, p, true, 3).backoff, milliseconds(200'000));
  EXPECT_EQ(Decide(FailedWith(137), 3, p, true, 4).backoff, milliseconds(300'000));
  EXPECT_EQ(Decide(FailedWith(137), 9, p, true, 10).backoff, milliseconds(300'000));
  // The budget counts every restart, quick or not.
  EXPECT_EQ(Decide(FailedWith(137), 10, p, true, 1).reason, "MaxRestartsReached");
  ASSERT_TRUE(first.failure);
  EXPECT_EQ(first.failure->rank, 1);
}

TEST(AttemptDecisionTest, UserErrorsAreNotRetried) {
  AttemptDecision d = Decide(FailedWith(1), 0, Policy(3, 10), true, 1);
  EXPECT_FALSE(d.restart);
  EXPECT_EQ(d.phase, AgentPhase::kFailed);
  EXPECT_EQ(d.reason, "NonRetryableFailure");
  EXPECT_EQ(d.message, "exit code 1 is not retryable");
  EXPECT_EQ(d.exit_code, 1);
  api::RestartPolicy listed = Policy(3, 10);
  listed.retryable_exit_codes = {1};
  EXPECT_TRUE(Decide(FailedWith(1), 0, listed, true, 1).restart) << "the list replaces the default";
}

TEST(AttemptDecisionTest, TheBudgetEndsRestarts) {
  AttemptDecision d = Decide(FailedWith(137), 2, Policy(2, 10), true, 1);
  EXPECT_FALSE(d.restart);
  EXPECT_EQ(d.reason, "MaxRestartsReached");
  EXPECT_EQ(d.message, "maxRestarts (2) reached");
  EXPECT_EQ(d.exit_code, 1) << "the job failed; the rank's 137 stays in the failure";
  EXPECT_EQ(d.failure->status.ShellCode(), 137);
}

TEST(AttemptDecisionTest, ARanksExitTwoIsAFailedJobNotTheAgentsBadInput) {
  AttemptDecision d = Decide(FailedWith(2), 0, Policy(3, 10), true, 1);
  EXPECT_EQ(d.phase, AgentPhase::kFailed);
  EXPECT_EQ(d.exit_code, 1);
  EXPECT_EQ(d.failure->status.ShellCode(), 2);
}

TEST(AttemptDecisionTest, SuccessAndAStopKeepTheirCodes) {
  GangResult ok;
  ok.outcome = GangOutcome::kSucceeded;
  EXPECT_EQ(Decide(ok, 0, Policy(3, 10), true, 1).exit_code, 0);
  GangResult stopped;
  stopped.outcome = GangOutcome::kInterrupted;
  stopped.interrupt_signal = SIGTERM;
  EXPECT_EQ(Decide(stopped, 0, Policy(3, 10), true, 1).exit_code, 143);
}

TEST(AttemptDecisionTest, AGangSpanningNodesIsTheOperatorsToRestart) {
  AttemptDecision d = Decide(FailedWith(137), 0, Policy(3, 10), false, 1);
  EXPECT_FALSE(d.restart);
  EXPECT_EQ(d.reason, "GangSpansNodes");
  EXPECT_THAT(d.message, HasSubstr("the operator restarts it"));
  EXPECT_EQ(d.exit_code, 1);
}

}  // namespace
}  // namespace spawnpoint::agent
