// Gang kueue beyond admission (kueue_pods.h, gang_scheduling.cc): a replacement pod never
// takes a name Kueue still holds and waits until Kueue no longer counts its predecessor as
// active; a gang Kueue evicts is recreated without spending a restart and shows why; a Queued
// job quotes Kueue's reason from its Workload; a failed job ends its Kueue group so the quota is
// freed. On a fake cluster whose deletions stay pending, as Kueue's finalizer keeps them, and
// simulated time.
#include "operator/policy/kueue_pods.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "operator/common/names.h"
#include "operator/common/object.h"
#include "operator/reconciler/pod_group.h"
#include "operator/reconciler/reconciler.h"
#include "tests/operator/fake_cluster.h"
#include "tests/operator/test_jobs.h"

namespace spawnpoint::op {
namespace {

using nlohmann::json;
using std::chrono::seconds;
using ::testing::Contains;
using testing::FakeCluster;
using ::testing::HasSubstr;
using testing::MakeJob;
using ::testing::Not;

json PodWith(const std::string& phase, bool bound, bool deleting) {
  json pod = {
      {"metadata", {{"name", "p"}}}, {"spec", json::object()}, {"status", {{"phase", phase}}}};
  if (bound) pod["spec"]["nodeName"] = "node-a";
  if (deleting) pod["metadata"]["deletionTimestamp"] = "2024-05-01T10:00:00Z";
  return pod;
}

TEST(KueuePodsTest, ActiveAsKueueCountsIt) {
  EXPECT_TRUE(KueueCountsActive(PodWith("Running", true, false)));
  EXPECT_TRUE(KueueCountsActive(PodWith("Pending", false, false)));  // gated, not yet bound
  // Being deleted but still running on its node: Kueue still counts it (kueue#15424).
  EXPECT_TRUE(KueueCountsActive(PodWith("Running", true, true)));
  EXPECT_TRUE(KueueCountsActive(PodWith("Succeeded", true, true)));
  EXPECT_FALSE(KueueCountsActive(PodWith("Failed", true, true)));
  EXPECT_FALSE(KueueCountsActive(PodWith("Failed", true, false)));
  EXPECT_FALSE(KueueCountsActive(PodWith("Pending", false, true)));  // deleted before binding
}

TEST(KueuePodsTest, AReplacementNeverTakesANameStillThere) {
  auto named = [](std::vector<std::string> names) {
    std::vector<json> pods;
    for (const auto& n : names) pods.push_back({{"metadata", {{"name", n}}}});
    return pods;
  };
  EXPECT_EQ(KueuePodName("job", 0, named({})), "job-node-0");
  EXPECT_EQ(KueuePodName("job", 1, named({"job-node-0"})), "job-node-1");
  EXPECT_EQ(KueuePodName("job", 0, named({"job-node-0"})), "job-node-0-1");
  EXPECT_EQ(KueuePodName("job", 0, named({"job-node-0", "job-node-0-1"})), "job-node-0-2");
  // Once Kueue let go of the first, its name is free again (never two pods of one name).
  EXPECT_EQ(KueuePodName("job", 0, named({"job-node-0-1"})), "job-node-0");
}

TEST(KueuePodsTest, TheStopAsKueueWroteIt) {
  json pod = PodWith("Running", true, true);
  EXPECT_FALSE(KueueStopped(pod));
  pod["status"]["conditions"] = {{{"type", "DisruptionTarget"}, {"status", "True"}}};
  EXPECT_FALSE(KueueStopped(pod)) << "the kubelet's, not Kueue's";
  pod["status"]["conditions"].push_back(
      {{"type", "TerminationTarget"},
       {"status", "True"},
       {"reason", "WorkloadEvictedDueToPreempted"},
       {"message", "Preempted to accommodate a workload (UID: u1) due to prioritization"},
       {"lastTransitionTime", "2024-05-01T10:05:00Z"}});
  std::optional<KueueStop> stop = KueueStopped(pod);
  ASSERT_TRUE(stop);
  EXPECT_EQ(stop->reason, "Preempted");
  EXPECT_EQ(stop->message, "Preempted to accommodate a workload (UID: u1) due to prioritization");
  EXPECT_EQ(stop->at, "2024-05-01T10:05:00Z");
  pod["status"]["conditions"][1]["reason"] = "WorkloadDeleted";
  EXPECT_EQ(KueueStopped(pod)->reason, "WorkloadDeleted");
  pod["status"]["conditions"][1]["status"] = "False";
  EXPECT_FALSE(KueueStopped(pod));
}

TEST(KueuePodsTest, TheWorkloadsReasonForWaiting) {
  json workload = {{"status",
                    {{"conditions",
                      {{{"type", "QuotaReserved"},
                        {"status", "False"},
                        {"reason", "Pending"},
                        {"message",
                         "couldn't assign flavors to pod set main: insufficient "
                         "unused quota for nvidia.com/gpu in flavor gpu-flavor, 2 "
                         "more needed"}}}}}}};
  EXPECT_EQ(KueueWaitingReason(workload),
            "couldn't assign flavors to pod set main: insufficient unused quota for "
            "nvidia.com/gpu in flavor gpu-flavor, 2 more needed");
  workload["status"]["conditions"][0]["status"] = "True";
  EXPECT_EQ(KueueWaitingReason(workload), "");
  EXPECT_EQ(KueueWaitingReason(json::object()), "");
  EXPECT_FALSE(KueueWorkloadFinished(workload));
  workload["status"]["conditions"].push_back({{"type", "Finished"}, {"status", "True"}});
  EXPECT_TRUE(KueueWorkloadFinished(workload));
}

// A 2-node job in LocalQueue team-a. Kueue is played by the test: Managed() adds its finalizer
// and binds the pods; deletions stay pending (the finalizer) until the test finishes them.
class KueueReconcileTest : public ::testing::Test {
 protected:
  KueueReconcileTest()
      : wall_(&clock_, WallTime(seconds(1'714'557'600))),
        cluster_(&wall_),
        reconciler_(&cluster_, &wall_, ReconcilerOptions{}) {}

  void AddJob(const std::string& mode, int max_restarts = 3) {
    json job = MakeJob("job", 2, max_restarts, 1, mode);
    job["spec"]["scheduling"] = {{"gang", "kueue"}, {"queue", "team-a"}};
    cluster_.AddJob(job);
    cluster_.SetGracefulDeletion(true);
  }
  ReconcileResult Reconcile() { return reconciler_.Reconcile("default", "job", Logger()); }
  // A job of `mode` admitted and running on its 2 pods.
  void StartRunning(const std::string& mode, int max_restarts = 3) {
    AddJob(mode, max_restarts);
    ASSERT_TRUE(Reconcile().status.ok());
    Managed("job-node-0");
    Managed("job-node-1");
    ASSERT_TRUE(Reconcile().status.ok());
    ASSERT_EQ(Status()["phase"], "Running");
  }
  json Status() { return (*cluster_.Job("job"))["status"]; }
  json Condition(const std::string& type) { return cluster_.JobCondition("job", type); }
  std::string Group() { return GangGroupName("job", UidOf(*cluster_.Job("job"))); }
  // Kueue's webhook and admission, and the scheduler's binding, of pod `name`.
  void Managed(const std::string& name, const std::string& phase = "Running") {
    json& pod = *cluster_.Pod(name);
    pod["metadata"]["finalizers"] = json::array({kKueueFinalizer});
    pod["metadata"]["labels"]["kueue.x-k8s.io/managed"] = "true";
    pod["spec"]["nodeName"] = "node-" + name;
    cluster_.SetPodPhase(name, phase);
  }
  // Kueue's Stop(): TerminationTarget on every pod, then their deletion.
  void Evict(const std::vector<std::string>& names, const std::string& at) {
    for (const auto& name : names) {
      json& pod = *cluster_.Pod(name);
      pod["status"]["conditions"] =
          json::array({{{"type", "TerminationTarget"},
                        {"status", "True"},
                        {"reason", "WorkloadEvictedDueToPreempted"},
                        {"message",
                         "Preempted to accommodate a workload (UID: u9, JobUID: j9) due to "
                         "prioritization in the ClusterQueue"},
                        {"lastTransitionTime", at}}});
      pod["metadata"]["deletionTimestamp"] = at;
    }
  }
  int EventsWith(const std::string& reason) { return cluster_.EventCount(reason); }
  std::vector<std::string> Creates() {
    std::vector<std::string> out;
    for (const auto& w : cluster_.Writes()) {
      if (w.rfind("create-pod ", 0) == 0) out.push_back(w.substr(11));
    }
    return out;
  }

  SimulatedClock clock_;
  WallClock wall_;
  FakeCluster cluster_;
  Reconciler reconciler_;
};

// kueue#15424 and the deadlock it hides: the failed pod keeps Kueue's finalizer until a
// replacement exists, so the replacement needs a name of its own; and a replacement made while
// Kueue still counts its predecessor active is deleted as excess, so it waits for that.
TEST_F(KueueReconcileTest, ARestartMakesNewNamesOnceKueueLetsGoOfTheOldPods) {
  StartRunning("Recreate");

  cluster_.FailPod("job-node-0", 137, "OOMKilled");
  ASSERT_TRUE(Reconcile().status.ok());  // records the restart
  ASSERT_EQ(Status()["restarts"], 1);
  cluster_.ClearWrites();
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(seconds(5));  // past the backoff
    ASSERT_TRUE(Reconcile().status.ok());
  }
  // Node 0's pod failed and is held (deleting, Failed): replaced under a new name. Node 1's
  // still runs while it stops: Kueue counts it, so no replacement yet.
  EXPECT_THAT(Creates(), ::testing::ElementsAre("job-node-0-1"));
  ASSERT_NE(cluster_.Pod("job-node-0"), nullptr) << "Kueue's finalizer keeps it";
  const json& replacement = *cluster_.Pod("job-node-0-1");
  EXPECT_EQ(replacement["spec"]["hostname"], "job-node-0") << "the gang's DNS names stay";
  EXPECT_EQ(replacement["metadata"]["labels"][kAttemptLabel], "1");
  EXPECT_EQ(replacement["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"], Group());

  cluster_.FailPod("job-node-1", 143, "Error");  // its agent stopped
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_THAT(Creates(), ::testing::ElementsAre("job-node-0-1"))
      << "ended only now: Kueue may still count it";
  clock_.Advance(kKueueSettle);
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_THAT(Creates(), ::testing::ElementsAre("job-node-0-1", "job-node-1-1"));
  // Kueue lets go of the old ones once their replacements exist; nothing more is made.
  cluster_.FinishDeletions();
  Managed("job-node-0-1");
  Managed("job-node-1-1");
  ASSERT_TRUE(Reconcile().status.ok());
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Status()["phase"], "Running");
  EXPECT_EQ(Creates().size(), 2u);
  EXPECT_EQ(cluster_.PodNames().size(), 2u);
}

TEST_F(KueueReconcileTest, ALostPodInPlaceComesBackUnderANewName) {
  StartRunning("InPlace");
  cluster_.ClearWrites();
  cluster_.FailPod("job-node-1", 137, "Error");  // killed: lost, recreated alone
  ASSERT_TRUE(Reconcile().status.ok());
  clock_.Advance(kKueueSettle);
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_THAT(Creates(), ::testing::ElementsAre("job-node-1-1"));
  EXPECT_EQ(Status()["lastFailure"]["pod"], "job-node-1");
  EXPECT_EQ(Status()["lastFailure"]["lost"], true);
}

TEST_F(KueueReconcileTest, AnEvictedGangIsRecreatedQueuedWithoutSpendingARestart) {
  StartRunning("InPlace");
  cluster_.ClearWrites();

  Evict({"job-node-0", "job-node-1"}, "2024-05-01T10:05:00Z");
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Status()["phase"], "Queued");
  EXPECT_EQ(Status()["restarts"], 0);
  EXPECT_EQ(Status()["evictions"], 1);
  EXPECT_EQ(Status()["lastEviction"]["reason"], "Preempted");
  EXPECT_FALSE(Status().contains("lastFailure")) << "an eviction is not a failure";
  EXPECT_EQ(Condition("Queued")["status"], "True");
  EXPECT_EQ(Condition("Queued")["reason"], "Preempted");
  EXPECT_THAT(Condition("Queued")["message"].get<std::string>(),
              HasSubstr("Preempted to accommodate a workload"));
  EXPECT_EQ(EventsWith("Preempted"), 1);
  EXPECT_EQ(EventsWith("NodeFailed"), 0);
  EXPECT_TRUE(Creates().empty()) << "the evicted pods still run: Kueue counts them";

