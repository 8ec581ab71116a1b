// activeDeadlineSeconds, counted from startTime.
#include "operator/policy/deadline_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/operator/test_pods.h"

namespace spawnpoint::op {
namespace {

using namespace policy_test;  // json, seconds, HasSubstr, kT0, Pod, Terminated

TEST(DeadlinePolicyTest, CountsFromStartTime) {
  api::RunPolicy p;
  EXPECT_FALSE(CheckDeadline(p, kT0, kT0 + seconds(1'000'000)).exceeded);
  p.active_deadline_seconds = 60;
  DeadlineCheck early = CheckDeadline(p, kT0, kT0 + seconds(20));
  EXPECT_FALSE(early.exceeded);
  EXPECT_EQ(early.remaining, seconds(40));
  DeadlineCheck late = CheckDeadline(p, kT0, kT0 + seconds(60));
  EXPECT_TRUE(late.exceeded);
  EXPECT_THAT(late.message, HasSubstr("activeDeadlineSeconds (60s)"));
  EXPECT_FALSE(CheckDeadline(p, std::nullopt, kT0).exceeded) << "not started: no clock yet";
}

}  // namespace
}  // namespace spawnpoint::op
