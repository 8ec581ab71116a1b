// A ResourceQuota's refusal (quota_policy.h): the job is Pending with the condition
// QuotaExceeded and an event, never half created, never a restart; it is created once the quota
// holds it. On a fake cluster with a GPU quota and simulated time.
#include "operator/policy/quota_policy.h"

#include <algorithm>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "operator/common/names.h"
#include "operator/common/object.h"
#include "operator/reconciler/reconciler.h"
#include "tests/operator/fake_cluster.h"
#include "tests/operator/test_jobs.h"

namespace spawnpoint::op {
namespace {

using nlohmann::json;
using std::chrono::seconds;
using testing::FakeCluster;
using ::testing::HasSubstr;
using testing::MakeJob;

// The first retry of a refused create (quota_policy.h's default).
const Clock::Duration kFirstRetry = QuotaRetry{}.first;

// A refusal that lasts is looked at less often: a quarter of how long it has lasted, from 5 s
// to 60 s (a ResourceQuota change wakes the job at once, controller.cc).
TEST(QuotaPolicyTest, RetriesBackOffFromTheFirstToTheMost) {
  const QuotaRetry retry;
  EXPECT_EQ(QuotaRetryDelay(seconds(0), retry), seconds(5));
  EXPECT_EQ(QuotaRetryDelay(seconds(20), retry), seconds(5));
  EXPECT_EQ(QuotaRetryDelay(seconds(40), retry), seconds(10));
  EXPECT_EQ(QuotaRetryDelay(std::chrono::minutes(4), retry), seconds(60));
  EXPECT_EQ(QuotaRetryDelay(std::chrono::hours(5), retry), seconds(60));
  EXPECT_EQ(QuotaRetryDelay(seconds(40), QuotaRetry{seconds(30), std::chrono::minutes(10)}),
            seconds(30));
}

TEST(QuotaPolicyTest, OnlyAQuotaRefusalIsOne) {
  EXPECT_TRUE(IsQuotaDenial(Status(StatusCode::kForbidden,
                                   "pods \"j-node-1\" is forbidden: exceeded quota: gpu-quota, "
                                   "requested: requests.nvidia.com/gpu=3")));
  EXPECT_FALSE(IsQuotaDenial(Status(StatusCode::kForbidden, "pods is forbidden: User cannot")));
  EXPECT_FALSE(IsQuotaDenial(Status(StatusCode::kUnavailable, "exceeded quota")));
}

TEST(QuotaPolicyTest, TheProbeAsksForTheWholeGang) {
  json pod = {{"metadata",
               {{"name", "j-node-0"},
                {"namespace", "team-a"},
                {"labels", {{"kueue.x-k8s.io/queue-name", "q"}}}}},
              {"spec",
               {{"priorityClassName", "high"},
                {"containers",
                 {{{"name", "trainer"},
                   {"image", "img"},
                   {"resources",
                    {{"limits", {{"nvidia.com/gpu", "3"}}},
                     {"requests", {{"cpu", "1500m"}, {"memory", "1Gi"}}}}}}}}}}};
  json probe = QuotaProbe(pod, 4, "j-quota-check");
  EXPECT_EQ(probe["metadata"], json({{"name", "j-quota-check"}, {"namespace", "team-a"}}));
  EXPECT_EQ(probe["spec"]["priorityClassName"], "high");
  ASSERT_EQ(probe["spec"]["containers"].size(), 1u);
  const json& resources = probe["spec"]["containers"][0]["resources"];
  EXPECT_EQ(resources["requests"],
            json({{"cpu", "6"}, {"memory", "4294967296"}, {"nvidia.com/gpu", "12"}}));
  EXPECT_EQ(resources["limits"], resources["requests"]);
}

class QuotaTest : public ::testing::Test {
 protected:
  QuotaTest()
      : wall_(&clock_, WallTime(seconds(1'714'557'600))),
        cluster_(&wall_),
        reconciler_(&cluster_, &wall_, ReconcilerOptions{}) {}
  void SetUp() override {
    json job = MakeJob("job", 2, 3, 1, "InPlace");
    job["spec"]["gpusPerNode"] = 2;  // 4 GPUs in all
    cluster_.AddJob(job);
  }
  ReconcileResult Reconcile() { return reconciler_.Reconcile("default", "job", Logger()); }
  json Status() { return (*cluster_.Job("job"))["status"]; }
  json Condition(const std::string& type) { return cluster_.JobCondition("job", type); }
  int EventsWith(const std::string& reason) { return cluster_.EventCount(reason); }

  SimulatedClock clock_;
  WallClock wall_;
  FakeCluster cluster_;
  Reconciler reconciler_;
};

TEST_F(QuotaTest, AGangTheQuotaCannotHoldIsNeverHalfMadeAndWaitsPending) {
  cluster_.SetGpuQuota(3);  // one pod of 2 GPUs would fit, the gang of 4 does not
  ReconcileResult r = Reconcile();
  ASSERT_TRUE(r.status.ok()) << "not an error to retry fast: a state";
  EXPECT_TRUE(cluster_.PodNames().empty()) << "never half a gang";
  EXPECT_EQ(Status()["phase"], "Pending");
  EXPECT_EQ(Condition("QuotaExceeded")["status"], "True");
  EXPECT_EQ(Condition("QuotaExceeded")["reason"], "ExceededQuota");
  EXPECT_THAT(Condition("QuotaExceeded")["message"].get<std::string>(),
              HasSubstr("exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=4"));
  EXPECT_NE(Condition("Created").value("status", ""), "True");
  EXPECT_EQ(EventsWith("QuotaExceeded"), 1);
  ASSERT_TRUE(r.requeue_after);
  EXPECT_LE(*r.requeue_after, kFirstRetry);
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(kFirstRetry);
    ASSERT_TRUE(Reconcile().status.ok());
  }
  EXPECT_TRUE(cluster_.PodNames().empty());
  EXPECT_EQ(EventsWith("QuotaExceeded"), 1) << "once, on the transition";
  EXPECT_EQ(Status()["restarts"], 0);

  cluster_.SetGpuQuota(4);  // raised
  clock_.Advance(kFirstRetry);
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(cluster_.PodNames().size(), 2u);
  EXPECT_EQ(Condition("QuotaExceeded")["status"], "False");
  EXPECT_EQ(Condition("Created")["status"], "True");
  EXPECT_EQ(EventsWith("QuotaAvailable"), 1);
  for (int node = 0; node < 2; ++node) cluster_.SetPodPhase(PodName("job", node), "Running");
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Status()["phase"], "Running");
  EXPECT_EQ(Status()["restarts"], 0);
}

// No pod exists, yet the job waits: past the operator's pending timeout (5 min) it is reported
// as a Pending job is, with the quota's words.
// The reconciler asks again sooner at first and less often as the refusal lasts, and says so.
TEST_F(QuotaTest, ALastingRefusalIsLookedAtLessOften) {
  cluster_.SetGpuQuota(3);
  ReconcilerOptions options;
  options.pending_timeout = std::chrono::hours(1);  // its own requeue stays out of the way
  Reconciler reconciler(&cluster_, &wall_, options);
  auto reconcile = [&] { return reconciler.Reconcile("default", "job", Logger()); };
  ReconcileResult r = reconcile();
  ASSERT_TRUE(r.status.ok());
  ASSERT_TRUE(r.requeue_after);
  EXPECT_EQ(*r.requeue_after, seconds(5));
  EXPECT_THAT(Condition("QuotaExceeded")["message"].get<std::string>(),
              HasSubstr("tried again when a ResourceQuota there changes, and at least every 1m0s; "
                        "no restart counted"));
  Clock::Duration waited{0};
  std::vector<Clock::Duration> delays;
  while (waited < std::chrono::minutes(10)) {
    clock_.Advance(*r.requeue_after);
    waited += *r.requeue_after;
    r = reconcile();
    ASSERT_TRUE(r.status.ok());
    ASSERT_TRUE(r.requeue_after);
    delays.push_back(*r.requeue_after);
  }
  EXPECT_TRUE(std::is_sorted(delays.begin(), delays.end()));
  EXPECT_EQ(delays.back(), seconds(60));
  EXPECT_LT(delays.size(), 30u) << "not every 5 s for ten minutes (120 reads)";
  EXPECT_EQ(EventsWith("QuotaExceeded"), 1);
  EXPECT_TRUE(cluster_.PodNames().empty());
}

TEST_F(QuotaTest, AJobTheQuotaKeepsWithoutPodsCountsTowardItsPendingTimeout) {
  cluster_.SetGpuQuota(3);
  ReconcileResult r = Reconcile();
  ASSERT_TRUE(r.status.ok());
  EXPECT_NE(Condition("Running").value("reason", ""), "PodPending");
  clock_.Advance(std::chrono::minutes(4));
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_NE(Condition("Running").value("reason", ""), "PodPending") << "not yet";
  clock_.Advance(std::chrono::minutes(2));
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Condition("Running")["reason"], "PodPending");
  EXPECT_THAT(Condition("Running")["message"].get<std::string>(),
              HasSubstr("no pod of attempt 0 could be created for 6m"));
  EXPECT_THAT(Condition("Running")["message"].get<std::string>(), HasSubstr("exceeded quota"));
  EXPECT_EQ(EventsWith("PodPending"), 1);
  EXPECT_TRUE(cluster_.PodNames().empty());
}

// The dry run cannot see everything (a pod-count quota, a race with another job): a create
// refused after others were made is the same state, and the gang is not called created.
TEST_F(QuotaTest, ARefusedCreateIsTheSameStateAndNotCalledCreated) {
  cluster_.SetGpuQuota(2);
  cluster_.FailNext("check-pod", spawnpoint::Status::Ok());  // the probe passes, wrongly
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(cluster_.PodNames(), std::vector<std::string>{"job-node-0"});
  EXPECT_EQ(Condition("QuotaExceeded")["status"], "True");
  EXPECT_EQ(Condition("Created")["status"], "False");
  EXPECT_EQ(Condition("Created")["reason"], "QuotaExceeded");
  cluster_.SetGpuQuota(4);
  clock_.Advance(kFirstRetry);
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(cluster_.PodNames().size(), 2u);
  EXPECT_EQ(Condition("Created")["status"], "True");
  EXPECT_EQ(Condition("QuotaExceeded")["status"], "False");
}

TEST_F(QuotaTest, WithoutAQuotaNothingChanges) {
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(cluster_.PodNames().size(), 2u);
  EXPECT_TRUE(Condition("QuotaExceeded").empty());
  EXPECT_EQ(EventsWith("QuotaExceeded"), 0);
}

}  // namespace
}  // namespace spawnpoint::op
