// Suspend and resume transitions.
#include "operator/policy/suspend_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/operator/test_pods.h"

namespace spawnpoint::op {
namespace {

using namespace policy_test;  // json, seconds, HasSubstr, kT0, Pod, Terminated

TEST(SuspendPolicyTest, Transitions) {
  api::RunPolicy p;
  EXPECT_EQ(DecideSuspend(p, false), SuspendTransition::kNone);
  EXPECT_EQ(DecideSuspend(p, true), SuspendTransition::kResume);
  p.suspend = true;
  EXPECT_EQ(DecideSuspend(p, false), SuspendTransition::kSuspend);
  EXPECT_EQ(DecideSuspend(p, true), SuspendTransition::kSuspend);
}

}  // namespace
}  // namespace spawnpoint::op
