// The reconciler of a job whose agents restart their gang in place (restartPolicy.mode
// InPlace, 2 nodes), on a fake cluster, simulated time and a gang reading set by the test:
// the Secret before the pods, in-place restarts mirrored into status with the pods kept, a
// lost pod recreated alone, and the agents' verdicts ending the job or recreating the gang.
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
using ::testing::Contains;
using ::testing::ElementsAre;
using testing::FakeCluster;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::MakeJob;
using ::testing::Not;

class FakeGang : public GangSource {
 public:
  std::optional<GangReading> LatestGang(const std::string&, const std::string&) override {
    return reading;
  }
  std::optional<GangReading> reading;
};

json KilledOnNode1(const std::string& failed_at) {
  return {{"rank", 1},           {"localRank", 0},        {"nodeRank", 1},
          {"exitCode", 137},     {"signal", "SIGKILL"},   {"reason", "Killed"},
          {"message", "killed"}, {"failedAt", failed_at}, {"time", failed_at}};
}

class InPlaceTest : public ::testing::Test {
 protected:
  InPlaceTest()
      : wall_(&clock_, WallTime(std::chrono::seconds(1'714'557'600))),  // 2024-05-01T10:00:00Z
        cluster_(&wall_) {
    ReconcilerOptions options;
    options.gang = &gang_;
    options.new_gang_token = []() -> StatusOr<std::string> { return std::string("token"); };
    reconciler_ = std::make_unique<Reconciler>(&cluster_, &wall_, std::move(options), nullptr);
  }

  ReconcileResult Reconcile() { return reconciler_->Reconcile("default", "job", Logger()); }
  json Status() { return (*cluster_.Job("job"))["status"]; }
  std::string Phase() { return Status().value("phase", ""); }
  json Condition(const std::string& type) {
    for (const auto& c : Status().value("conditions", json::array())) {
      if (c["type"] == type) return c;
    }
    return json();
  }
  std::vector<std::string> EventReasons() {
    std::vector<std::string> out;
    for (const auto& e : cluster_.Events()) out.push_back(e.reason);
    return out;
  }
  std::string Uid(int node) { return UidOf(*cluster_.Pod(PodName("job", node))); }
  void Read(int restarts, const std::string& phase, json last_failure = json()) {
    gang_.reading = GangReading{restarts, phase, std::move(last_failure), "job-node-0",
                                FormatTime(wall_.Now(), /*millis=*/true)};
  }
  // A new in-place job until its gang is Running.
  void StartRunning(int max_restarts = 3) {
    cluster_.AddJob(MakeJob("job", 2, max_restarts, 1, "InPlace"));
    ASSERT_TRUE(Reconcile().status.ok());
    for (int i = 0; i < 2; ++i) cluster_.SetPodPhase(PodName("job", i), "Running");
    Read(0, "Running");
    ASSERT_TRUE(Reconcile().status.ok());
    ASSERT_EQ(Phase(), "Running");
    cluster_.ClearWrites();
  }

  SimulatedClock clock_;
  WallClock wall_;
  FakeCluster cluster_;
  FakeGang gang_;
  std::unique_ptr<Reconciler> reconciler_;
};

TEST_F(InPlaceTest, TheGangSecretIsCreatedBeforeThePods) {
  json job = cluster_.AddJob(MakeJob("job", 2, 3, 1, "InPlace"));
  ASSERT_TRUE(Reconcile().status.ok());
  const std::string secret = JobSecretName("job", UidOf(job));
  EXPECT_THAT(cluster_.Writes(),
              ElementsAre("create-service job", "create-secret " + secret, "create-pod job-node-0",
                          "create-pod job-node-1", "update-status job"));
  EXPECT_EQ((*cluster_.Secret(secret))["stringData"]["gang"], "token");
  EXPECT_EQ(Status()["gangAttempt"], 0);
}

TEST_F(InPlaceTest, NoPodIsCreatedWhenTheSecretCannotBe) {
  cluster_.AddJob(MakeJob("job", 2, 3, 1, "InPlace"));
  cluster_.FailNext("create-secret", spawnpoint::Status(StatusCode::kUnavailable, "etcd"));
  EXPECT_EQ(Reconcile().status.code(), StatusCode::kUnavailable);
  EXPECT_THAT(cluster_.PodNames(), IsEmpty());
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_THAT(cluster_.PodNames(), ElementsAre("job-node-0", "job-node-1"));
}

// The agents restarted the gang: status says so as a recreated gang would, the pods stay,
// and the phase is written Restarting before a later reconcile calls the gang running.
TEST_F(InPlaceTest, AnInPlaceRestartIsMirroredAndThePodsStay) {
  StartRunning();
  const std::string uid0 = Uid(0), uid1 = Uid(1);
  Read(1, "Running", KilledOnNode1("2024-05-01T10:00:00.500Z"));
  ReconcileResult r = Reconcile();
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(Phase(), "Restarting");
  EXPECT_EQ(Status()["restarts"], 1);
  EXPECT_EQ(Status()["gangAttempt"], 0);
  const json last = Status()["lastFailure"];
  EXPECT_EQ(last["node"], 1);
  EXPECT_EQ(last["pod"], "job-node-1");
  EXPECT_EQ(last["rank"], 1);
  EXPECT_EQ(last["reason"], "Killed");
  EXPECT_EQ(last["attempt"], 0);
  EXPECT_EQ(last["inPlace"], true);
  EXPECT_EQ(Condition("Restarting")["status"], "True");
  EXPECT_EQ(Condition("Restarting")["reason"], "Killed");
  EXPECT_THAT(Condition("Restarting")["message"].get<std::string>(),
              HasSubstr("restart 1 of 3 in place"));
  EXPECT_EQ(Condition("Running")["status"], "False");
  EXPECT_THAT(EventReasons(), ElementsAre("Created", "NodeFailed", "Restarting"));
  ASSERT_TRUE(r.requeue_after.has_value());
  EXPECT_LE(*r.requeue_after, seconds(1));

  ASSERT_TRUE(Reconcile().status.ok());  // the same reading: now the gang runs again
  EXPECT_EQ(Phase(), "Running");
  EXPECT_EQ(Condition("Restarting")["status"], "False");
  EXPECT_THAT(EventReasons(), ElementsAre("Created", "NodeFailed", "Restarting", "Restarted"));
  for (const auto& w : cluster_.Writes()) EXPECT_THAT(w, HasSubstr("update-status")) << w;
  EXPECT_EQ(Uid(0), uid0);
  EXPECT_EQ(Uid(1), uid1);
  EXPECT_EQ(LabelOf(*cluster_.Pod("job-node-1"), kAttemptLabel), "0");

  ASSERT_TRUE(Reconcile().status.ok());  // nothing new: nothing recorded twice
  EXPECT_EQ(Status()["restarts"], 1);
  EXPECT_EQ(cluster_.Events().size(), 4u);
}

TEST_F(InPlaceTest, RestartsMadeBetweenTwoReadingsAreEachAnEvent) {
  StartRunning();
  Read(2, "Running", KilledOnNode1("2024-05-01T10:00:00.500Z"));
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Status()["restarts"], 2);
  EXPECT_THAT(EventReasons(), ElementsAre("Created", "NodeFailed", "Restarting", "Restarting"));
  EXPECT_THAT(cluster_.Events().back().message, HasSubstr("restart 2 of 3 in place"));
}

TEST_F(InPlaceTest, AGangStillRestartingIsNotCalledRunning) {
  StartRunning();
  Read(1, "Restarting", KilledOnNode1("2024-05-01T10:00:00.500Z"));
  ASSERT_TRUE(Reconcile().status.ok());
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Restarting");
  EXPECT_THAT(EventReasons(), Not(Contains("Restarted")));
}

// An evicted pod is deleted and, once gone, created again alone under its index.
TEST_F(InPlaceTest, AnEvictedPodIsRecreatedAloneUnderItsIndex) {
  StartRunning();
  const std::string uid0 = Uid(0);
  json& pod = *cluster_.Pod("job-node-1");
  pod["status"]["phase"] = "Failed";
  pod["status"]["reason"] = "Evicted";
  pod["status"]["message"] = "The node was low on resource: memory.";
  cluster_.SetGracefulDeletion(true);
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_THAT(cluster_.Writes(), ElementsAre("delete-pod job-node-1", "update-status job"));
  EXPECT_EQ(Phase(), "Restarting");
  EXPECT_EQ(Status()["lastFailure"]["reason"], "Evicted");
  EXPECT_EQ(Status()["lastFailure"]["lost"], true);
  EXPECT_EQ(Status()["restarts"], 0) << "the agents count the restart";
  ASSERT_TRUE(Reconcile().status.ok());  // still terminating: never a second pod beside it
  EXPECT_THAT(cluster_.PodNames(), ElementsAre("job-node-0", "job-node-1"));
  cluster_.FinishDeletions();
  cluster_.ClearWrites();
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_THAT(cluster_.Writes(), Contains("create-pod job-node-1"));
  EXPECT_THAT(cluster_.Writes(), Not(Contains("create-pod job-node-0")));
  EXPECT_EQ(Uid(0), uid0);
  const std::vector<std::string> reasons = EventReasons();
  EXPECT_EQ(std::count(reasons.begin(), reasons.end(), "NodeFailed"), 1);

  // The agents restart once the new pod's agent joined (it counts the loss).
  cluster_.SetPodPhase("job-node-1", "Running");
  json lost = KilledOnNode1("2024-05-01T10:00:01.000Z");
  Read(1, "Running", lost);
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Status()["restarts"], 1);
  EXPECT_EQ(Phase(), "Restarting");
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Running");
}

// The coordinator's pod vanished: it comes back alone; the restart its replacement's gang
// makes is put down to the loss, as no agent reports a failure of its own.
TEST_F(InPlaceTest, TheCoordinatorsPodGoneIsRecreatedAndItsLossExplainsTheRestart) {
  StartRunning();
  const std::string uid1 = Uid(1);
  cluster_.RemovePod("job-node-0");
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_THAT(cluster_.Writes(), ElementsAre("create-pod job-node-0", "update-status job"));
  EXPECT_EQ(Status()["lastFailure"]["node"], 0);
  EXPECT_EQ(Status()["lastFailure"]["reason"], "NodeLost");
  EXPECT_EQ(Phase(), "Restarting");
  EXPECT_EQ(Uid(1), uid1);
  cluster_.SetPodPhase("job-node-0", "Running");
  Read(0, "Running");  // the old reading: it must not call the gang running again
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Restarting");
  Read(1, "Running");  // the new coordinator's document: no failure of its own
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Status()["restarts"], 1);
  EXPECT_EQ(Status()["lastFailure"]["node"], 0);
  EXPECT_EQ(Status()["lastFailure"]["reason"], "NodeLost");
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Running");
}

