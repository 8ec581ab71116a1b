// Which pods go when the job finishes.
#include "operator/policy/clean_pod_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/operator/test_pods.h"

namespace spawnpoint::op {
namespace {

using namespace policy_test;  // json, seconds, HasSubstr, kT0, Pod, Terminated

TEST(CleanPodPolicyTest, WhichPodsGoWhenTheJobFinishes) {
  json running = Pod(0, "Running"), pending = Pod(1, "Pending"), done = Pod(2, "Succeeded"),
       failed = Pod(3, "Failed");
  using api::CleanPodPolicy;
  for (const json* p : {&running, &pending, &done, &failed}) {
    EXPECT_FALSE(DeletePodWhenFinished(CleanPodPolicy::kNone, *p));
    EXPECT_TRUE(DeletePodWhenFinished(CleanPodPolicy::kAll, *p));
  }
  EXPECT_TRUE(DeletePodWhenFinished(CleanPodPolicy::kRunning, running));
  EXPECT_TRUE(DeletePodWhenFinished(CleanPodPolicy::kRunning, pending));
  EXPECT_FALSE(DeletePodWhenFinished(CleanPodPolicy::kRunning, done));
  EXPECT_FALSE(DeletePodWhenFinished(CleanPodPolicy::kRunning, failed));
  EXPECT_FALSE(DeleteServiceWhenFinished(CleanPodPolicy::kNone));
  EXPECT_TRUE(DeleteServiceWhenFinished(CleanPodPolicy::kRunning));
}

}  // namespace
}  // namespace spawnpoint::op
