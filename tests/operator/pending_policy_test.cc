// Pods stuck Pending past the timeout.
#include "operator/policy/pending_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/operator/test_pods.h"

namespace spawnpoint::op {
namespace {

using namespace policy_test;  // json, seconds, HasSubstr, kT0, Pod, Terminated

TEST(PendingPolicyTest, NamesTheLongestPendingPodPastTheTimeout) {
  json running = Pod(0, "Running");
  json waiting =
      Pod(1, "Pending",
          {{"containerStatuses",
            json::array(
                {{{"name", "trainer"},
                  {"state",
                   {{"waiting",
                     {{"reason", "ImagePullBackOff"}, {"message", "pull access denied"}}}}}}})}});
  PendingCheck early = CheckPending({&running, &waiting}, seconds(300), kT0 + seconds(100));
  EXPECT_TRUE(early.stuck_pod.empty());
  EXPECT_EQ(early.recheck_after, seconds(200));
  PendingCheck late = CheckPending({&running, &waiting}, seconds(300), kT0 + seconds(301));
  EXPECT_EQ(late.stuck_pod, "job-node-1");
  EXPECT_THAT(late.message, HasSubstr("has been Pending for 5m1s: trainer: ImagePullBackOff: "
                                      "pull access denied"));
}

}  // namespace
}  // namespace spawnpoint::op
