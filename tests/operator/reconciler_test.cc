// The reconciler on a fake cluster and simulated time: every lifecycle path of a job.
#include "operator/reconciler/reconciler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "operator/common/names.h"
#include "operator/common/object.h"
#include "tests/operator/fake_cluster.h"
#include "tests/operator/test_jobs.h"

namespace spawnpoint::op {
namespace {

using nlohmann::json;
using std::chrono::seconds;
using ::testing::ElementsAre;
using testing::FakeCluster;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::IsSupersetOf;
using testing::MakeJob;

class ReconcilerTest : public ::testing::Test {
 protected:
  ReconcilerTest()
      : wall_(&clock_, WallTime(std::chrono::seconds(1'714'557'600))),  // 2024-05-01T10:00:00Z
        cluster_(&wall_) {}

  void MakeReconciler(ReconcilerOptions options = {}) {
    reconciler_ = std::make_unique<Reconciler>(&cluster_, &wall_, std::move(options), nullptr);
  }

  void SetUp() override { MakeReconciler(); }

  ReconcileResult Reconcile(const std::string& name = "job") {
    return reconciler_->Reconcile("default", name, Logger());
  }
  json Status(const std::string& name = "job") { return (*cluster_.Job(name))["status"]; }
  std::string Phase(const std::string& name = "job") { return Status(name).value("phase", ""); }
  json Condition(const std::string& type, const std::string& name = "job") {
    for (const auto& c : Status(name).value("conditions", json::array())) {
      if (c["type"] == type) return c;
    }
    return json();
  }
  std::vector<std::string> EventReasons() {
    std::vector<std::string> out;
    for (const auto& e : cluster_.Events()) out.push_back(e.reason);
    return out;
  }
  void AllPods(const std::string& phase, int nodes = 2) {
    for (int i = 0; i < nodes; ++i) cluster_.SetPodPhase(PodName("job", i), phase);
  }
  // Runs a new job until its gang is Running.
  void StartRunning(json job = MakeJob("job")) {
    cluster_.AddJob(std::move(job));
    ASSERT_TRUE(Reconcile().status.ok());
    AllPods("Running");
    ASSERT_TRUE(Reconcile().status.ok());
    ASSERT_EQ(Phase(), "Running");
  }

  SimulatedClock clock_;
  WallClock wall_;
  FakeCluster cluster_;
  std::unique_ptr<Reconciler> reconciler_;
};

TEST_F(ReconcilerTest, NewJobGetsServiceAndGangAndOneStatusWrite) {
  cluster_.AddJob(MakeJob("job"));
  ReconcileResult r = Reconcile();
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_THAT(cluster_.Writes(), ElementsAre("create-service job", "create-pod job-node-0",
                                             "create-pod job-node-1", "update-status job"));
  EXPECT_EQ(Phase(), "Pending");
  EXPECT_EQ(Status()["worldSize"], 2);
  EXPECT_EQ(Status()["restarts"], 0);
  EXPECT_EQ(Status()["observedGeneration"], 1);
  EXPECT_EQ(Status()["startTime"], "2024-05-01T10:00:00Z");
  EXPECT_EQ(Condition("Created")["status"], "True");
  EXPECT_EQ(Status()["nodes"]["pending"], 2);
  EXPECT_THAT(EventReasons(), ElementsAre("Created"));
  EXPECT_EQ((*cluster_.Pod("job-node-1"))["metadata"]["labels"][kAttemptLabel], "0");
}

TEST_F(ReconcilerTest, RepeatedReconcileChangesNothing) {
  cluster_.AddJob(MakeJob("job"));
  ASSERT_TRUE(Reconcile().status.ok());
  cluster_.ClearWrites();
  ReconcileResult again = Reconcile();
  EXPECT_TRUE(again.status.ok());
  EXPECT_FALSE(again.status_written);
  EXPECT_THAT(cluster_.Writes(), IsEmpty());
}

// The status watchdog marked the job stale while no operator ran (status_watchdog.h): the
// first reconcile after sets it False, says so once, and the next reconcile writes nothing.
TEST_F(ReconcilerTest, AStatusMarkedStaleIsCurrentAgainOnTheFirstReconcile) {
  StartRunning();
  EXPECT_TRUE(Condition("StatusStale").is_null());  // never added to a job never marked
  (*cluster_.Job("job"))["status"]["conditions"].push_back(
      {{"type", "StatusStale"},
       {"status", "True"},
       {"reason", "OperatorNotRunning"},
       {"message", "no spawnpoint operator is running"},
       {"lastTransitionTime", "2024-05-01T09:00:00Z"}});
  cluster_.ClearWrites();
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Condition("StatusStale")["status"], "False");
  EXPECT_EQ(Condition("StatusStale")["reason"], "OperatorRunning");
  EXPECT_EQ(Condition("StatusStale")["lastTransitionTime"], "2024-05-01T10:00:00Z");
  EXPECT_EQ(Phase(), "Running");
  EXPECT_THAT(EventReasons(), ::testing::Contains("StatusCurrent"));
  EXPECT_THAT(cluster_.Writes(), ElementsAre("update-status job"));
  cluster_.ClearWrites();
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_THAT(cluster_.Writes(), IsEmpty());
}

TEST_F(ReconcilerTest, RunningThenSucceeded) {
  StartRunning();
  EXPECT_EQ(Condition("Running")["status"], "True");
  EXPECT_EQ(Status()["nodes"]["running"], 2);
  cluster_.SetPodPhase("job-node-0", "Succeeded");
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Running") << "one node done is not success";
  clock_.Advance(seconds(5));
  cluster_.SetPodPhase("job-node-1", "Succeeded");
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Succeeded");
  EXPECT_EQ(Status()["completionTime"], "2024-05-01T10:00:05Z");
  EXPECT_EQ(Condition("Succeeded")["status"], "True");
  EXPECT_EQ(Condition("Running")["status"], "False");
  EXPECT_THAT(EventReasons(), ElementsAre("Created", "Succeeded"));
  // cleanPodPolicy Running keeps finished pods; the service goes on the next pass.
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(cluster_.PodNames().size(), 2u);
  EXPECT_FALSE(cluster_.HasService("job"));
}

// Node 1's pod ends with its rank's collective error (its termination message) at 10:00:00.
void FailNode1WithACollectiveError(FakeCluster& cluster) {
  const json collective = {{"rank", 1},
                           {"nodeRank", 1},
                           {"exitCode", 1},
                           {"reason", "CollectiveError"},
                           {"message", "a collective failed"},
                           {"failedAt", "2024-05-01T10:00:00.000Z"}};
  cluster.FailPod("job-node-1", 1, "Error", collective.dump(), "2024-05-01T10:00:00Z");
}

// A peer's collective error is often the first pod to end when a rank dies (its agent reports
// at once; the dying rank's agent first stops its pools): while every failure is a collective
// one and another pod still runs, the operator waits a moment for the failure they are a
// consequence of. Found by the chaos run (tests/chaos): an agent SIGTERMed in a Recreate job
// failed it for good with its peer's CollectiveError, the operator deciding in between.
TEST_F(ReconcilerTest, APeersCollectiveErrorWaitsForTheFailureItIsAConsequenceOf) {
  StartRunning(MakeJob("job", 2, /*max_restarts=*/3, /*backoff_seconds=*/0));
  FailNode1WithACollectiveError(cluster_);
  ReconcileResult r = Reconcile();
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(Phase(), "Running") << "node 0's pod still runs: not yet";
  ASSERT_TRUE(r.requeue_after.has_value());
  clock_.Advance(std::chrono::seconds(2));
  cluster_.FailPod("job-node-0", 143, "Error", "", "2024-05-01T10:00:01Z");
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Restarting");
  EXPECT_EQ(Status()["lastFailure"]["node"], 0);
  EXPECT_EQ(Status()["lastFailure"]["exitCode"], 143);
  EXPECT_EQ(Status()["lastFailure"]["consequences"][0]["reason"], "CollectiveError");
}

// Only collective errors, the other pod running on: after the wait the earliest decides.
TEST_F(ReconcilerTest, OnlyACollectiveErrorDecidesOnceTheWaitIsOver) {
  StartRunning(MakeJob("job", 2, /*max_restarts=*/3, /*backoff_seconds=*/0));
  FailNode1WithACollectiveError(cluster_);
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Running");
  clock_.Advance(std::chrono::seconds(11));
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Failed");
  EXPECT_EQ(Status()["lastFailure"]["reason"], "CollectiveError");
}

TEST_F(ReconcilerTest, RetryableFailureRestartsTheWholeGangNowThenAfterBackoff) {
  StartRunning(MakeJob("job", 2, /*max_restarts=*/3, /*backoff_seconds=*/2));
  cluster_.FailPod("job-node-1", 137, "OOMKilled");
  ReconcileResult failed = Reconcile();
  ASSERT_TRUE(failed.status.ok());
  EXPECT_EQ(Phase(), "Restarting");
  EXPECT_EQ(Status()["restarts"], 1);
  EXPECT_EQ(Status()["lastFailure"]["node"], 1);
  EXPECT_EQ(Status()["lastFailure"]["exitCode"], 137);
  EXPECT_EQ(Status()["lastFailure"]["reason"], "OOMKilled");
  EXPECT_EQ(Status()["lastFailure"]["attempt"], 0);
  EXPECT_EQ(Status()["lastFailure"]["quickFailures"], 1);
  EXPECT_EQ(Condition("Restarting")["status"], "True");
  EXPECT_THAT(Condition("Restarting")["message"].get<std::string>(),
              HasSubstr("restart 1 of 3 now"));
  EXPECT_EQ(cluster_.PodNames().size(), 2u) << "the failure is recorded before anything goes";

  // Next pass: the old attempt's pods are stale and deleted; no wait after a first failure.
  cluster_.ClearWrites();
  Reconcile();
  EXPECT_THAT(cluster_.Writes(), IsSupersetOf({"delete-pod job-node-0", "delete-pod job-node-1"}));
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(cluster_.PodNames().size(), 2u);
  EXPECT_EQ((*cluster_.Pod("job-node-0"))["metadata"]["labels"][kAttemptLabel], "1");
  EXPECT_EQ(Phase(), "Restarting") << "until the new gang runs";
  AllPods("Running");
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Running");
  EXPECT_EQ(Condition("Restarting")["status"], "False");
  EXPECT_EQ(Status()["restarts"], 1);
  EXPECT_THAT(EventReasons(),
              ElementsAre("Created", "NodeFailed", "Restarting", "Created", "Restarted"));
  EXPECT_THAT(cluster_.Events()[1].message, HasSubstr("exited 137 (OOMKilled)"));

  // It fails again quickly: now the backoff holds the new gang.
  cluster_.FailPod("job-node-0", 137, "OOMKilled");
  failed = Reconcile();
  EXPECT_EQ(Status()["lastFailure"]["quickFailures"], 2);
  EXPECT_EQ(failed.requeue_after, seconds(2));
  EXPECT_THAT(Condition("Restarting")["message"].get<std::string>(),
              HasSubstr("restart 2 of 3 in 2s: 2nd quick failure in a row"));
  ReconcileResult waiting = Reconcile();  // deletes the stale gang
  ASSERT_TRUE(waiting.requeue_after.has_value());
  EXPECT_EQ(*waiting.requeue_after, seconds(2));
  clock_.Advance(std::chrono::milliseconds(1500));
  EXPECT_EQ(*Reconcile().requeue_after, std::chrono::milliseconds(500));
  EXPECT_TRUE(cluster_.PodNames().empty());
  clock_.Advance(std::chrono::milliseconds(500));
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(cluster_.PodNames().size(), 2u);
  EXPECT_EQ((*cluster_.Pod("job-node-0"))["metadata"]["labels"][kAttemptLabel], "2");
}

TEST_F(ReconcilerTest, BackoffDoublesWhileFailuresComeQuickly) {
  StartRunning(MakeJob("job", 2, 3, 1));
  for (int restart = 1; restart <= 3; ++restart) {
    cluster_.FailPod("job-node-0", 143, "Error");
    ReconcileResult r = Reconcile();
    const seconds wait = restart == 1 ? seconds(0) : seconds(1 << (restart - 2));
    EXPECT_EQ(Status()["lastFailure"]["quickFailures"], restart);
    if (wait > seconds(0)) {
      ASSERT_EQ(r.requeue_after, wait) << restart;
    }
    clock_.Advance(wait);
    Reconcile();  // deletes the stale gang
    Reconcile();  // creates the next
    AllPods("Running");
    Reconcile();
    ASSERT_EQ(Phase(), "Running") << restart;
  }
  EXPECT_EQ(Status()["restarts"], 3);
}

TEST_F(ReconcilerTest, AnAttemptThatRanResetAfterSecondsRestartsAtOnceAgain) {
  StartRunning(MakeJob("job", 2, 5, 10));
  cluster_.FailPod("job-node-0", 143, "Error");
  Reconcile();
  Reconcile();
  Reconcile();
  AllPods("Running");
  Reconcile();
  ASSERT_EQ(Phase(), "Running");
  clock_.Advance(seconds(601));  // the second attempt runs past resetAfterSeconds (600)
  cluster_.FailPod("job-node-1", 143, "Error");
  ReconcileResult r = Reconcile();
  EXPECT_EQ(Status()["lastFailure"]["quickFailures"], 1);
  EXPECT_GE(Status()["lastFailure"]["ranSeconds"].get<int>(), 600);
  EXPECT_THAT(Condition("Restarting")["message"].get<std::string>(),
              HasSubstr("restart 2 of 5 now"));
  EXPECT_TRUE(!r.requeue_after || *r.requeue_after == seconds(0));
}

TEST_F(ReconcilerTest, NonRetryableExitFailsWithLastFailureAndStopsThePeers) {
  StartRunning();
  cluster_.FailPod("job-node-1", 1, "Error", "Traceback: ValueError");
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Failed");
  EXPECT_EQ(Status()["restarts"], 0);
  EXPECT_EQ(Status()["lastFailure"]["exitCode"], 1);
  EXPECT_EQ(Status()["lastFailure"]["message"], "Traceback: ValueError");
  EXPECT_EQ(Condition("Failed")["reason"], "NonRetryableFailure");
  EXPECT_FALSE(Status()["completionTime"].is_null());
  EXPECT_THAT(EventReasons(), ElementsAre("Created", "NodeFailed", "Failed"));
  // cleanPodPolicy Running: the still-running peer goes, the failed pod stays for its logs.
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_THAT(cluster_.PodNames(), ElementsAre("job-node-1"));
}

TEST_F(ReconcilerTest, RestartsNeverExceedMaxRestarts) {
  StartRunning(MakeJob("job", 2, /*max_restarts=*/1, /*backoff_seconds=*/0));
  cluster_.FailPod("job-node-0", 137);
  Reconcile();
  Reconcile();
  Reconcile();
  AllPods("Running");
  Reconcile();
  ASSERT_EQ(Status()["restarts"], 1);
  cluster_.FailPod("job-node-0", 137);
  Reconcile();
  EXPECT_EQ(Phase(), "Failed");
  EXPECT_EQ(Status()["restarts"], 1);
  EXPECT_EQ(Condition("Failed")["reason"], "MaxRestartsReached");
  EXPECT_THAT(Condition("Failed")["message"].get<std::string>(), HasSubstr("maxRestarts 1"));
}

TEST_F(ReconcilerTest, RetryableExitCodesOverrideTheDefault) {
  json job = MakeJob("job");
  job["spec"]["restartPolicy"]["retryableExitCodes"] = {1};
  StartRunning(job);
  cluster_.FailPod("job-node-0", 1);
  Reconcile();
  EXPECT_EQ(Phase(), "Restarting");
}

TEST_F(ReconcilerTest, AgentTerminationMessageNamesTheRank) {
  StartRunning();
  json agent = {{"rank", 1},
                {"localRank", 0},
                {"nodeRank", 1},
                {"exitCode", 135},
                {"signal", 7},
                {"reason", "ShmExhausted"},
                {"message", "SIGBUS: /dev/shm is full"},
                {"restarts", 0}};
  cluster_.FailPod("job-node-1", 135, "Error", agent.dump());
  Reconcile();
  json last = Status()["lastFailure"];
  EXPECT_EQ(last["rank"], 1);
  EXPECT_EQ(last["reason"], "ShmExhausted");
  EXPECT_EQ(last["signal"], 7);
  EXPECT_EQ(last["message"], "SIGBUS: /dev/shm is full");
}

TEST_F(ReconcilerTest, ThePeerFailureThatFollowsIsNotBlamed) {
  StartRunning();
  // Node 1 is OOM-killed; node 0's rank then fails its collective with exit 1 in the
  // same second.
  cluster_.FailPod("job-node-1", 137, "OOMKilled", "", "2024-05-01T10:00:00Z");
  cluster_.FailPod("job-node-0", 1, "Error", "gloo: connection reset", "2024-05-01T10:00:00Z");
  Reconcile();
  EXPECT_EQ(Phase(), "Restarting");
  EXPECT_EQ(Status()["lastFailure"]["node"], 1);
}

TEST_F(ReconcilerTest, LostStatusWriteLosesNothing) {
  StartRunning();
  cluster_.FailPod("job-node-1", 137);
  cluster_.ClearWrites();
  cluster_.FailNext("update-status", ::spawnpoint::Status(StatusCode::kConflict, "modified"));
  ReconcileResult r = Reconcile();
  EXPECT_EQ(r.status.code(), StatusCode::kConflict);
  EXPECT_THAT(cluster_.Writes(), IsEmpty()) << "no pod is deleted before the failure is stored";
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Status()["restarts"], 1);
}

TEST_F(ReconcilerTest, InterruptedCreationCompletesWithExactlyTheGang) {
  cluster_.AddJob(MakeJob("job"));
  cluster_.FailNext("create-pod", ::spawnpoint::Status(StatusCode::kUnavailable, "500"), 1);
  // Pod 0 fails to be created: nothing after it is attempted.
  EXPECT_EQ(Reconcile().status.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(cluster_.PodNames().empty());
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_THAT(cluster_.PodNames(), ElementsAre("job-node-0", "job-node-1"));

  // A crash right after the first pod: the next reconcile makes only the second.
  cluster_.AddJob(MakeJob("other"));
  ReconcilerOptions crash;
  crash.after_pod_create = [](const std::string& pod) {
    if (pod == "other-node-0") throw std::runtime_error("crash");
  };
  MakeReconciler(crash);
  EXPECT_THROW(Reconcile("other"), std::runtime_error);
  MakeReconciler();
  cluster_.ClearWrites();
  ASSERT_TRUE(Reconcile("other").status.ok());
  EXPECT_THAT(cluster_.Writes(), ElementsAre("create-pod other-node-1", "update-status other"));
}

TEST_F(ReconcilerTest, NewGangWaitsUntilTheOldPodsAreGone) {
  cluster_.SetGracefulDeletion(true);
  StartRunning(MakeJob("job", 2, 3, 0));
  cluster_.FailPod("job-node-0", 137);
  Reconcile();  // records the failure
  Reconcile();  // deletes the gang: terminating
  Reconcile();
  EXPECT_EQ(AttemptOf(*cluster_.Pod("job-node-0")), 0) << "names are still taken";
  cluster_.FinishDeletions();
  Reconcile();
  EXPECT_EQ(AttemptOf(*cluster_.Pod("job-node-0")), 1);
}

TEST_F(ReconcilerTest, SuspendDeletesPodsAndResumeRecreatesThem) {
  StartRunning();
  cluster_.UpdateSpec("job", [](json& spec) { spec["runPolicy"]["suspend"] = true; });
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Suspended");
  EXPECT_TRUE(cluster_.PodNames().empty());
  EXPECT_EQ(Condition("Suspended")["status"], "True");
  EXPECT_FALSE(Status().contains("startTime"));
  EXPECT_TRUE(cluster_.HasService("job"));
  clock_.Advance(seconds(30));
  cluster_.UpdateSpec("job", [](json& spec) { spec["runPolicy"]["suspend"] = false; });
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(cluster_.PodNames().size(), 2u);
  EXPECT_EQ(Condition("Suspended")["status"], "False");
  EXPECT_EQ(Status()["startTime"], "2024-05-01T10:00:30Z");
  EXPECT_EQ(Status()["observedGeneration"], 3);
  EXPECT_THAT(EventReasons(), ElementsAre("Created", "Suspended", "Created", "Resumed"));
}

TEST_F(ReconcilerTest, ActiveDeadlineFailsTheJobAndStopsItsPods) {
  json job = MakeJob("job");
  job["spec"]["runPolicy"]["activeDeadlineSeconds"] = 60;
  cluster_.AddJob(job);
  ReconcileResult first = Reconcile();
  EXPECT_EQ(first.requeue_after, seconds(60));
  AllPods("Running");
  clock_.Advance(seconds(59));
  EXPECT_EQ(Reconcile().requeue_after, seconds(1));
  clock_.Advance(seconds(1));
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Failed");
  EXPECT_EQ(Condition("Failed")["reason"], "DeadlineExceeded");
  EXPECT_TRUE(cluster_.PodNames().empty());
  EXPECT_EQ(EventReasons().back(), "DeadlineExceeded");
}

TEST_F(ReconcilerTest, TtlDeletesTheFinishedJob) {
  json job = MakeJob("job");
  job["spec"]["runPolicy"]["ttlSecondsAfterFinished"] = 10;
  StartRunning(job);
  AllPods("Succeeded");
  ASSERT_TRUE(Reconcile().status.ok());
  ASSERT_EQ(Phase(), "Succeeded");
  EXPECT_EQ(Reconcile().requeue_after, seconds(10));
  clock_.Advance(seconds(10));
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(cluster_.Job("job"), nullptr);
  EXPECT_TRUE(cluster_.PodNames().empty());
}

TEST_F(ReconcilerTest, CleanPodPolicyAllAndNone) {
  json all = MakeJob("job");
  all["spec"]["runPolicy"]["cleanPodPolicy"] = "All";
  StartRunning(all);
  AllPods("Succeeded");
  Reconcile();
  Reconcile();
  EXPECT_TRUE(cluster_.PodNames().empty());

  json none = MakeJob("keep", 1);
  none["spec"]["runPolicy"]["cleanPodPolicy"] = "None";
  cluster_.AddJob(none);
  Reconcile("keep");
  cluster_.FailPod("keep-node-0", 2);
  Reconcile("keep");
  Reconcile("keep");
  EXPECT_THAT(cluster_.PodNames(), ElementsAre("keep-node-0"));
  EXPECT_TRUE(cluster_.HasService("keep"));
}

TEST_F(ReconcilerTest, InvalidSpecIsReportedWithTheFieldPathUntilFixed) {
  json job = MakeJob("job");
  job["spec"]["backend"] = "nccl";  // needs GPUs (the CRD says so too, an older CRD did not)
  cluster_.AddJob(job);
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Failed");
  EXPECT_EQ(Condition("Failed")["reason"], "InvalidSpec");
  EXPECT_THAT(Condition("Failed")["message"].get<std::string>(), HasSubstr("spec.backend"));
  EXPECT_TRUE(cluster_.PodNames().empty());
  cluster_.ClearWrites();
  Reconcile();
  EXPECT_THAT(cluster_.Writes(), IsEmpty());
  cluster_.UpdateSpec("job", [](json& spec) { spec["backend"] = "gloo"; });
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Pending");
  EXPECT_EQ(cluster_.PodNames().size(), 2u);
  EXPECT_EQ(Condition("Failed")["status"], "False");
}

TEST_F(ReconcilerTest, PodPendingTooLongIsNamedInStatus) {
  ReconcilerOptions options;
  options.pending_timeout = seconds(30);
  MakeReconciler(options);
  cluster_.AddJob(MakeJob("job"));
  EXPECT_EQ(Reconcile().requeue_after, seconds(30));
  cluster_.SetPodPhase("job-node-0", "Running");
  json* pod = cluster_.Pod("job-node-1");
  (*pod)["status"]["conditions"] =
      json::array({{{"type", "PodScheduled"},
                    {"status", "False"},
                    {"reason", "Unschedulable"},
                    {"message", "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."}}});
  clock_.Advance(seconds(31));
  ASSERT_TRUE(Reconcile().status.ok());
  json running = Condition("Running");
  EXPECT_EQ(running["reason"], "PodPending");
  EXPECT_THAT(running["message"].get<std::string>(),
              HasSubstr("pod job-node-1 has been Pending for 31s: 0/4 nodes are available"));
  EXPECT_EQ(EventReasons().back(), "PodPending");
  Reconcile();
  EXPECT_EQ(EventReasons().back(), "PodPending");
  EXPECT_EQ(EventReasons().size(), 2u) << "reported once";
}

TEST_F(ReconcilerTest, AStaleCacheNeverRecreatesTheChildrenOfADeletedJob) {
  cluster_.AddJob(MakeJob("job"));
  cluster_.SetJobGoneForLiveReads(true);  // deleted; the cache has not seen it yet
  ReconcileResult r = Reconcile();
  EXPECT_TRUE(r.status.ok());
  EXPECT_THAT(cluster_.Writes(), IsEmpty());
  cluster_.SetJobGoneForLiveReads(false);
  cluster_.FailNext("get-job", ::spawnpoint::Status(StatusCode::kUnavailable, "500"));
  EXPECT_EQ(Reconcile().status.code(), StatusCode::kUnavailable);
  EXPECT_THAT(cluster_.Writes(), IsEmpty()) << "nothing is created without the live read";
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(cluster_.PodNames().size(), 2u);
}

TEST_F(ReconcilerTest, DeletedOrTerminatingJobIsLeftToGarbageCollection) {
  EXPECT_TRUE(Reconcile("missing").status.ok());
  json job = MakeJob("job");
  job["metadata"]["deletionTimestamp"] = "2024-05-01T10:00:00Z";
  cluster_.AddJob(job);
  Reconcile();
  EXPECT_THAT(cluster_.Writes(), IsEmpty());
}

TEST_F(ReconcilerTest, EvictionIsRetryableWhateverTheExitCode) {
  StartRunning();
  json* pod = cluster_.Pod("job-node-0");
  (*pod)["status"] = {{"phase", "Failed"},
                      {"reason", "Evicted"},
                      {"message", "The node was low on resource: memory."}};
  Reconcile();
  EXPECT_EQ(Phase(), "Restarting");
  EXPECT_EQ(Status()["lastFailure"]["reason"], "Evicted");
}

}  // namespace
}  // namespace spawnpoint::op

namespace spawnpoint::op {
namespace {

class FixedUtilisation : public UtilisationSource {
 public:
  std::optional<nlohmann::json> Latest(const std::string& ns, const std::string& name) override {
    return nlohmann::json{{"gpu", 0.93}, {"dataStall", 0.04}, {"samplesPerSecond", 1234.5}};
  }
};

TEST(ReconcilerUtilisationTest, RunningJobsCarryTheLatestReading) {
  SimulatedClock clock;
  WallClock wall(&clock);
  testing::FakeCluster cluster(&wall);
  FixedUtilisation utilisation;
  Reconciler reconciler(&cluster, &wall, {}, &utilisation);
  cluster.AddJob(testing::MakeJob("job"));
  reconciler.Reconcile("default", "job", Logger());
  EXPECT_FALSE((*cluster.Job("job"))["status"].contains("utilisation")) << "not running yet";
  cluster.SetPodPhase("job-node-0", "Running");
  cluster.SetPodPhase("job-node-1", "Running");
  reconciler.Reconcile("default", "job", Logger());
  EXPECT_EQ((*cluster.Job("job"))["status"]["utilisation"]["gpu"], 0.93);
  // Once no rank runs the columns are empty, not the last reading (issue 41: GPU-UTIL 0.89 on a
  // Succeeded job).
  cluster.SetPodPhase("job-node-0", "Succeeded");
  cluster.SetPodPhase("job-node-1", "Succeeded");
  reconciler.Reconcile("default", "job", Logger());
  EXPECT_EQ((*cluster.Job("job"))["status"]["phase"], "Succeeded");
  EXPECT_FALSE((*cluster.Job("job"))["status"].contains("utilisation"));
}

// Stalled ranks (issue 13): the agents' readings through a source the test sets.
class FakeStallSource : public UtilisationSource {
 public:
  std::optional<nlohmann::json> Latest(const std::string&, const std::string&) override {
    return std::nullopt;
  }
  std::optional<StallReading> LatestStall(const std::string&, const std::string&) override {
    return reading;
  }
  std::optional<StragglerReading> LatestStraggler(const std::string&, const std::string&) override {
    return straggler;
  }
  std::optional<StallReading> reading;
  std::optional<StragglerReading> straggler;
};

class ReconcilerStallTest : public ReconcilerTest {
 protected:
  void SetUp() override {
    reconciler_ = std::make_unique<Reconciler>(&cluster_, &wall_, ReconcilerOptions{}, &stalls_);
  }
  // The agents read now; `stall` null: none reports one.
  void Read(json stall) {
    stalls_.reading = StallReading{std::move(stall), FormatTime(wall_.Now())};
  }
  // The job's straggler judged now; null: none.
  void ReadStraggler(json straggler) {
    stalls_.straggler = StragglerReading{std::move(straggler), FormatTime(wall_.Now())};
  }
  static json Straggler(int rank, double ratio) {
    return {{"rank", rank},
            {"pod", "job-node-1"},
            {"ratio", ratio},
            {"busySeconds", 0.1},
            {"peersBusySeconds", 0.1 / ratio},
            {"windowSteps", 20},
            {"message", "from the poller"}};
  }
  int Count(const std::string& reason) {
    int n = 0;
    for (const auto& e : cluster_.Events()) n += e.reason == reason;
    return n;
  }
  static json AgentStall(double silent) {
    return {{"rank", 1},
            {"pod", "job-node-0"},
            {"silentSeconds", silent},
            {"medianStepSeconds", 0.41},
            {"beforeFirstStep", false},
            {"topFrame", "all_reduce"},
            {"stackSource", "eu-stack"},
            {"message", "rank 1 (pod job-node-0) made no step for " +
                            std::to_string(static_cast<int>(silent)) +
                            " s; median step 0.41 s; top frame: all_reduce"},
            {"waiting", json::array({0})}};
  }
  FakeStallSource stalls_;
};

TEST_F(ReconcilerStallTest, AStalledRankSetsTheConditionAndOneEventUntilItSteps) {
  StartRunning();
  clock_.Advance(seconds(30));
  Read(nullptr);
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_TRUE(Condition("Stalled").is_null()) << "never set while nothing stalled";

  clock_.Advance(seconds(30));
  Read(AgentStall(312));
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Condition("Stalled")["status"], "True");
  EXPECT_EQ(Condition("Stalled")["reason"], "RankStalled");
  EXPECT_EQ(Condition("Stalled")["message"],
            "rank 1 (pod job-node-0) made no step for 312 s; median step 0.41 s; top frame: "
            "all_reduce");
  EXPECT_EQ(Status()["stall"]["rank"], 1);
  EXPECT_EQ(Status()["stall"]["since"], "2024-05-01T10:01:00Z");
  EXPECT_EQ(Phase(), "Running") << "Report: the job keeps running";
  ASSERT_EQ(Count("RankStalled"), 1);
  EXPECT_EQ(cluster_.Events().back().type, EventType::kWarning);
  EXPECT_THAT(cluster_.Events().back().message, HasSubstr("rank 1 (pod job-node-0)"));