  // They stop (Failed, still held): the gang is recreated under new names, gated by Kueue.
  cluster_.SetPodWebhook([](json& pod) {  // Kueue's: the new pods wait, gated
    pod["spec"]["schedulingGates"] = json::array({{{"name", "kueue.x-k8s.io/admission"}}});
  });
  cluster_.SetPodPhase("job-node-0", "Failed");
  cluster_.SetPodPhase("job-node-1", "Failed");
  cluster_.SetKueueWorkload(
      Group(), {{"status",
                 {{"conditions",
                   {{{"type", "QuotaReserved"},
                     {"status", "False"},
                     {"reason", "Pending"},
                     {"message",
                      "couldn't assign flavors to pod set main: insufficient unused "
                      "quota for nvidia.com/gpu in flavor gpu-flavor, 2 more needed"}}}}}}});
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_THAT(Creates(), ::testing::ElementsAre("job-node-0-1", "job-node-1-1"));
  EXPECT_EQ(Condition("Queued")["reason"], "Preempted");
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(seconds(30));
    ASSERT_TRUE(Reconcile().status.ok());
  }
  EXPECT_EQ(Status()["phase"], "Queued");
  EXPECT_EQ(Condition("Queued")["reason"], "Preempted");
  const std::string message = Condition("Queued")["message"];
  EXPECT_THAT(message, HasSubstr("waiting for admission by Kueue in queue team-a: 2 of 2"));
  EXPECT_THAT(message, HasSubstr("Kueue: couldn't assign flavors to pod set main"));
  EXPECT_EQ(Status()["evictions"], 1) << "the held pods are not a second eviction";

