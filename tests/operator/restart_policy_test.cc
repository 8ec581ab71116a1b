// Restart decisions and the doubling backoff.
#include "operator/policy/restart_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/operator/test_pods.h"

namespace spawnpoint::op {
namespace {

using namespace policy_test;  // json, seconds, HasSubstr, kT0, Pod, Terminated

TEST(RestartPolicyTest, NoWaitAfterAHealthyRunThenTheWaitDoublesAndIsCapped) {
  api::RestartPolicy p;
  p.backoff_seconds = 10;
  EXPECT_EQ(RestartBackoff(p, 0), Clock::Duration::zero());
  EXPECT_EQ(RestartBackoff(p, 1), Clock::Duration::zero());
  EXPECT_EQ(RestartBackoff(p, 2), seconds(10));
  EXPECT_EQ(RestartBackoff(p, 3), seconds(20));
  EXPECT_EQ(RestartBackoff(p, 7), seconds(300));
  EXPECT_EQ(RestartBackoff(p, 1000), seconds(300));
  p.backoff_seconds = 0;
  EXPECT_EQ(RestartBackoff(p, 3), Clock::Duration::zero());
}

TEST(RestartPolicyTest, AnAttemptRanFromItsFirstPodsCreation) {
  json a = Pod(0, "Failed"), b = Pod(1, "Failed");
  a["metadata"]["creationTimestamp"] = "2026-01-01T00:00:10Z";
  b["metadata"]["creationTimestamp"] = "2026-01-01T00:00:05Z";
  const WallTime now = *ParseTime("2026-01-01T00:10:05Z");
  EXPECT_EQ(AttemptRan({&a, &b}, now), seconds(600));
  json bare = Pod(2, "Failed");
  bare["metadata"].erase("creationTimestamp");
  EXPECT_EQ(AttemptRan({&bare}, now), Clock::Duration::zero());
}

TEST(RestartPolicyTest, DecisionsNeverExceedMaxRestarts) {
  api::RestartPolicy p;
  p.max_restarts = 2;
  p.backoff_seconds = 5;
  PodFailure kill{
      .node = 0, .pod = "x-node-0", .exit_code = 137, .reason = "OOMKilled", .retryable = true};
  RestartDecision first = DecideRestart(kill, p, 0, 1);
  EXPECT_TRUE(first.restart);
  EXPECT_EQ(first.reason, "OOMKilled");
  EXPECT_THAT(first.message, HasSubstr("restart 1 of 2 now"));
  RestartDecision second = DecideRestart(kill, p, 1, 2);
  EXPECT_TRUE(second.restart);
  EXPECT_THAT(second.message,
              HasSubstr("restart 2 of 2 in 5s: 2nd quick failure in a row (attempts under 600s)"));
  RestartDecision exhausted = DecideRestart(kill, p, 2, 1);
  EXPECT_FALSE(exhausted.restart);
  EXPECT_EQ(exhausted.reason, "MaxRestartsReached");
  PodFailure user{.node = 0, .pod = "x-node-0", .exit_code = 1, .retryable = false};
  RestartDecision fail = DecideRestart(user, p, 0, 1);
  EXPECT_FALSE(fail.restart);
  EXPECT_EQ(fail.reason, "NonRetryableFailure");
}

TEST(RestartPolicyTest, WaitIsMeasuredFromTheFailure) {
  api::RestartPolicy p;
  p.backoff_seconds = 10;
  EXPECT_EQ(RestartWaitRemaining(p, 3, kT0, kT0 + seconds(5)), seconds(15));
  EXPECT_EQ(RestartWaitRemaining(p, 3, kT0, kT0 + seconds(25)), Clock::Duration::zero());
  EXPECT_EQ(RestartWaitRemaining(p, 1, kT0, kT0), Clock::Duration::zero());
  EXPECT_EQ(RestartWaitRemaining(p, 3, std::nullopt, kT0), Clock::Duration::zero());
}

}  // namespace
}  // namespace spawnpoint::op