// `kubectl delete pod` of node 1 seen while the pod terminates: the loss is recorded then
// (PodDeleted, lost), and stays the explanation once the pod is gone, replaced, and the agents
// restarted. Before, the job read Pending while the pod terminated, the replacement came back
// unexplained and the restart was put on node 0's coordinator (seen on the real Volcano gang).
TEST_F(InPlaceTest, ADeletedPodIsRecordedAsItTerminates) {
  StartRunning();
  cluster_.SetGracefulDeletion(true);
  ASSERT_TRUE(cluster_.DeletePod("default", "job-node-1", Uid(1)).ok());
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Restarting");
  EXPECT_EQ(Status()["lastFailure"]["node"], 1);
  EXPECT_EQ(Status()["lastFailure"]["reason"], "PodDeleted");
  EXPECT_EQ(Status()["lastFailure"]["lost"], true);
  cluster_.FinishDeletions();
  ASSERT_TRUE(Reconcile().status.ok());
  ASSERT_NE(cluster_.Pod("job-node-1"), nullptr) << "recreated alone";
  cluster_.SetPodPhase("job-node-1", "Running");
  Read(1, "Running");  // the agents restarted; no failure report of their own
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Status()["restarts"], 1);
  EXPECT_EQ(Status()["lastFailure"]["node"], 1);
  EXPECT_EQ(Status()["lastFailure"]["reason"], "PodDeleted");
  // One loss, one NodeFailed event naming one cause.
  const std::vector<std::string> reasons = EventReasons();
  EXPECT_EQ(std::count(reasons.begin(), reasons.end(), "NodeFailed"), 1)
      << ::testing::PrintToString(reasons);
}

