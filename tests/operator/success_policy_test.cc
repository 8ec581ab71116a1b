// Success only when every pod of the attempt succeeded.
#include "operator/policy/success_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/operator/test_pods.h"

namespace spawnpoint::op {
namespace {

using namespace policy_test;  // json, seconds, HasSubstr, kT0, Pod, Terminated

TEST(SuccessPolicyTest, EveryNodeOfTheAttemptMustSucceed) {
  json a = Pod(0, "Succeeded"), b = Pod(1, "Running"), c = Pod(1, "Succeeded");
  EXPECT_FALSE(AttemptSucceeded({&a, &b}, 2));
  EXPECT_FALSE(AttemptSucceeded({&a}, 2));
  EXPECT_TRUE(AttemptSucceeded({&a, &c}, 2));
  c["metadata"]["deletionTimestamp"] = "2024-05-01T10:00:00Z";
  EXPECT_FALSE(AttemptSucceeded({&a, &c}, 2));
}

}  // namespace
}  // namespace spawnpoint::op