  // Read again, still stalled: the message follows, no second event.
  clock_.Advance(seconds(30));
  Read(AgentStall(342));
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_THAT(Condition("Stalled")["message"].get<std::string>(), HasSubstr("342 s"));
  EXPECT_EQ(Condition("Stalled")["lastTransitionTime"], "2024-05-01T10:01:00Z");
  EXPECT_EQ(Count("RankStalled"), 1);
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Count("RankStalled"), 1);

  // It steps again.
  clock_.Advance(seconds(30));
  Read(nullptr);
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Condition("Stalled")["status"], "False");
  EXPECT_EQ(Condition("Stalled")["reason"], "Progressing");
  EXPECT_FALSE(Status().contains("stall"));

  // And stalls again: a new event.
  clock_.Advance(seconds(30));
  Read(AgentStall(6));
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Condition("Stalled")["status"], "True");
  EXPECT_EQ(Count("RankStalled"), 2);
}

TEST_F(ReconcilerStallTest, ALostStatusWriteRecordsTheEventWithTheNextOne) {
  StartRunning();
  clock_.Advance(seconds(30));
  Read(AgentStall(40));
  cluster_.FailNext("update-status", Unavailable("etcd is slow"));
  EXPECT_FALSE(Reconcile().status.ok());
  EXPECT_EQ(Count("RankStalled"), 0) << "events follow a written status";
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Count("RankStalled"), 1);
}

