// spec.scheduling on the operator's side (issue 40): what the pods carry for Volcano and Kueue,
// the Volcano PodGroup the builder makes (pod_group.h), and the reconciler's PodGroup steps
// (gang_scheduling.cc) on a fake cluster and simulated time.
#include "operator/reconciler/pod_group.h"

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
using ::testing::IsSupersetOf;
using testing::MakeJob;
using ::testing::Not;

constexpr const char* kUid = "0123456789abcdef";

json Owner(const std::string& name = "job") {
  return {{"metadata", {{"name", name}, {"namespace", "default"}, {"uid", kUid}}}};
}

// MakeJob with spec.scheduling and 1 GPU per node, as the API server would hand it over.
json GangJob(const json& scheduling, int nodes = 3, const std::string& mode = "Recreate") {
  json job = MakeJob("job", nodes, 3, 1, mode);
  job["spec"]["scheduling"] = scheduling;
  job["spec"]["gpusPerNode"] = 1;
  return job;
}

api::TrainingJob Parse(const json& object) {
  auto job = api::TrainingJobFromJson(object);
  EXPECT_TRUE(job.ok()) << job.status().message();
  return job.ok() ? *job : api::TrainingJob{};
}

TEST(PodGroupTest, VolcanoPodsNameTheirGroupAndTheScheduler) {
  api::TrainingJob job = Parse(GangJob({{"gang", "volcano"}, {"priorityClassName", "high"}}));
  for (int node = 0; node < 3; ++node) {
    json pod = BuildPod(job, Owner(), node, 0, PodSettings{});
    EXPECT_EQ(pod["spec"]["schedulerName"], "volcano");
    // Without it Volcano makes a group of one per pod: no gang.
    EXPECT_EQ(pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"], "job-01234567");
    EXPECT_EQ(pod["spec"]["priorityClassName"], "high");
    EXPECT_FALSE(pod["metadata"]["labels"].contains("kueue.x-k8s.io/queue-name"));
  }
}

TEST(PodGroupTest, TheGroupAsksForTheWholeGangOwnedByTheJob) {
  json object = GangJob({{"gang", "volcano"}, {"priorityClassName", "high"}});
  // The trainer asks 1.5 CPUs and 2Gi; a sidecar gives only a CPU limit (its request).
  json& containers = object["spec"]["template"]["spec"]["containers"];
  containers[0]["resources"] = {{"requests", {{"cpu", "1.5"}, {"memory", "2Gi"}}}};
  containers.push_back({{"name", "sidecar"},
                        {"image", "sidecar:1"},
                        {"resources", {{"limits", {{"cpu", "500m"}}}}}});
  api::TrainingJob job = Parse(object);
  json group = BuildPodGroup(job, Owner(), PodSettings{});
  EXPECT_EQ(group["apiVersion"], "scheduling.volcano.sh/v1beta1");
  EXPECT_EQ(group["kind"], "PodGroup");
  EXPECT_EQ(group["metadata"]["name"], "job-01234567");
  EXPECT_EQ(group["metadata"]["namespace"], "default");
  EXPECT_EQ(group["metadata"]["ownerReferences"], json::array({ControllerReference(Owner())}));
  EXPECT_EQ(group["metadata"]["ownerReferences"][0]["controller"], true);
  EXPECT_EQ(group["spec"]["minMember"], 3);
  EXPECT_EQ(group["spec"]["queue"], "default");
  EXPECT_EQ(group["spec"]["priorityClassName"], "high");
  // 3 pods of: 1 GPU (gpusPerNode), 1.5 + 0.5 CPU, 2Gi; the agent's init container (10m,
  // 16Mi) asks less than the containers together, so it adds nothing.
  EXPECT_EQ(group["spec"]["minResources"],
            json({{"nvidia.com/gpu", "3"}, {"cpu", "6"}, {"memory", std::to_string(6LL << 30)}}));
}

TEST(PodGroupTest, PodRequestsTakeTheLargerOfContainersAndAnInitContainer) {
  json pod = {
      {"spec",
       {{"containers", json::array({{{"resources", {{"requests", {{"cpu", "0.25"}}}}}},
                                    {{"resources", {{"requests", {{"cpu", "250m"}}}}}}})},
        {"initContainers", json::array({{{"resources",
                                          {{"requests", {{"cpu", "100m"}, {"memory", "1Gi"}}},
                                           {"limits", {{"amd.com/gpu", 2}}}}}}})}}}};
  EXPECT_EQ(PodRequests(pod),
            json({{"cpu", "500m"}, {"memory", "1073741824"}, {"amd.com/gpu", "2"}}));
}

TEST(PodGroupTest, KueuePodsAreOneGroupOfTheQueue) {
  api::TrainingJob job = Parse(GangJob({{"gang", "kueue"}, {"queue", "team-a"}}));
  for (int node = 0; node < 3; ++node) {
    json pod = BuildPod(job, Owner(), node, 0, PodSettings{});
    EXPECT_EQ(pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "team-a");
    EXPECT_EQ(pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"], "job-01234567");
    EXPECT_EQ(pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"], "3");
    EXPECT_FALSE(pod["spec"].contains("schedulerName"));
  }
  // The label on the job alone, as Kueue users write it.
  json labelled = MakeJob("job", 2);
  labelled["metadata"]["labels"] = {{"kueue.x-k8s.io/queue-name", "team-b"}};
  json pod = BuildPod(Parse(labelled), Owner(), 0, 0, PodSettings{});
  EXPECT_EQ(pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "team-b");
  EXPECT_EQ(pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"], "2");
}

TEST(PodGroupTest, WithoutAGangSchedulerThePodsAreKubeSchedulers) {
  json pod = BuildPod(Parse(MakeJob("job", 2)), Owner(), 0, 0, PodSettings{});
  EXPECT_FALSE(pod["spec"].contains("schedulerName"));
  EXPECT_FALSE(pod["spec"].contains("priorityClassName"));
  EXPECT_FALSE(pod["metadata"].contains("annotations"));
  json prioritised = MakeJob("job", 2);
  prioritised["spec"]["scheduling"] = {{"priorityClassName", "low"}};
  EXPECT_EQ(BuildPod(Parse(prioritised), Owner(), 0, 0, PodSettings{})["spec"]["priorityClassName"],
            "low");
}

class GangSchedulingTest : public ::testing::Test {
 protected:
  GangSchedulingTest()
      : wall_(&clock_, WallTime(seconds(1'714'557'600))),
        cluster_(&wall_),
        reconciler_(&cluster_, &wall_, ReconcilerOptions{}) {}

  ReconcileResult Reconcile() { return reconciler_.Reconcile("default", "job", Logger()); }
  std::string Phase() { return (*cluster_.Job("job"))["status"].value("phase", ""); }
  std::string GroupName() { return GangGroupName("job", UidOf(*cluster_.Job("job"))); }
  void AllPods(const std::string& phase, int nodes = 3) {
    for (int i = 0; i < nodes; ++i) cluster_.SetPodPhase(PodName("job", i), phase);
  }
  std::vector<std::string> GroupWrites() {
    std::vector<std::string> out;
    for (const auto& w : cluster_.Writes()) {
      if (w.find("podgroup") != std::string::npos) out.push_back(w);
    }
    return out;
  }

  SimulatedClock clock_;
  WallClock wall_;
  FakeCluster cluster_;
  Reconciler reconciler_;
};

TEST_F(GangSchedulingTest, ThePodGroupIsMadeBeforeAnyPod) {
  cluster_.AddJob(GangJob({{"gang", "volcano"}, {"queue", "research"}}));
  ASSERT_TRUE(Reconcile().status.ok());
  const std::string group = GroupName();
  EXPECT_THAT(cluster_.Writes(),
              ElementsAre("create-service job", "create-podgroup " + group, "create-pod job-node-0",
                          "create-pod job-node-1", "create-pod job-node-2", "update-status job"));
  ASSERT_NE(cluster_.PodGroup(group), nullptr);
  EXPECT_EQ((*cluster_.PodGroup(group))["spec"]["minMember"], 3);
  EXPECT_EQ((*cluster_.PodGroup(group))["spec"]["queue"], "research");
  EXPECT_EQ((*cluster_.Pod("job-node-2"))["metadata"]["annotations"][kVolcanoGroupAnnotation],
            group);
}

TEST_F(GangSchedulingTest, NoPodBeforeItsGroupExists) {
  cluster_.AddJob(GangJob({{"gang", "volcano"}}));
  cluster_.FailNext("create-podgroup", Status(StatusCode::kUnavailable, "etcd is slow"));
  ReconcileResult r = Reconcile();
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(cluster_.PodNames().empty()) << "a pod without its group is scheduled alone";
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(cluster_.PodNames().size(), 3u);
  EXPECT_NE(cluster_.PodGroup(GroupName()), nullptr);
}

TEST_F(GangSchedulingTest, AGroupThatIsThereAlreadyIsTakenAsIs) {
  cluster_.AddJob(GangJob({{"gang", "volcano"}}));
  cluster_.FailNext("create-podgroup", Status(StatusCode::kAlreadyExists, "exists"));
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(cluster_.PodNames().size(), 3u);
}

TEST_F(GangSchedulingTest, AGangRestartKeepsTheGroupWhole) {
  cluster_.AddJob(GangJob({{"gang", "volcano"}}));
  ASSERT_TRUE(Reconcile().status.ok());
  AllPods("Running");
  ASSERT_TRUE(Reconcile().status.ok());
  ASSERT_EQ(Phase(), "Running");
  ASSERT_NE(cluster_.PodGroup(GroupName()), nullptr);
  const json before = *cluster_.PodGroup(GroupName());
  cluster_.ClearWrites();

  cluster_.FailPod("job-node-1", 137, "OOMKilled");
  ASSERT_TRUE(Reconcile().status.ok());  // records the restart
  ASSERT_TRUE(Reconcile().status.ok());  // deletes the stale gang
  ASSERT_TRUE(Reconcile().status.ok());  // creates the next one
  ASSERT_EQ(cluster_.PodNames().size(), 3u);
  EXPECT_EQ((*cluster_.Pod("job-node-0"))["metadata"]["labels"][kAttemptLabel], "1");
  // The same group, untouched: the new gang joins it and Volcano binds it whole again.
  EXPECT_THAT(GroupWrites(), ::testing::IsEmpty());
  ASSERT_NE(cluster_.PodGroup(GroupName()), nullptr);
  EXPECT_EQ(*cluster_.PodGroup(GroupName()), before);
  for (int node = 0; node < 3; ++node) {
    EXPECT_EQ(
        (*cluster_.Pod(PodName("job", node)))["metadata"]["annotations"][kVolcanoGroupAnnotation],
        GroupName());
  }
}

TEST_F(GangSchedulingTest, ALostPodRejoinsTheGroupInPlace) {
  cluster_.AddJob(GangJob({{"gang", "volcano"}}, 3, "InPlace"));
  ASSERT_TRUE(Reconcile().status.ok());
  AllPods("Running");
  ASSERT_TRUE(Reconcile().status.ok());
  ASSERT_EQ(Phase(), "Running");
  cluster_.ClearWrites();
  cluster_.RemovePod("job-node-2");
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_THAT(cluster_.Writes(), Contains("create-pod job-node-2"));
  EXPECT_THAT(GroupWrites(), ::testing::IsEmpty());
  ASSERT_NE(cluster_.PodGroup(GroupName()), nullptr);
  EXPECT_EQ((*cluster_.PodGroup(GroupName()))["spec"]["minMember"], 3);
  EXPECT_EQ((*cluster_.Pod("job-node-2"))["metadata"]["annotations"][kVolcanoGroupAnnotation],
            GroupName());
}

TEST_F(GangSchedulingTest, TheGroupGoesWhenTheJobSucceeds) {
  cluster_.AddJob(GangJob({{"gang", "volcano"}}));
  ASSERT_TRUE(Reconcile().status.ok());
  AllPods("Succeeded");
  // The delete fails once: the status is not written, and the next reconcile does both.
  cluster_.FailNext("delete-podgroup", Status(StatusCode::kUnavailable, "try again"));
  EXPECT_EQ(Reconcile().status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(Phase(), "Pending");
  EXPECT_NE(cluster_.PodGroup(GroupName()), nullptr);
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Succeeded");
  EXPECT_EQ(cluster_.PodGroup(GroupName()), nullptr);
  cluster_.ClearWrites();
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_THAT(GroupWrites(), ::testing::IsEmpty()) << "deleted once, on the transition";
}

TEST_F(GangSchedulingTest, SuspendReleasesTheGroupAndResumeMakesItAgain) {
  cluster_.AddJob(GangJob({{"gang", "volcano"}}));
  ASSERT_TRUE(Reconcile().status.ok());
  const std::string group = GroupName();
  cluster_.UpdateSpec("job", [](json& spec) { spec["runPolicy"]["suspend"] = true; });
  cluster_.ClearWrites();
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Suspended");
  EXPECT_THAT(GroupWrites(), ElementsAre("delete-podgroup " + group));
  cluster_.UpdateSpec("job", [](json& spec) { spec["runPolicy"]["suspend"] = false; });
  cluster_.FinishDeletions();
  cluster_.ClearWrites();
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_THAT(cluster_.Writes(), IsSupersetOf(std::vector<std::string>{"create-podgroup " + group,
                                                                       "create-pod job-node-0"}));
}

TEST_F(GangSchedulingTest, WithoutVolcanoThereIsNoGroup) {
  cluster_.AddJob(GangJob({{"gang", "kueue"}, {"queue", "team-a"}}));
  ASSERT_TRUE(Reconcile().status.ok());
  AllPods("Succeeded");
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_EQ(Phase(), "Succeeded");
  EXPECT_THAT(GroupWrites(), ::testing::IsEmpty());
  EXPECT_THAT(cluster_.Writes(), Not(Contains("create-podgroup job-01234567")));
}

}  // namespace
}  // namespace spawnpoint::op