// `kubectl delete pod` of node 1: its agent leaves without a report and the agents restart
// before the pod is gone. The restart is explained by that pod, not by node 0's coordinator.
TEST_F(InPlaceTest, ARestartAfterAPodsDeletionNamesThatPod) {
  StartRunning();
  cluster_.SetGracefulDeletion(true);
  ASSERT_TRUE(cluster_.DeletePod("default", "job-node-1", Uid(1)).ok());
  Read(1, "Restarting");  // no failure of its own: the lost agent said nothing
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Status()["restarts"], 1);
  EXPECT_EQ(Status()["lastFailure"]["node"], 1);
  EXPECT_EQ(Status()["lastFailure"]["pod"], "job-node-1");
  EXPECT_EQ(Status()["lastFailure"]["reason"], "NodeLost");
  EXPECT_THAT(Status()["lastFailure"]["message"].get<std::string>(), HasSubstr("deleted"));
}

// The agents restarted for a lost agent before the operator saw its pod fail: the loss is
// recorded at the new attempt, so only a reading taken kLossSettle after it calls the gang
// running again. The readings change no more once it runs (nothing enqueues the job): the
// reconciler must look again itself. Found by the chaos run (tests/chaos): a job whose agent
// was SIGTERMed stayed Restarting for the whole of its next attempt, until it Succeeded.
TEST_F(InPlaceTest, ALossRecordedAfterTheRestartIsLookedAtAgainOnceItSettled) {
  StartRunning();
  Read(1, "Running", KilledOnNode1("2024-05-01T10:00:00.000Z"));
  ASSERT_TRUE(Reconcile().status.ok());
  ASSERT_TRUE(Reconcile().status.ok());
  ASSERT_EQ(Phase(), "Running");
  ASSERT_EQ(Status()["restarts"], 1);
  cluster_.FailPod("job-node-1", 143);  // the lost agent's pod, seen failed only now
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Status()["lastFailure"]["lost"], true);
  EXPECT_EQ(Status()["lastFailure"]["attempt"], 1);
  EXPECT_EQ(Phase(), "Restarting");
  if (cluster_.Pod("job-node-1") == nullptr) {
    ASSERT_TRUE(Reconcile().status.ok());
  }
  ASSERT_NE(cluster_.Pod("job-node-1"), nullptr) << "recreated alone";
  cluster_.SetPodPhase("job-node-1", "Running");
  clock_.Advance(std::chrono::milliseconds(500));
  Read(1, "Running");  // the gang runs again; every reading from now on is this one
  ReconcileResult r = Reconcile();
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(Phase(), "Restarting") << "too soon after the loss to tell";
  ASSERT_TRUE(r.requeue_after.has_value()) << "nothing else reconciles the job again";
  EXPECT_LE(*r.requeue_after, seconds(2));
  clock_.Advance(*r.requeue_after);
  Read(1, "Running");  // the same reading, taken again
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Running");
  EXPECT_EQ(Status()["restarts"], 1);
}

