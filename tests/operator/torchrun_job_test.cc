// The operator on a job whose command starts torchrun: the pod count follows what the
// command says when spec.nodes is unset, each pod's agent reads the same job, and a
// contradiction marks the job InvalidSpec with the element's field path, no pods made.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "api/training_job.h"
#include "operator/common/names.h"
#include "operator/reconciler/children.h"
#include "operator/reconciler/reconciler.h"
#include "tests/operator/fake_cluster.h"
#include "tests/operator/test_jobs.h"

namespace spawnpoint::op {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using testing::FakeCluster;
using ::testing::HasSubstr;
using testing::MakeJob;

json TorchrunJob(bool with_nodes) {
  json job = MakeJob("job");
  if (!with_nodes) job["spec"].erase("nodes");
  job["spec"].erase("procsPerNode");
  json& trainer = job["spec"]["template"]["spec"]["containers"][0];
  trainer["command"] = {"torchrun", "--nnodes=3", "--nproc-per-node", "2"};
  trainer["args"] = {"train.py", "--epochs", "3"};
  return job;
}

std::string EnvValue(const json& container, const std::string& name) {
  for (const auto& e : container["env"]) {
    if (e["name"] == name) return e.value("value", "");
  }
  return "";
}

class TorchrunJobTest : public ::testing::Test {
 protected:
  TorchrunJobTest()
      : wall_(&clock_, WallTime(std::chrono::seconds(1'714'557'600))),
        cluster_(&wall_),
        reconciler_(&cluster_, &wall_, ReconcilerOptions{}, nullptr) {}

  SimulatedClock clock_;
  WallClock wall_;
  FakeCluster cluster_;
  Reconciler reconciler_;
};

TEST_F(TorchrunJobTest, NnodesAndNprocPerNodeMakeTheGangWhenTheSpecLeavesThemUnset) {
  cluster_.AddJob(TorchrunJob(/*with_nodes=*/false));
  ASSERT_TRUE(reconciler_.Reconcile("default", "job", Logger()).status.ok());
  EXPECT_THAT(cluster_.PodNames(), ElementsAre("job-node-0", "job-node-1", "job-node-2"));
  json status = (*cluster_.Job("job"))["status"];
  EXPECT_EQ(status["worldSize"], 6);

  // The agent in each pod reads the job from SPAWNPOINT_JOB: the same ranks, no torchrun.
  json* pod = cluster_.Pod("job-node-1");
  ASSERT_NE(pod, nullptr);
  const json& container = (*pod)["spec"]["containers"][0];
  EXPECT_EQ(EnvValue(container, "WORLD_SIZE"), "6");
  auto jobs = api::ParseTrainingJobs(EnvValue(container, kJobEnv), "$SPAWNPOINT_JOB");
  ASSERT_TRUE(jobs.ok()) << jobs.status().message();
  const api::TrainingJobSpec& spec = jobs->front().spec;
  EXPECT_EQ(spec.nodes, 3);
  EXPECT_EQ(api::RanksPerNode(spec), 2);
  EXPECT_THAT(spec.trainer.command, ElementsAre("python3", "-u", "train.py", "--epochs", "3"));
  ASSERT_TRUE(spec.trainer.torchrun.has_value());
}

TEST_F(TorchrunJobTest, AContradictingNnodesIsInvalidSpec) {
  cluster_.AddJob(TorchrunJob(/*with_nodes=*/true));  // nodes: 2
  ASSERT_TRUE(reconciler_.Reconcile("default", "job", Logger()).status.ok());
  json status = (*cluster_.Job("job"))["status"];
  EXPECT_EQ(status["phase"], "Failed");
  std::string message;
  for (const auto& c : status["conditions"]) {
    if (c["type"] == "Failed") {
      EXPECT_EQ(c["reason"], "InvalidSpec");
      message = c["message"];
    }
  }
  EXPECT_THAT(message, HasSubstr("spec.template.spec.containers[0].command[1]: torchrun's "
                                 "--nnodes=3 contradicts spec.nodes: 2"));
  EXPECT_TRUE(cluster_.PodNames().empty());
}

}  // namespace
}  // namespace spawnpoint::op