TEST_F(ReconcilerStallTest, AReadingFromBeforeTheGangRanIsNotUsed) {
  Read(AgentStall(40));  // read at 10:00:00, the previous attempt
  clock_.Advance(seconds(5));
  StartRunning();  // running since 10:00:05
  EXPECT_TRUE(Condition("Stalled").is_null());
  EXPECT_EQ(Count("RankStalled"), 0);
  clock_.Advance(seconds(1));
  Read(AgentStall(41));
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Condition("Stalled")["status"], "True");
}

// A slow rank is not a hang: the Straggler condition says it, Stalled never does (it read
// STALLED=True for a rank 1.5x slower under CPU contention).
TEST_F(ReconcilerStallTest, AStragglerSetsItsOwnConditionAndOneEventUntilItCatchesUp) {
  StartRunning();
  clock_.Advance(seconds(30));
  Read(nullptr);
  ReadStraggler(nullptr);
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_TRUE(Condition("Stalled").is_null()) << "never set while nothing stalled";
  EXPECT_TRUE(Condition("Straggler").is_null()) << "never set while nothing straggled";

  clock_.Advance(seconds(30));
  Read(nullptr);
  ReadStraggler(Straggler(1, 2));
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_TRUE(Condition("Stalled").is_null()) << "a straggler is not a stall";
  EXPECT_EQ(Condition("Straggler")["status"], "True");
  EXPECT_EQ(Condition("Straggler")["reason"], "SlowerThanPeers");
  EXPECT_EQ(Condition("Straggler")["message"],
            "rank 1 (pod job-node-1) is 2.00x slower than the other ranks: 0.1 s of its own work "
            "per step vs 0.05 s (medians of the last 20 steps)");
  EXPECT_EQ(Status()["straggler"]["rank"], 1);
  EXPECT_EQ(Status()["straggler"]["pod"], "job-node-1");
  EXPECT_EQ(Status()["straggler"]["since"], "2024-05-01T10:01:00Z");
  EXPECT_FALSE(Status().contains("stall"));
  EXPECT_EQ(Phase(), "Running");
  ASSERT_EQ(Count("Straggler"), 1);
  EXPECT_EQ(cluster_.Events().back().type, EventType::kWarning);
  EXPECT_EQ(cluster_.Events().back().message, Condition("Straggler")["message"]);

  // Read again: no second event, the ratio follows.
  clock_.Advance(seconds(30));
  ReadStraggler(Straggler(1, 2.5));
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_THAT(Condition("Straggler")["message"].get<std::string>(), HasSubstr("2.50x"));
  EXPECT_EQ(Status()["straggler"]["since"], "2024-05-01T10:01:00Z");
  EXPECT_EQ(Count("Straggler"), 1);

  // A rank stalls: Stalled True beside the straggler.
  clock_.Advance(seconds(30));
  Read(AgentStall(40));
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Condition("Stalled")["reason"], "RankStalled");
  EXPECT_EQ(Condition("Straggler")["status"], "True");
  EXPECT_EQ(Status()["straggler"]["rank"], 1);
  EXPECT_EQ(Count("RankStalled"), 1);
  // The stall is over: Stalled False, the straggler stays, without another event.
  clock_.Advance(seconds(30));
  Read(nullptr);
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Condition("Stalled")["status"], "False");
  EXPECT_EQ(Condition("Stalled")["reason"], "Progressing");
  EXPECT_EQ(Condition("Straggler")["status"], "True");
  EXPECT_EQ(Count("Straggler"), 1);

  // It catches up.
  clock_.Advance(seconds(30));
  ReadStraggler(nullptr);
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Condition("Straggler")["status"], "False");
  EXPECT_EQ(Condition("Straggler")["reason"], "NoStraggler");
  EXPECT_FALSE(Status().contains("straggler"));

  // And falls behind again: a new event.
  clock_.Advance(seconds(30));
  ReadStraggler(Straggler(1, 2));
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Condition("Straggler")["reason"], "SlowerThanPeers");
  EXPECT_EQ(Count("Straggler"), 2);
}