  // Admitted again: it runs, no restart spent.
  cluster_.FinishDeletions();
  Managed("job-node-0-1");
  Managed("job-node-1-1");
  for (const char* name : {"job-node-0-1", "job-node-1-1"}) {
    (*cluster_.Pod(name))["spec"]["schedulingGates"] = json::array();
  }
  ASSERT_TRUE(Reconcile().status.ok());
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Status()["phase"], "Running");
  EXPECT_EQ(Condition("Queued")["reason"], "Admitted");
  EXPECT_EQ(Status()["restarts"], 0);
  EXPECT_EQ(Status()["evictions"], 1);
}

TEST_F(KueueReconcileTest, AQueuedJobQuotesKueue) {
  AddJob("InPlace");
  ASSERT_TRUE(Reconcile().status.ok());
  for (int node = 0; node < 2; ++node) {
    (*cluster_.Pod(PodName("job", node)))["spec"]["schedulingGates"] =
        json::array({{{"name", "kueue.x-k8s.io/admission"}}});
  }
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Condition("Queued")["message"],
            "waiting for admission by Kueue in queue team-a: 2 of 2 pods gated "
            "(kueue.x-k8s.io/admission)");
  cluster_.SetKueueWorkload(Group(), {{"status",
                                       {{"conditions",
                                         {{{"type", "QuotaReserved"},
                                           {"status", "False"},
                                           {"message", "ClusterQueue gpus is inactive"}}}}}}});
  ReconcileResult r = Reconcile();
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(Condition("Queued")["message"],
            "waiting for admission by Kueue in queue team-a: 2 of 2 pods gated "
            "(kueue.x-k8s.io/admission); Kueue: ClusterQueue gpus is inactive");
  ASSERT_TRUE(r.requeue_after) << "the Workload is not watched: read again while queued";
  // A Workload that cannot be read leaves the operator's own words.
  cluster_.FailNext("get-workload", spawnpoint::Status(StatusCode::kForbidden, "forbidden"));
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Status()["phase"], "Queued");
}

