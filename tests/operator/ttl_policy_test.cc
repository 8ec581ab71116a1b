// ttlSecondsAfterFinished, counted from completionTime.
#include "operator/policy/ttl_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/operator/test_pods.h"

namespace spawnpoint::op {
namespace {

using namespace policy_test;  // json, seconds, HasSubstr, kT0, Pod, Terminated

TEST(TtlPolicyTest, CountsFromCompletion) {
  api::RunPolicy p;
  EXPECT_FALSE(CheckTtl(p, kT0, kT0 + seconds(100)).expired);
  p.ttl_seconds_after_finished = 0;
  EXPECT_TRUE(CheckTtl(p, kT0, kT0).expired);
  p.ttl_seconds_after_finished = 30;
  EXPECT_EQ(CheckTtl(p, kT0, kT0 + seconds(10)).remaining, seconds(20));
  EXPECT_TRUE(CheckTtl(p, kT0, kT0 + seconds(30)).expired);
  EXPECT_FALSE(CheckTtl(p, std::nullopt, kT0).expired);
}

}  // namespace
}  // namespace spawnpoint::op