TEST_F(ReconcilerStallTest, ANamedStragglerIsNotAnnouncedAgainAfterAnOperatorRestart) {
  StartRunning();
  clock_.Advance(seconds(30));
  Read(nullptr);
  ReadStraggler(Straggler(1, 2));
  ASSERT_TRUE(Reconcile().status.ok());
  ASSERT_EQ(Count("Straggler"), 1);
  // A new operator: a new reconciler and poller, the status as written.
  reconciler_ = std::make_unique<Reconciler>(&cluster_, &wall_, ReconcilerOptions{}, &stalls_);
  clock_.Advance(seconds(30));
  ReadStraggler(Straggler(1, 2.1));
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Condition("Straggler")["reason"], "SlowerThanPeers");
  EXPECT_EQ(Count("Straggler"), 1);
}

json StalledTermination(bool retryable) {
  return {{"rank", 1},
          {"localRank", 1},
          {"nodeRank", 0},
          {"exitCode", 137},
          {"signal", "SIGKILL"},
          {"reason", "Stalled"},
          {"message",
           "rank 1 (pod job-node-0) made no step for 5.1 s; median step 0.01 s; top "
           "frame: HangForever"},
          {"stack", "Thread 7 (rank 1):\n  #0 HangForever\n  #1 main\n"},
          {"retryable", retryable},
          {"restarts", 0}};
}

