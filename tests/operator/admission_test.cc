// Gang kueue: a job whose pods wait, gated, for Kueue's admission (admission_policy.h) is Queued,
// and its pending timeout does not run while it waits; on a fake cluster and simulated time.
#include "operator/policy/admission_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "operator/common/names.h"
#include "operator/policy/pending_policy.h"
#include "operator/reconciler/reconciler.h"
#include "tests/operator/fake_cluster.h"
#include "tests/operator/test_jobs.h"

namespace spawnpoint::op {
namespace {

using nlohmann::json;
using std::chrono::minutes;
using std::chrono::seconds;
using testing::FakeCluster;
using testing::MakeJob;

json Gated(const std::string& name, std::vector<std::string> gates) {
  json pod = {{"metadata", {{"name", name}, {"creationTimestamp", "2024-05-01T10:00:00Z"}}},
              {"spec", {{"schedulingGates", json::array()}}},
              {"status", {{"phase", "Pending"}}}};
  for (const auto& g : gates) pod["spec"]["schedulingGates"].push_back({{"name", g}});
  return pod;
}

TEST(AdmissionPolicyTest, AGatedWholeGroupWaitsNamingTheQueueAndTheGates) {
  json a = Gated("job-node-0", {"kueue.x-k8s.io/admission", "kueue.x-k8s.io/topology"});
  json b = Gated("job-node-1", {"kueue.x-k8s.io/admission"});
  AdmissionCheck check = CheckAdmission({&a, &b}, 2, "team-a");
  EXPECT_TRUE(check.waiting);
  EXPECT_EQ(check.message,
            "waiting for admission by Kueue in queue team-a: 2 of 2 pods gated "
            "(kueue.x-k8s.io/admission, kueue.x-k8s.io/topology)");
}

TEST(AdmissionPolicyTest, OnlyKueueGatesOfAWholeGroupCount) {
  json gated = Gated("job-node-0", {"kueue.x-k8s.io/admission"});
  json open = Gated("job-node-1", {});
  json other = Gated("job-node-1", {"example.com/wait"});
  EXPECT_FALSE(CheckAdmission({&gated}, 2, "q").waiting) << "Kueue admits whole groups";
  EXPECT_FALSE(CheckAdmission({&gated}, 2, "q").admitted);
  EXPECT_FALSE(CheckAdmission({&open}, 2, "q").admitted);
  EXPECT_TRUE(CheckAdmission({&open, &other}, 2, "q").admitted);
  EXPECT_TRUE(CheckAdmission({&gated, &open}, 2, "q").waiting);
  EXPECT_FALSE(CheckAdmission({&open, &other}, 2, "q").waiting);
  EXPECT_TRUE(KueueGates(other).empty());
}

TEST(AdmissionPolicyTest, AGatedPodIsNotStuckPending) {
  const WallTime now = *ParseTime("2024-05-01T11:00:00Z");  // an hour after creation
  json gated = Gated("job-node-0", {"kueue.x-k8s.io/admission"});
  EXPECT_TRUE(CheckPending({&gated}, minutes(5), now).stuck_pod.empty());
  json open = Gated("job-node-0", {});
  EXPECT_EQ(CheckPending({&open}, minutes(5), now).stuck_pod, "job-node-0");
}

json QueuedCondition(const std::string& status, const std::string& at) {
  return {
      {"conditions",
       {{{"type", "Created"}, {"status", "True"}, {"lastTransitionTime", "2024-05-01T09:00:00Z"}},
        {{"type", "Queued"}, {"status", status}, {"lastTransitionTime", at}}}}};
}

TEST(AdmissionPolicyTest, TheWaitIsFromQueuedTrueToQueuedFalse) {
  const json queued = QueuedCondition("True", "2024-05-01T10:00:00Z");
  const json admitted = QueuedCondition("False", "2024-05-01T10:02:30Z");
  EXPECT_EQ(AdmissionWait(queued, admitted), std::optional<Clock::Duration>(seconds(150)));
  // Only the write that ends a wait: still queued, admitted before, never queued.
  EXPECT_EQ(AdmissionWait(queued, QueuedCondition("True", "2024-05-01T10:00:00Z")), std::nullopt);
  EXPECT_EQ(AdmissionWait(admitted, admitted), std::nullopt);
  EXPECT_EQ(AdmissionWait(json::object(), admitted), std::nullopt);
  EXPECT_EQ(AdmissionWait(nullptr, admitted), std::nullopt);
  EXPECT_EQ(AdmissionWait(queued, json::object()), std::nullopt);
  EXPECT_EQ(AdmissionWait(QueuedCondition("True", "garbage"), admitted), std::nullopt);
}

class AdmissionTest : public ::testing::Test {
 protected:
  AdmissionTest()
      : wall_(&clock_, WallTime(seconds(1'714'557'600))),
        cluster_(&wall_),
        reconciler_(&cluster_, &wall_, ReconcilerOptions{}) {}

  void SetUp() override {
    json job = MakeJob("job", 2, 3, 1);
    job["spec"]["scheduling"] = {{"gang", "kueue"}, {"queue", "team-a"}};
    cluster_.AddJob(job);
  }
  ReconcileResult Reconcile() { return reconciler_.Reconcile("default", "job", Logger()); }
  json Status() { return (*cluster_.Job("job"))["status"]; }
  json Condition(const std::string& type) { return cluster_.JobCondition("job", type); }
  // As Kueue's pod webhook does when the pods are created, and its controller on admission.
  void Gate(bool gated) {
    for (int node = 0; node < 2; ++node) {
      json& spec = (*cluster_.Pod(PodName("job", node)))["spec"];
      spec["schedulingGates"] = json::array();
      if (gated) spec["schedulingGates"].push_back({{"name", "kueue.x-k8s.io/admission"}});
    }
  }
  int EventsWith(const std::string& reason) { return cluster_.EventCount(reason); }

  SimulatedClock clock_;
  WallClock wall_;
  FakeCluster cluster_;
  Reconciler reconciler_;
};

TEST_F(AdmissionTest, GatedPodsAreQueuedAndNeverPendingPastTheTimeout) {
  ASSERT_TRUE(Reconcile().status.ok());
  ASSERT_EQ(cluster_.PodNames().size(), 2u);
  Gate(true);
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Status()["phase"], "Queued");
  EXPECT_EQ(Condition("Queued")["status"], "True");
  EXPECT_EQ(Condition("Queued")["reason"], "WaitingForAdmission");
  EXPECT_EQ(Condition("Queued")["message"],
            "waiting for admission by Kueue in queue team-a: 2 of 2 pods gated "
            "(kueue.x-k8s.io/admission)");
  EXPECT_EQ(EventsWith("Queued"), 1);

  // An hour in the queue, far past the pending timeout (5 min): still Queued, no PodPending.
  for (int i = 0; i < 6; ++i) {
    clock_.Advance(minutes(10));
    ASSERT_TRUE(Reconcile().status.ok());
  }
  EXPECT_EQ(Status()["phase"], "Queued");
  EXPECT_NE(Condition("Running").value("reason", ""), "PodPending") << Status().dump();
  EXPECT_EQ(EventsWith("PodPending"), 0);
  EXPECT_EQ(EventsWith("Queued"), 1) << "once, on the transition";
  EXPECT_EQ(cluster_.PodNames().size(), 2u);
}

TEST_F(AdmissionTest, OnceAdmittedTheJobRunsAsBefore) {
  ASSERT_TRUE(Reconcile().status.ok());
  Gate(true);
  ReconcileResult queued = Reconcile();
  ASSERT_TRUE(queued.status.ok());
  ASSERT_EQ(Status()["phase"], "Queued");
  EXPECT_EQ(queued.admission_wait, std::nullopt);
  clock_.Advance(minutes(1));
  Gate(false);
  ReconcileResult admitted = Reconcile();
  ASSERT_TRUE(admitted.status.ok());
  // The write that admits the gang reports its wait (spawnpoint_job_admission_wait_seconds).
  EXPECT_EQ(admitted.admission_wait, std::optional<Clock::Duration>(minutes(1)));
  EXPECT_EQ(Status()["phase"], "Pending");
  EXPECT_EQ(Condition("Queued")["status"], "False");
  EXPECT_EQ(Condition("Queued")["reason"], "Admitted");
  EXPECT_EQ(EventsWith("Admitted"), 1);
  for (int node = 0; node < 2; ++node) cluster_.SetPodPhase(PodName("job", node), "Running");
  ReconcileResult running = Reconcile();
  ASSERT_TRUE(running.status.ok());
  EXPECT_EQ(running.admission_wait, std::nullopt) << "counted once";
  EXPECT_EQ(Status()["phase"], "Running");
  EXPECT_EQ(Condition("Running")["status"], "True");
  EXPECT_EQ(EventsWith("Admitted"), 1);
}

// The informer's cache may not show a pod yet (its create answered AlreadyExists): a group not
// whole in the view is not thereby admitted.
TEST_F(AdmissionTest, AQueuedGroupMissingAPodInTheViewStaysQueued) {
  ASSERT_TRUE(Reconcile().status.ok());
  Gate(true);
  ASSERT_TRUE(Reconcile().status.ok());
  ASSERT_EQ(Status()["phase"], "Queued");
  cluster_.RemovePod("job-node-1");
  cluster_.FailNext("create-pod", spawnpoint::Status(StatusCode::kAlreadyExists, "exists"));
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Status()["phase"], "Queued");
  EXPECT_EQ(Condition("Queued")["status"], "True");
  EXPECT_EQ(EventsWith("Admitted"), 0);
}

TEST_F(AdmissionTest, WithoutKueueAGatedPodIsNotQueued) {
  json job = MakeJob("plain", 1, 3, 1);
  cluster_.AddJob(job);
  ASSERT_TRUE(reconciler_.Reconcile("default", "plain", Logger()).status.ok());
  (*cluster_.Pod(PodName("plain", 0)))["spec"]["schedulingGates"] =
      json::array({{{"name", "kueue.x-k8s.io/admission"}}});
  ASSERT_TRUE(reconciler_.Reconcile("default", "plain", Logger()).status.ok());
  EXPECT_EQ((*cluster_.Job("plain"))["status"]["phase"], "Pending");
}

}  // namespace
}  // namespace spawnpoint::op