std::string Verdict(const std::string& verdict, int restarts) {
  json m = KilledOnNode1("2024-05-01T10:00:02.000Z");
  m["restarts"] = restarts;
  m["verdict"] = verdict;
  m["verdictMessage"] = verdict == "NodeLost" ? "a node did not rejoin" : "maxRestarts 2 reached";
  m["retryable"] = true;
  return m.dump();
}

// The agents gave up with their budget spent: the job fails with their count, even if the
// operator had not read their last restart.
TEST_F(InPlaceTest, TheAgentsVerdictFailsTheJobWithTheirCount) {
  StartRunning(/*max_restarts=*/2);
  Read(1, "Running", KilledOnNode1("2024-05-01T10:00:00.500Z"));
  ASSERT_TRUE(Reconcile().status.ok());
  for (int node : {0, 1}) {
    cluster_.FailPod(PodName("job", node), 1, "Error", Verdict("MaxRestartsReached", 2));
  }
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Failed");
  EXPECT_EQ(Status()["restarts"], 2);
  EXPECT_EQ(Condition("Failed")["reason"], "MaxRestartsReached");
  EXPECT_EQ(Status()["lastFailure"]["node"], 1);
  EXPECT_EQ(Status()["lastFailure"]["rank"], 1);
  EXPECT_EQ(Status()["lastFailure"]["reason"], "Killed");
  // The restart it had not read is an event too: one per restart.
  const std::vector<std::string> reasons = EventReasons();
  EXPECT_EQ(std::count(reasons.begin(), reasons.end(), "Restarting"), 2)
      << ::testing::PrintToString(reasons);
}

