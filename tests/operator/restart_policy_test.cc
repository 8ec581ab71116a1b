// Restart decisions and the doubling backoff.
#include "operator/policy/restart_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/operator/test_pods.h"

namespace spawnpoint::op {
namespace {

using namespace policy_test;  // json, seconds, HasSubstr, kT0, Pod, Terminated

TEST(RestartPolicyTest, BackoffDoublesAndIsCapped) {
  api::RestartPolicy p;
  p.backoff_seconds = 10;
  EXPECT_EQ(RestartBackoff(p, 0), Clock::Duration::zero());
  EXPECT_EQ(RestartBackoff(p, 1), seconds(10));
  EXPECT_EQ(RestartBackoff(p, 2), seconds(20));
  EXPECT_EQ(RestartBackoff(p, 3), seconds(40));
  EXPECT_EQ(RestartBackoff(p, 6), seconds(300));
  EXPECT_EQ(RestartBackoff(p, 1000), seconds(300));
  p.backoff_seconds = 0;
  EXPECT_EQ(RestartBackoff(p, 3), Clock::Duration::zero());
}

TEST(RestartPolicyTest, DecisionsNeverExceedMaxRestarts) {
  api::RestartPolicy p;
  p.max_restarts = 2;
  p.backoff_seconds = 5;
  PodFailure kill{
      .node = 0, .pod = "x-node-0", .exit_code = 137, .reason = "OOMKilled", .retryable = true};
  RestartDecision first = DecideRestart(kill, p, 0);
  EXPECT_TRUE(first.restart);
  EXPECT_EQ(first.reason, "OOMKilled");
  EXPECT_THAT(first.message, HasSubstr("restart 1 of 2 after 5s"));
  EXPECT_TRUE(DecideRestart(kill, p, 1).restart);
  RestartDecision exhausted = DecideRestart(kill, p, 2);
  EXPECT_FALSE(exhausted.restart);
  EXPECT_EQ(exhausted.reason, "MaxRestartsReached");
  PodFailure user{.node = 0, .pod = "x-node-0", .exit_code = 1, .retryable = false};
  RestartDecision fail = DecideRestart(user, p, 0);
  EXPECT_FALSE(fail.restart);
  EXPECT_EQ(fail.reason, "NonRetryableFailure");
}

TEST(RestartPolicyTest, WaitIsMeasuredFromTheFailure) {
  api::RestartPolicy p;
  p.backoff_seconds = 10;
  EXPECT_EQ(RestartWaitRemaining(p, 2, kT0, kT0 + seconds(5)), seconds(15));
  EXPECT_EQ(RestartWaitRemaining(p, 2, kT0, kT0 + seconds(25)), Clock::Duration::zero());
  EXPECT_EQ(RestartWaitRemaining(p, 2, std::nullopt, kT0), Clock::Duration::zero());
}

}  // namespace
}  // namespace spawnpoint::op