TEST_F(KueueReconcileTest, AFailedJobEndsItsKueueGroupSoTheQuotaIsFreed) {
  StartRunning("Recreate", /*max_restarts=*/0);
  cluster_.FailPod("job-node-0", 1, "Error");
  // The annotation fails once: no status write, the next reconcile does both.
  cluster_.FailNext("annotate-pod", spawnpoint::Status(StatusCode::kUnavailable, "try again"));
  EXPECT_EQ(Reconcile().status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(Status()["phase"], "Running");
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Status()["phase"], "Failed");
  for (const char* name : {"job-node-0", "job-node-1"}) {
    EXPECT_EQ(AnnotationOf(*cluster_.Pod(name), kKueueRetriableAnnotation), "false") << name;
  }
  cluster_.ClearWrites();
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_THAT(cluster_.Writes(), Not(Contains(HasSubstr("annotate-pod")))) << "once";
}

TEST_F(KueueReconcileTest, WithoutTheGrantTheFailureIsStillWritten) {
  StartRunning("Recreate", /*max_restarts=*/0);
  cluster_.FailPod("job-node-0", 1, "Error");
  cluster_.FailNext("annotate-pod", spawnpoint::Status(StatusCode::kForbidden, "forbidden"));
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Status()["phase"], "Failed");
}