// A node never rejoined: the gang is recreated as in Recreate mode, a new gang of pods.
TEST_F(InPlaceTest, ANodeLostVerdictRecreatesTheGang) {
  StartRunning();
  cluster_.FailPod("job-node-0", 1, "Error", Verdict("NodeLost", 1));
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Restarting");
  EXPECT_EQ(Status()["restarts"], 2);
  EXPECT_EQ(Status()["gangAttempt"], 2);
  ASSERT_TRUE(Reconcile().status.ok());  // the old gang is stale
  EXPECT_THAT(cluster_.Writes(), Contains("delete-pod job-node-0"));
  EXPECT_THAT(cluster_.Writes(), Contains("delete-pod job-node-1"));
  clock_.Advance(seconds(60));
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(LabelOf(*cluster_.Pod("job-node-0"), kAttemptLabel), "2");
  EXPECT_EQ(LabelOf(*cluster_.Pod("job-node-1"), kAttemptLabel), "2");
}

// The gang never started (node 1's pod cannot be scheduled): node 0's agent gives up with
// GangStartTimeout, its own exit code 1 and no signal; the operator names the pod that never
// ran and why, and recreates the gang. Never "exit 137 (Killed)".
TEST_F(InPlaceTest, AGangThatNeverStartedNamesThePodsThatDidNotRun) {
  cluster_.AddJob(MakeJob("job", 2, 3, 1, "InPlace"));
  ASSERT_TRUE(Reconcile().status.ok());
  json& pending = *cluster_.Pod("job-node-1");
  pending["status"]["phase"] = "Pending";
  pending["status"]["conditions"] =
      json::array({{{"type", "PodScheduled"},
                    {"status", "False"},
                    {"reason", "Unschedulable"},
                    {"message", "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."}}});
  // What the agent writes (agent/run/node_agent_gang.cc given_up, tests/agent/gang_agents_test).
  const std::string why =
      "the gang did not start within 120 s: not every node's agent reached its barrier";
  json m = {{"rank", -1},
            {"localRank", -1},
            {"nodeRank", 0},
            {"exitCode", 1},
            {"reason", "GangStartTimeout"},
            {"message", why},
            {"retryable", true},
            {"verdict", "GangStartTimeout"},
            {"verdictMessage", why},
            {"restarts", 0}};
  cluster_.FailPod("job-node-0", 1, "Error", m.dump());
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Restarting");
  EXPECT_EQ(Status()["restarts"], 1);
  const json last = Status()["lastFailure"];
  EXPECT_EQ(last["reason"], "GangStartTimeout") << last.dump();
  EXPECT_EQ(last["exitCode"], 1) << last.dump();
  EXPECT_TRUE(!last.contains("signal") || last["signal"].is_null()) << last.dump();
  EXPECT_EQ(last["message"],
            why +
                "; not running: job-node-1 (Pending: 0/2 nodes are available: 2 Insufficient "
                "nvidia.com/gpu.)");
  for (const auto& e : cluster_.Events()) {
    EXPECT_EQ(e.message.find("137"), std::string::npos) << e.message;
    EXPECT_EQ(e.message.find("Killed"), std::string::npos) << e.message;
  }
  EXPECT_THAT(Condition("Restarting")["message"].get<std::string>(),
              HasSubstr("not running: job-node-1 (Pending"));
}

// An agent that could not run at all (exit 2, no verdict) fails the job: recreating its pod
// would fail again.
TEST_F(InPlaceTest, AnAgentThatCannotRunFailsTheJob) {
  StartRunning();
  cluster_.FailPod("job-node-1", 2, "Error", "--gang-token-file: cannot read the job's gang token");
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Failed");
  EXPECT_EQ(Condition("Failed")["reason"], "NonRetryableFailure");
}

}  // namespace
}  // namespace spawnpoint::op