TEST_F(ReconcilerStallTest, StallPolicyFailFailsTheJobWithTheStack) {
  StartRunning(MakeJob("job", 2, /*max_restarts=*/3));
  cluster_.FailPod("job-node-0", 1, "Error", StalledTermination(false).dump());
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Failed") << "not retryable although restarts are left";
  const json last = Status()["lastFailure"];
  EXPECT_EQ(last["reason"], "Stalled");
  EXPECT_EQ(last["rank"], 1);
  EXPECT_EQ(last["retryable"], false);
  EXPECT_THAT(last["stack"].get<std::string>(), HasSubstr("HangForever"));
  EXPECT_EQ(Condition("Failed")["reason"], "NonRetryableFailure");
  EXPECT_THAT(Condition("Failed")["message"].get<std::string>(),
              HasSubstr("stallPolicy.action is Fail"));
  EXPECT_EQ(Condition("Stalled")["status"], "True");
  EXPECT_EQ(Condition("Stalled")["reason"], "RankStalled");
  EXPECT_EQ(Count("RankStalled"), 1);
}

TEST_F(ReconcilerStallTest, StallPolicyRestartRestartsTheGangAsARetryableFailure) {
  json job = MakeJob("job", 2, /*max_restarts=*/3);
  job["spec"]["restartPolicy"]["retryableExitCodes"] = {1};  // 137 would not be
  StartRunning(job);
  clock_.Advance(seconds(30));
  Read(AgentStall(5));
  ASSERT_TRUE(Reconcile().status.ok());
  ASSERT_EQ(Count("RankStalled"), 1);
  cluster_.FailPod("job-node-0", 137, "Error", StalledTermination(true).dump());
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Restarting");
  EXPECT_EQ(Status()["restarts"], 1);
  EXPECT_EQ(Status()["lastFailure"]["reason"], "Stalled");
  EXPECT_EQ(Status()["lastFailure"]["retryable"], true);
  EXPECT_EQ(Condition("Restarting")["reason"], "Stalled");
  EXPECT_EQ(Condition("Stalled")["status"], "False");
  EXPECT_EQ(Condition("Stalled")["reason"], "GangRestarted");
  EXPECT_FALSE(Status().contains("stall"));
  EXPECT_EQ(Count("RankStalled"), 1) << "the agents reported this stall already";
}

}  // namespace
}  // namespace spawnpoint::op