// Suspend frees the quota as a failure does; on resume the new gang waits until the ended
// group's Workload is gone (it goes with the old pods), not to join a group Kueue finished.
TEST_F(KueueReconcileTest, SuspendEndsTheGroupAndResumeWaitsForItsWorkloadToGo) {
  StartRunning("InPlace");
  cluster_.UpdateSpec("job", [](json& spec) { spec["runPolicy"]["suspend"] = true; });
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Status()["phase"], "Suspended");
  for (const char* name : {"job-node-0", "job-node-1"}) {
    EXPECT_EQ(AnnotationOf(*cluster_.Pod(name), kKueueRetriableAnnotation), "false") << name;
  }
  // Kueue finishes the Workload and lets go of the pods; the Workload stays until the garbage
  // collector takes it.
  cluster_.FinishDeletions();
  cluster_.SetKueueWorkload(
      Group(), {{"metadata", {{"name", Group()}}},
                {"status", {{"conditions", {{{"type", "Finished"}, {"status", "True"}}}}}}});
  cluster_.UpdateSpec("job", [](json& spec) { spec["runPolicy"]["suspend"] = false; });
  cluster_.ClearWrites();
  ReconcileResult r = Reconcile();
  ASSERT_TRUE(r.status.ok());
  EXPECT_TRUE(Creates().empty()) << "the ended group's Workload is still there";
  ASSERT_TRUE(r.requeue_after);
  cluster_.FailNext("get-workload", spawnpoint::Status(StatusCode::kNotFound, "gone"));
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_THAT(Creates(), ::testing::ElementsAre("job-node-0", "job-node-1"));
}

TEST_F(KueueReconcileTest, WithoutKueueNamesAndFailuresAreAsBefore) {
  json job = MakeJob("job", 2, 0, 1, "Recreate");
  cluster_.AddJob(job);
  cluster_.SetGracefulDeletion(true);
  ASSERT_TRUE(Reconcile().status.ok());
  Managed("job-node-0");
  Managed("job-node-1");
  ASSERT_TRUE(Reconcile().status.ok());
  cluster_.FailPod("job-node-0", 1, "Error");
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Status()["phase"], "Failed");
  EXPECT_THAT(cluster_.Writes(), Not(Contains(HasSubstr("annotate-pod"))));
}

}  // namespace
}  // namespace spawnpoint::op
