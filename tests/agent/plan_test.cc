// The node plan on the production discovery path: NVML through dlopen of the fake
// libnvidia-ml, NUMA and CPUs from a fake sysfs tree.
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "agent/devices/gpu_backend.h"
#include "agent/loader/contract.h"
#include "agent/plan/node_plan.h"
#include "agent/run/rank_changes.h"
#include "tests/fakes/fake_sysfs.h"
#include "tests/support/python_probe.h"
#include "tests/support/test_process.h"

namespace spawnpoint::agent {
namespace {

using std::chrono::milliseconds;
using ::testing::AllOf;
using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::Ge;
using ::testing::HasSubstr;
using ::testing::Le;
using ::testing::Not;

const char* kUuidPrefix = "GPU-6b7c1a2e-0000-4000-8000-0000000000";

std::string GpuJob(int gpus, const std::string& assignment) {
  return "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: gpu-job}\n"
         "spec:\n  nodes: 2\n  gpusPerNode: " +
         std::to_string(gpus) + "\n  gpuAssignment: " + assignment +
         "\n  template:\n    spec:\n      containers:\n      - name: trainer\n        image: x\n"
         "        command: [/bin/true]\n        args: [--epochs, '1']\n"
         "        env: [{name: NCCL_DEBUG, value: INFO}]\n";
}

class PlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sysfs_.AddEightGpuTwoNumaTopology();
    setenv("FAKE_NVML_CONFIG", testing::FakeNvmlConfig("eight_gpus_two_numa.conf").c_str(), 1);
  }
  void TearDown() override { unsetenv("FAKE_NVML_CONFIG"); }

  NodePlan Plan(int gpus, const std::string& assignment) {
    auto jobs = api::ParseTrainingJobs(GpuJob(gpus, assignment), "job.yaml");
    EXPECT_TRUE(jobs.ok()) << jobs.status().message();
    job_ = jobs->front();
    auto backend = devices::OpenNvmlBackend(FAKE_NVML_PATH, sysfs_.sysfs_root());
    EXPECT_TRUE(backend.ok()) << backend.status().message();
    PlanRequest r;
    r.job = &job_;
    r.node_rank = 1;
    r.master_addr = "trainer-node-0.trainer";
    r.gpus = *(*backend)->Discover();
    r.gpu_backend = "nvml";
    std::vector<int> allowed;
    for (int c = 0; c < 32; ++c) allowed.push_back(c);
    r.cpus = *devices::ReadCpuTopology(sysfs_.sysfs_root(), allowed);
    r.base_env = {{"PATH", "/usr/bin"}, {"NCCL_DEBUG", "WARN"}};
    auto plan = MakeNodePlan(r);
    EXPECT_TRUE(plan.ok()) << plan.status().message();
    return *plan;
  }

  testing::FakeSysfs sysfs_;
  api::TrainingJob job_;
};

TEST_F(PlanTest, SharedModeShowsEveryGpuInTopologyOrder) {
  NodePlan plan = Plan(8, "shared");
  ASSERT_EQ(plan.ranks.size(), 8u);
  EXPECT_EQ(plan.world_size, 16);
  EXPECT_EQ(plan.backend, "nccl");
  const std::string order = std::string(kUuidPrefix) + "07," + kUuidPrefix + "0f," + kUuidPrefix +
                            "47," + kUuidPrefix + "4e," + kUuidPrefix + "87," + kUuidPrefix +
                            "90," + kUuidPrefix + "b7," + kUuidPrefix + "bd";
  for (int i = 0; i < 8; ++i) {
    const RankPlan& r = plan.ranks[i];
    EXPECT_EQ(r.env.at("CUDA_VISIBLE_DEVICES"), order);
    EXPECT_EQ(r.env.at("CUDA_DEVICE_ORDER"), "PCI_BUS_ID");
    EXPECT_EQ(r.env.at("SPAWNPOINT_DEVICE_ORDINAL"), std::to_string(i));
    EXPECT_EQ(r.env.at("RANK"), std::to_string(8 + i));
    EXPECT_EQ(r.env.at("LOCAL_RANK"), std::to_string(i));
    EXPECT_EQ(r.env.at("GROUP_RANK"), "1");
    EXPECT_EQ(r.env.at("NNODES"), "2");
    EXPECT_EQ(r.env.at("WORLD_SIZE"), "16");
    EXPECT_EQ(r.env.at("LOCAL_WORLD_SIZE"), "8");
    EXPECT_EQ(r.env.at("MASTER_ADDR"), "trainer-node-0.trainer");
    EXPECT_EQ(r.env.at("MASTER_PORT"), "29500");
    EXPECT_EQ(r.env.at("NCCL_DEBUG"), "INFO");  // the manifest wins over the inherited value
    EXPECT_EQ(r.env.at("PATH"), "/usr/bin");
  }
}

TEST_F(PlanTest, ExclusiveModeShowsEachRankOnlyItsGpuAsDeviceZero) {
  NodePlan plan = Plan(8, "exclusive");
  const char* buses[] = {"07", "0f", "47", "4e", "87", "90", "b7", "bd"};
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(plan.ranks[i].env.at("CUDA_VISIBLE_DEVICES"), std::string(kUuidPrefix) + buses[i]);
    EXPECT_EQ(plan.ranks[i].env.at("SPAWNPOINT_DEVICE_ORDINAL"), "0");
    ASSERT_EQ(plan.ranks[i].devices.visible.size(), 1u);
  }
}

TEST_F(PlanTest, CpusAreSplitByTheGpusNumaNode) {
  NodePlan plan = Plan(8, "shared");
  for (int i = 0; i < 4; ++i) {
    EXPECT_THAT(plan.ranks[i].devices.cpus, Each(AllOf(Ge(0), Le(15))));
    EXPECT_EQ(plan.ranks[i].devices.cpus.size(), 4u);
    EXPECT_EQ(plan.ranks[i].env.at("OMP_NUM_THREADS"), "4");
  }
  for (int i = 4; i < 8; ++i) {
    EXPECT_THAT(plan.ranks[i].devices.cpus, Each(AllOf(Ge(16), Le(31))));
  }
  EXPECT_THAT(plan.ranks[5].devices.cpus, ElementsAre(20, 21, 22, 23));
}

TEST_F(PlanTest, PlanJsonListsArgvEnvDevicesAndCpus) {
  NodePlan plan = Plan(4, "exclusive");
  nlohmann::json j = NodePlanToJson(plan, /*full_env=*/false);
  EXPECT_EQ(j["worldSize"], 8);
  EXPECT_EQ(j["ranks"][2]["argv"], nlohmann::json({"/bin/true", "--epochs", "1"}));
  EXPECT_EQ(j["ranks"][2]["devices"][0]["pciBusId"], "0000:47:00.0");
  EXPECT_EQ(j["ranks"][2]["env"]["RANK"], "6");
  EXPECT_FALSE(j["ranks"][2]["env"].contains("PATH"));  // inherited: only with --full-env
  EXPECT_TRUE(NodePlanToJson(plan, true)["ranks"][2]["env"].contains("PATH"));
  EXPECT_EQ(j["ranks"][2]["devices"][0]["memoryTotalBytes"], 85899345920LL);
  // A total NVML did not give (the backend leaves it 0) is unknown: null, never 0 bytes.
  plan.ranks[2].devices.visible[0].memory_total_bytes = 0;
  EXPECT_TRUE(NodePlanToJson(plan, false)["ranks"][2]["devices"][0]["memoryTotalBytes"].is_null());
}

// The CLI on the same fakes, including every error that must stop a job before it starts.
class PlanCliTest : public ::testing::Test {
 protected:
  void SetUp() override { sysfs_.AddEightGpuTwoNumaTopology(); }

  testing::TestProcess Plan(const std::string& manifest, const std::string& nvml_config,
                            std::vector<std::string> extra = {}) {
    testing::WriteFile(dir_.File("job.yaml"), manifest);
    std::vector<std::string> argv = {AGENT_BIN,
                                     "plan",
                                     "-f",
                                     dir_.File("job.yaml"),
                                     "--gpu-backend",
                                     "nvml",
                                     "--nvml-library",
                                     FAKE_NVML_PATH,
                                     "--sysfs-root",
                                     sysfs_.sysfs_root(),
                                     "--node-rank",
                                     "0"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return testing::TestProcess(argv, {{"FAKE_NVML_CONFIG", nvml_config}});
  }

  testing::FakeSysfs sysfs_;
  testing::TempDir dir_;
};

TEST_F(PlanCliTest, PrintsThePlanAsJson) {
  auto p = Plan(GpuJob(4, "shared"), testing::FakeNvmlConfig("eight_gpus_two_numa.conf"));
  ASSERT_EQ(p.Wait(milliseconds(30'000)), 0) << p.Stderr();
  auto j = nlohmann::json::parse(p.Stdout());
  EXPECT_EQ(j["ranks"].size(), 4u);
  EXPECT_EQ(j["gpuBackend"], "nvml");
  EXPECT_EQ(j["ranks"][3]["devices"][3]["pciBusId"], "0000:4e:00.0");
  EXPECT_EQ(j["ranks"][3]["env"]["SPAWNPOINT_DEVICE_ORDINAL"], "3");
}

TEST_F(PlanCliTest, MoreRanksThanGpusIsAnError) {
  auto p = Plan(GpuJob(9, "shared"), testing::FakeNvmlConfig("eight_gpus_two_numa.conf"));
  EXPECT_EQ(p.Wait(milliseconds(30'000)), 1);
  EXPECT_THAT(p.Stderr(), HasSubstr("gpusPerNode is 9 but only 8 GPUs were found"));
  EXPECT_EQ(testing::CountLines(p.Stderr(), ""), 1);
}

TEST_F(PlanCliTest, AnUnhealthyGpuIsAnError) {
  std::string config = testing::ReadFile(testing::FakeNvmlConfig("eight_gpus_two_numa.conf"));
  // Mark the GPU on bus 47 as lost (the "lost" column).
  size_t line = config.find("00000000:47:00.0");
  size_t end = config.find('\n', line);
  config.replace(end - 1, 1, "1");
  testing::WriteFile(dir_.File("lost.conf"), config);
  auto p = Plan(GpuJob(8, "shared"), dir_.File("lost.conf"));
  EXPECT_EQ(p.Wait(milliseconds(30'000)), 1);
  EXPECT_THAT(p.Stderr(), HasSubstr("0000:47:00.0"));
  EXPECT_THAT(p.Stderr(), HasSubstr("is unhealthy"));
}

TEST_F(PlanCliTest, NoGpuWithGpusPerNodeIsAnErrorWithTheFix) {
  testing::WriteFile(dir_.File("job.yaml"), GpuJob(2, "shared"));
  testing::TestProcess p({AGENT_BIN, "plan", "-f", dir_.File("job.yaml"), "--gpu-backend", "none"});
  EXPECT_EQ(p.Wait(milliseconds(30'000)), 1);
  EXPECT_THAT(p.Stderr(), HasSubstr("no GPU was found"));
  EXPECT_THAT(p.Stderr(), HasSubstr("gpusPerNode: 0"));
}

// A valueFrom entry is the kubelet's: in a pod (--job-env, as the operator starts the agent)
// the ranks get the value the kubelet put in the pod's environment; a local run (-f) cannot
// resolve it and says so before anything starts.
TEST_F(PlanCliTest, ValueFromReachesTheRanksInAPodAndStopsALocalRun) {
  const std::string job =
      "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: resnet}\n"
      "spec:\n  template:\n    spec:\n      containers:\n      - name: trainer\n"
      "        command: [/bin/true]\n        env:\n        - {name: A, value: '1'}\n"
      "        - name: TRAINER_POD\n          valueFrom: {fieldRef: {fieldPath: metadata.name}}\n";
  testing::TestProcess pod({AGENT_BIN, "plan", "--job-env", "SPAWNPOINT_JOB", "--node-rank", "0",
                            "--gpu-backend", "none", "--full-env"},
                           {{"SPAWNPOINT_JOB", job}, {"TRAINER_POD", "resnet-node-0"}});
  ASSERT_EQ(pod.Wait(milliseconds(30'000)), 0) << pod.Stderr();
  auto j = nlohmann::json::parse(pod.Stdout());
  EXPECT_EQ(j["ranks"][0]["env"]["TRAINER_POD"], "resnet-node-0");
  EXPECT_EQ(j["ranks"][0]["env"]["A"], "1");

  testing::WriteFile(dir_.File("job.yaml"), job);
  for (const char* command : {"plan", "run"}) {
    testing::TestProcess local({AGENT_BIN, command, "-f", dir_.File("job.yaml"), "--gpu-backend",
                                "none", "--master-port", "0"},
                               {{"TRAINER_POD", "resnet-node-0"}});
    EXPECT_EQ(local.Wait(milliseconds(30'000)), 2) << command << ": " << local.Stderr();
    EXPECT_THAT(local.Stderr(),
                HasSubstr("job.yaml:13:22: spec.template.spec.containers[0].env[1].valueFrom: a "
                          "local run cannot resolve valueFrom (fieldRef metadata.name); give "
                          "value: instead, or run on the cluster"))
        << command;
    EXPECT_EQ(local.Stdout(), "") << command;
  }
}

TEST_F(PlanCliTest, MissingNvmlLibraryIsNamed) {
  testing::WriteFile(dir_.File("job.yaml"), GpuJob(2, "shared"));
  testing::TestProcess p({AGENT_BIN, "plan", "-f", dir_.File("job.yaml"), "--gpu-backend", "nvml",
                          "--nvml-library", "/nonexistent/libnvidia-ml.so.1"});
  EXPECT_EQ(p.Wait(milliseconds(30'000)), 1);
  EXPECT_THAT(p.Stderr(), HasSubstr("/nonexistent/libnvidia-ml.so.1"));
}

}  // namespace
}  // namespace spawnpoint::agent

namespace spawnpoint::agent {
namespace {

NodePlan CpuPlan(const std::string& command, const std::string& shim_dir,
                 std::map<std::string, std::string> base_env, api::TrainingJob& job) {
  auto jobs = api::ParseTrainingJobs(
      "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: py}\n"
      "spec:\n  procsPerNode: 2\n  template:\n    spec:\n      containers:\n      - name: trainer\n"
      "        image: x\n        command: [" +
          command + "]\n",
      "job.yaml");
  EXPECT_TRUE(jobs.ok()) << jobs.status().message();
  job = jobs->front();
  PlanRequest r;
  r.job = &job;
  r.cpus = *devices::ReadCpuTopology("/nonexistent", {0, 1});
  r.python_shim_dir = shim_dir;
  r.base_env = std::move(base_env);
  auto plan = MakeNodePlan(r);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return *plan;
}

TEST(PythonShimPlanTest, PythonTrainersGetTheShimFirstOnPythonPath) {
  api::TrainingJob job;
  NodePlan plan = CpuPlan("/usr/bin/python3, train.py", "/opt/spawnpoint/python",
                          {{"PYTHONPATH", "/user/lib"}}, job);
  for (const auto& r : plan.ranks) {
    EXPECT_EQ(r.env.at("PYTHONPATH"), "/opt/spawnpoint/python:/user/lib");
    EXPECT_EQ(r.env.at("SPAWNPOINT_SHIM"), "1");
  }
  NodePlan plain = CpuPlan("python3.11, -m, train", "/opt/spawnpoint/python", {}, job);
  EXPECT_EQ(plain.ranks[0].env.at("PYTHONPATH"), "/opt/spawnpoint/python");
}

TEST(PythonShimPlanTest, OtherTrainersAreLeftAlone) {
  api::TrainingJob job;
  NodePlan plan =
      CpuPlan("/bin/true", "/opt/spawnpoint/python", {{"PYTHONPATH", "/user/lib"}}, job);
  EXPECT_EQ(plan.ranks[0].env.at("PYTHONPATH"), "/user/lib");
  EXPECT_EQ(plan.ranks[0].env.count("SPAWNPOINT_SHIM"), 0u);
}

TEST(PythonShimPlanTest, RecognisesPythonInterpreters) {
  EXPECT_TRUE(IsPythonCommand({"python"}));
  EXPECT_TRUE(IsPythonCommand({"python3"}));
  EXPECT_TRUE(IsPythonCommand({"/usr/bin/python3.11", "x.py"}));
  EXPECT_FALSE(IsPythonCommand({"python3-config"}));
  EXPECT_FALSE(IsPythonCommand({"/usr/bin/torchrun"}));
  EXPECT_FALSE(IsPythonCommand({"build/bin/spawnpoint-example-trainer"}));
}

}  // namespace
}  // namespace spawnpoint::agent

// Loader pools: Python ranks get agent-owned Python loader workers; C++ ranks their
// program in worker mode.
namespace spawnpoint::agent {
namespace {

using ::testing::Contains;
using ::testing::Not;
using ::testing::StartsWith;

constexpr const char* kShim = "/opt/spawnpoint/python";
constexpr const char* kPoolRoot = "/tmp/spawnpoint-pools";

struct PoolJob {
  std::string command = "/usr/bin/python3, train.py";
  std::string loader;  // the spec.loader section's fields, "{...}" flow style
  std::string shim_dir = kShim;
  bool embeds_loader = false;
  std::string extra_env;  // the trainer's env entries, flow style
  std::string working_dir;
};

NodePlan PlanWithPools(const PoolJob& p, api::TrainingJob& job) {
  auto jobs = api::ParseTrainingJobs(
      "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: py}\n"
      "spec:\n  procsPerNode: 2\n" +
          (p.loader.empty() ? "" : "  loader: " + p.loader + "\n") +
          "  template:\n    spec:\n      containers:\n      - name: trainer\n"
          "        image: x\n        command: [" +
          p.command + "]\n        env: [" + p.extra_env + "]\n" +
          (p.working_dir.empty() ? "" : "        workingDir: " + p.working_dir + "\n"),
      "job.yaml");
  EXPECT_TRUE(jobs.ok()) << jobs.status().message();
  job = jobs->front();
  PlanRequest r;
  r.job = &job;
  r.cpus = *devices::ReadCpuTopology("/nonexistent", {0, 1, 2, 3});  // 2 CPUs a rank
  r.python_shim_dir = p.shim_dir;
  r.pool_root = kPoolRoot;
  r.trainer_embeds_loader = p.embeds_loader;
  r.base_env = {{"PATH", "/usr/bin"}, {"PYTHONPATH", "/user/lib"}};
  auto plan = MakeNodePlan(r);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return *plan;
}

// The names a pool's environment sets.
std::vector<std::string> Names(const std::vector<std::string>& env) {
  std::vector<std::string> names;
  for (const auto& kv : env) names.push_back(kv.substr(0, kv.find('=')));
  return names;
}

TEST(LoaderPoolPlanTest, ServiceSocketIsInThePoolDirectory) {
  EXPECT_EQ(loader::ServiceSocketPath("/tmp/sp/rank-3"), "/tmp/sp/rank-3/service.sock");
}

TEST(LoaderPoolPlanTest, PythonRankGetsAPoolOfPythonWorkers) {
  api::TrainingJob job;
  NodePlan plan = PlanWithPools(
      {.loader = "{workersPerRank: 3, preloadModules: [torch, numpy, torchvision.transforms]}"},
      job);
  ASSERT_EQ(plan.ranks.size(), 2u);
  for (const RankPlan& r : plan.ranks) {
    SCOPED_TRACE(r.rank);
    ASSERT_TRUE(r.pool.has_value()) << r.pool_skipped;
    EXPECT_EQ(r.pool_skipped, "");
    const PoolPlan& pool = *r.pool;
    const std::string dir = std::string(kPoolRoot) + "/rank-" + std::to_string(r.rank);
    EXPECT_TRUE(pool.python);
    EXPECT_EQ(pool.workers, 3);
    EXPECT_FALSE(pool.auto_workers);
    EXPECT_EQ(pool.argv,
              (std::vector<std::string>{"/usr/bin/python3", "-m", "spawnpoint_rank.worker"}));
    EXPECT_EQ(pool.dir, dir);
    EXPECT_EQ(pool.service_socket, dir + "/service.sock");

    // The workers: the rank's environment, its identity included (torch's own workers
    // inherit it: a dataset may shard by RANK) but not its restart count (the workers
    // outlive restarts), without the shim's switch (stock torch), one OpenMP thread, the
    // modules to preload.
    EXPECT_THAT(pool.env, Contains("SPAWNPOINT_LOADER_PRELOAD=torch,numpy,torchvision.transforms"));
    EXPECT_THAT(pool.env, Contains("OMP_NUM_THREADS=1"));
    EXPECT_THAT(pool.env, Contains(std::string("PYTHONPATH=") + kShim + ":/user/lib"));
    EXPECT_THAT(pool.env, Contains("PATH=/usr/bin"));
    for (const char* name : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
      EXPECT_THAT(pool.env, Contains(std::string(name) + "=" + r.env.at(name)));
    }
    const std::vector<std::string> names = Names(pool.env);
    for (const char* absent :
         {"SPAWNPOINT_SHIM", "TORCHELASTIC_RESTART_COUNT", "SPAWNPOINT_LOADER_POOL_DIR",
          "SPAWNPOINT_LOADER_SERVICE", "SPAWNPOINT_LOADER_AUTO_WORKERS"}) {
      EXPECT_THAT(names, Not(Contains(absent)));
    }
    EXPECT_EQ(std::count(names.begin(), names.end(), "OMP_NUM_THREADS"), 1);

    // The rank: where its pool and the agent's service are; the shim keeps its settings.
    EXPECT_EQ(r.env.at("SPAWNPOINT_LOADER_POOL_DIR"), dir);
    EXPECT_EQ(r.env.at("SPAWNPOINT_LOADER_SERVICE"), dir + "/service.sock");
    EXPECT_EQ(r.env.at("SPAWNPOINT_LOADER_WORKERS"), "3");
    EXPECT_EQ(r.env.at("SPAWNPOINT_SHIM"), "1");
    EXPECT_EQ(r.env.count("SPAWNPOINT_LOADER_AUTO_WORKERS"), 0u);
    EXPECT_EQ(r.env.count("SPAWNPOINT_LOADER_PRELOAD"), 0u);
    EXPECT_THAT(r.spawnpoint_env, Contains("SPAWNPOINT_LOADER_POOL_DIR"));
    EXPECT_THAT(r.spawnpoint_env, Contains("SPAWNPOINT_LOADER_SERVICE"));
  }
}

TEST(LoaderPoolPlanTest, PythonPoolUnderAutoHasMinOfEightAndCpusWorkersAndNoKnee) {
  api::TrainingJob job;
  NodePlan plan = PlanWithPools({}, job);  // workersPerRank auto, default preloadModules
  const RankPlan& r = plan.ranks[1];
  ASSERT_TRUE(r.pool.has_value()) << r.pool_skipped;
  EXPECT_TRUE(r.pool->python);
  EXPECT_EQ(r.pool->workers, 2);  // min(8, 2 CPUs)
  // A DataLoader asking for more grows it, to max(8, the node's 4 CPUs) at most.
  EXPECT_EQ(r.pool->max_workers, 8);
  EXPECT_FALSE(r.pool->auto_workers) << "the rank's DataLoader uses every worker";
  EXPECT_THAT(r.pool->env, Contains("SPAWNPOINT_LOADER_PRELOAD=torch,__main__"));
  EXPECT_THAT(r.pool->env, Contains("SPAWNPOINT_LOADER_MAIN=train.py"));
  // The shim resolves "auto" itself, to the same min(CPUs, 8).
  EXPECT_EQ(r.env.at("SPAWNPOINT_LOADER_WORKERS"), "auto");
  EXPECT_EQ(r.env.count("SPAWNPOINT_LOADER_AUTO_WORKERS"), 0u);
  EXPECT_THAT(Names(r.pool->env), Not(Contains("SPAWNPOINT_LOADER_AUTO_WORKERS")));

  // A pool the job makes larger than that may grow no further than its own size.
  plan = PlanWithPools({.loader = "{workersPerRank: 12}"}, job);
  ASSERT_TRUE(plan.ranks[0].pool.has_value());
  EXPECT_EQ(plan.ranks[0].pool->max_workers, 12);

  // Nothing to preload: the variable is there, empty.
  plan = PlanWithPools({.loader = "{preloadModules: []}"}, job);
  ASSERT_TRUE(plan.ranks[0].pool.has_value());
  EXPECT_THAT(plan.ranks[0].pool->env, Contains("SPAWNPOINT_LOADER_PRELOAD="));
  EXPECT_EQ(NodePlanToJson(plan, false)["ranks"][0]["loaderPool"]["preload"],
            nlohmann::json::array());
}

// The script whose leading imports the workers preload ("__main__"), found as the
// interpreter's option parsing finds it, under the rank's working directory.
TEST(LoaderPoolPlanTest, TheWorkersAreToldTheTrainersScript) {
  EXPECT_EQ(PythonScriptOf({"python3", "train.py", "--lr", "1"}), "train.py");
  EXPECT_EQ(PythonScriptOf({"/usr/bin/python3.11", "-u", "-W", "ignore", "-X", "dev", "-OO",
                            "/src/train.py", "-m", "x"}),
            "/src/train.py");
  EXPECT_EQ(PythonScriptOf({"python", "-uWignore", "-Xutf8", "a.py"}), "a.py");
  EXPECT_EQ(PythonScriptOf({"python", "--check-hash-based-pycs", "never", "--", "-odd.py"}),
            "-odd.py");
  for (const std::vector<std::string>& none :
       std::vector<std::vector<std::string>>{{"python", "-c", "print(1)"},
                                             {"python", "-m", "torch.distributed.run", "t.py"},
                                             {"python", "-um", "pkg"},
                                             {"python", "-"},
                                             {"python"},
                                             {"python", "--version"},
                                             {"bash", "train.py"}}) {
    EXPECT_EQ(PythonScriptOf(none), "") << nlohmann::json(none).dump();
  }

  api::TrainingJob job;
  NodePlan plan = PlanWithPools({.working_dir = "/work"}, job);
  ASSERT_TRUE(plan.ranks[0].pool.has_value());
  EXPECT_THAT(plan.ranks[0].pool->env, Contains("SPAWNPOINT_LOADER_MAIN=/work/train.py"));
}

TEST(LoaderPoolPlanTest, TheJobsPreloadListWinsOverAnInheritedOne) {
  api::TrainingJob job;
  NodePlan plan = PlanWithPools(
      {.loader = "{preloadModules: [numpy]}",
       .extra_env = "{name: SPAWNPOINT_LOADER_PRELOAD, value: pandas}, {name: A, value: b}"},
      job);
  ASSERT_TRUE(plan.ranks[0].pool.has_value());
  std::vector<std::string> names = Names(plan.ranks[0].pool->env);
  EXPECT_EQ(std::count(names.begin(), names.end(), "SPAWNPOINT_LOADER_PRELOAD"), 1);
  EXPECT_THAT(plan.ranks[0].pool->env, Contains("SPAWNPOINT_LOADER_PRELOAD=numpy"));
  EXPECT_THAT(plan.ranks[0].pool->env, Contains("A=b"));
}

TEST(LoaderPoolPlanTest, PythonPoolFalseLeavesTheWorkersToTheDataLoader) {
  api::TrainingJob job;
  NodePlan plan = PlanWithPools({.loader = "{pythonPool: false, workersPerRank: 2}"}, job);
  for (const RankPlan& r : plan.ranks) {
    EXPECT_FALSE(r.pool.has_value());
    EXPECT_EQ(r.pool_skipped,
              "loader.pythonPool is false: the DataLoader spawns its own workers (through the "
              "shim)");
    EXPECT_EQ(r.env.count("SPAWNPOINT_LOADER_POOL_DIR"), 0u);
    EXPECT_EQ(r.env.count("SPAWNPOINT_LOADER_SERVICE"), 0u);
    EXPECT_EQ(r.env.at("SPAWNPOINT_LOADER_WORKERS"), "2");
    EXPECT_EQ(r.env.at("SPAWNPOINT_SHIM"), "1");
  }
  EXPECT_EQ(NodePlanToJson(plan, false)["ranks"][0]["loaderPool"],
            nlohmann::json({{"skipped", plan.ranks[0].pool_skipped}}));
}

TEST(LoaderPoolPlanTest, NoShimNoPythonPool) {
  api::TrainingJob job;
  NodePlan plan = PlanWithPools({.shim_dir = ""}, job);
  EXPECT_FALSE(plan.ranks[0].pool.has_value());
  EXPECT_EQ(plan.ranks[0].pool_skipped, "no Python shim shipped with this agent");
  EXPECT_EQ(plan.ranks[0].env.count("SPAWNPOINT_LOADER_SERVICE"), 0u);
  EXPECT_EQ(plan.ranks[0].env.count("SPAWNPOINT_SHIM"), 0u);
}

TEST(LoaderPoolPlanTest, NoWorkersNoPool) {
  api::TrainingJob job;
  for (const std::string command : {"/usr/bin/python3, train.py", "/bin/true"}) {
    SCOPED_TRACE(command);
    NodePlan plan = PlanWithPools(
        {.command = command, .loader = "{workersPerRank: 0}", .embeds_loader = true}, job);
    for (const RankPlan& r : plan.ranks) {
      EXPECT_FALSE(r.pool.has_value());
      EXPECT_EQ(r.pool_skipped, "");
      EXPECT_EQ(r.env.count("SPAWNPOINT_LOADER_POOL_DIR"), 0u);
      EXPECT_EQ(r.env.count("SPAWNPOINT_LOADER_SERVICE"), 0u);
      EXPECT_EQ(r.env.at("SPAWNPOINT_LOADER_WORKERS"), "0");
    }
    EXPECT_FALSE(NodePlanToJson(plan, false)["ranks"][0].contains("loaderPool"));
  }
}

TEST(LoaderPoolPlanTest, CppPoolsAreUnchanged) {
  api::TrainingJob job;
  NodePlan plan = PlanWithPools({.command = "/bin/true", .embeds_loader = true}, job);
  const RankPlan& r = plan.ranks[0];
  ASSERT_TRUE(r.pool.has_value()) << r.pool_skipped;
  EXPECT_FALSE(r.pool->python);
  EXPECT_TRUE(r.pool->auto_workers);
  EXPECT_EQ(r.pool->workers, 2);
  EXPECT_EQ(r.pool->argv, std::vector<std::string>{"/bin/true"});
  EXPECT_EQ(r.pool->service_socket, "");
  EXPECT_THAT(Names(r.pool->env), Not(Contains("SPAWNPOINT_LOADER_PRELOAD")));
  // The trainer's program in worker mode never sees a rank's identity.
  for (const char* absent : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    EXPECT_THAT(Names(r.pool->env), Not(Contains(absent)));
  }
  EXPECT_EQ(r.env.at("SPAWNPOINT_LOADER_WORKERS"), "2");
  EXPECT_EQ(r.env.at("SPAWNPOINT_LOADER_AUTO_WORKERS"), "1");
  EXPECT_EQ(r.env.count("SPAWNPOINT_LOADER_SERVICE"), 0u);
  nlohmann::json pool = NodePlanToJson(plan, false)["ranks"][0]["loaderPool"];
  EXPECT_EQ(pool, nlohmann::json({{"workers", 2},
                                  {"auto", true},
                                  {"argv", {"/bin/true"}},
                                  {"dir", std::string(kPoolRoot) + "/rank-0"}}));

  // A Python trainer with a workerCommand gets that program, as a C++ pool.
  plan = PlanWithPools({.loader = "{workersPerRank: 1, workerCommand: [/opt/worker]}"}, job);
  ASSERT_TRUE(plan.ranks[0].pool.has_value());
  EXPECT_FALSE(plan.ranks[0].pool->python);
  EXPECT_EQ(plan.ranks[0].pool->argv, std::vector<std::string>{"/opt/worker"});
  EXPECT_EQ(plan.ranks[0].env.count("SPAWNPOINT_LOADER_SERVICE"), 0u);
}

// What the agent says once at start about what it changes in the ranks (rank_changes.h).
TEST(RankChangesTest, SaysPinningThreadsStartMethodLoaderDefaultsAndTheStallRule) {
  api::TrainingJob job;
  NodePlan plan = PlanWithPools({}, job);
  std::vector<std::string> lines = RankChanges(plan, job);
  ASSERT_EQ(lines.size(), 5u) << ::testing::PrintToString(lines);
  EXPECT_EQ(lines[0],
            "each rank is pinned to its CPUs (rank 0: 0-1, rank 1: 2-3), with "
            "OMP_NUM_THREADS=2 (its CPUs; torchrun sets 1); its loader workers run on the same "
            "CPUs");
  EXPECT_THAT(lines[1], HasSubstr("default start method is spawn"));
  EXPECT_THAT(lines[2], HasSubstr("one the code leaves at num_workers=0 gets 2 workers from the "
                                  "agent's pool (loader.workersPerRank auto) unless its dataset "
                                  "draws from the random streams"));
  EXPECT_THAT(lines[2], HasSubstr("grows the pool (up to 8 per rank)"));
  EXPECT_THAT(lines[2], HasSubstr("persistent_workers as the code says"));
  EXPECT_THAT(lines[3], HasSubstr("ends once its exit handlers have run"));
  EXPECT_THAT(lines[3], HasSubstr("restarts in a warm standby"));
  EXPECT_THAT(lines[4], HasSubstr("while its peers wait 30 s for it in a collective"));

  plan = PlanWithPools({.loader = "{workersPerRank: 0, persistentWorkers: true}",
                        .extra_env = "{name: OMP_NUM_THREADS, value: '4'}"},
                       job);
  job.spec.restart_policy.standby = false;  // the restarts line says nothing of standbys
  lines = RankChanges(plan, job);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_THAT(lines[3], HasSubstr("without the interpreter's finalization"));
  EXPECT_THAT(lines[3], Not(HasSubstr("standby")));
  job.spec.restart_policy.max_restarts = 0;  // no restart: no restarts line
  lines = RankChanges(plan, job);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_THAT(lines[0], HasSubstr("OMP_NUM_THREADS=4 as the job or the environment sets it"));
  EXPECT_THAT(
      lines[2],
      HasSubstr("num_workers as the code says, on torch's own workers (loader.workersPerRank: 0)"));
  EXPECT_THAT(lines[2], HasSubstr("persistent_workers=True where the code sets none"));

  // Not Python: pinning and the stall rule only.
  plan = PlanWithPools({.command = "/opt/trainer", .embeds_loader = true}, job);
  lines = RankChanges(plan, job);
  ASSERT_EQ(lines.size(), 2u) << ::testing::PrintToString(lines);
  EXPECT_THAT(lines[1], HasSubstr("is named with its stack (stallPolicy: action Report)"));
}

TEST(LoaderPoolPlanTest, PlanJsonShowsThePythonPool) {
  api::TrainingJob job;
  NodePlan plan =
      PlanWithPools({.loader = "{workersPerRank: 4, preloadModules: [torch, numpy]}"}, job);
  nlohmann::json j = NodePlanToJson(plan, /*full_env=*/false);
  const std::string dir = std::string(kPoolRoot) + "/rank-1";
  EXPECT_EQ(j["ranks"][1]["loaderPool"],
            nlohmann::json({{"workers", 4},
                            {"auto", false},
                            {"argv", {"/usr/bin/python3", "-m", "spawnpoint_rank.worker"}},
                            {"dir", dir},
                            {"python", true},
                            {"maxWorkers", 8},
                            {"service", dir + "/service.sock"},
                            {"preload", {"torch", "numpy"}}}));
  EXPECT_EQ(j["ranks"][1]["env"]["SPAWNPOINT_LOADER_SERVICE"], dir + "/service.sock");
  EXPECT_EQ(j["ranks"][1]["env"]["SPAWNPOINT_LOADER_POOL_DIR"], dir);
}

TEST_F(PlanCliTest, PrintsAPythonRanksLoaderPool) {
  testing::WriteFile(
      dir_.File("job.yaml"),
      "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: py}\n"
      "spec:\n  loader: {workersPerRank: 2, preloadModules: [torch, numpy]}\n"
      "  template:\n    spec:\n      containers:\n      - name: trainer\n        image: x\n"
      "        command: [python3, train.py]\n");
  testing::WriteFile(dir_.File("train.py"), "\n");  // plan checks that the script is there
  testing::TestProcess p(
      {AGENT_BIN, "plan", "-f", dir_.File("job.yaml"), "--gpu-backend", "none", "--node-rank", "0"},
      {}, dir_.path());
  ASSERT_EQ(p.Wait(milliseconds(30'000)), 0) << p.Stderr();
  auto pool = nlohmann::json::parse(p.Stdout())["ranks"][0]["loaderPool"];
  EXPECT_EQ(pool["python"], true) << pool.dump();
  EXPECT_EQ(pool["workers"], 2);
  EXPECT_EQ(pool["argv"], nlohmann::json({"python3", "-m", "spawnpoint_rank.worker"}));
  EXPECT_EQ(pool["preload"], nlohmann::json({"torch", "numpy"}));
  EXPECT_THAT(pool["service"].get<std::string>(), StartsWith(pool["dir"].get<std::string>()));
  EXPECT_THAT(pool["service"].get<std::string>(), ::testing::EndsWith("/rank-0/service.sock"));

  // An agent without the shim says why the rank gets none.
  testing::TestProcess bare(
      {AGENT_BIN, "plan", "-f", dir_.File("job.yaml"), "--gpu-backend", "none", "--node-rank", "0"},
      {{"SPAWNPOINT_PYTHON_SHIM_DIR", ""}}, dir_.path());
  ASSERT_EQ(bare.Wait(milliseconds(30'000)), 0) << bare.Stderr();
  EXPECT_EQ(nlohmann::json::parse(bare.Stdout())["ranks"][0]["loaderPool"],
            nlohmann::json({{"skipped", "no Python shim shipped with this agent"}}));
}

// plan shows the program each rank execs, resolved on the ranks' PATH as the spawner will
// run it, and warns (a line, not an error) when a Python rank's interpreter cannot import
// torch, so the job does not fail later with ModuleNotFoundError.
class PlanInterpreterTest : public ::testing::Test {
 protected:
  testing::TestProcess Plan(const std::string& command, const std::string& path) {
    testing::WriteFile(
        dir_.File("job.yaml"),
        "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: py}\n"
        "spec:\n  procsPerNode: 2\n  template:\n    spec:\n      containers:\n"
        "      - name: trainer\n        command: [" +
            command + "]\n");
    testing::WriteFile(dir_.File("train.py"), "\n");  // plan checks that the script is there
    return testing::TestProcess({AGENT_BIN, "plan", "-f", dir_.File("job.yaml"), "--gpu-backend",
                                 "none", "--node-rank", "0"},
                                {{"PATH", path}}, dir_.path());
  }
  testing::TempDir dir_;
};

TEST_F(PlanInterpreterTest, APythonWithoutTorchIsShownAndWarnedAbout) {
  // A python3 first on PATH that has no torch, as a venv without it would be.
  const std::string bin = dir_.File("bin");
  std::filesystem::create_directories(bin);
  testing::WriteFile(bin + "/python3",
                     "#!/bin/sh\necho 'Traceback (most recent call last):' >&2\n"
                     "echo \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n");
  ASSERT_EQ(chmod((bin + "/python3").c_str(), 0755), 0);
  auto p = Plan("python3, train.py", bin + ":/usr/bin:/bin");
  ASSERT_EQ(p.Wait(milliseconds(60'000)), 0) << p.Stderr();
  auto j = nlohmann::json::parse(p.Stdout());
  EXPECT_EQ(j["ranks"][0]["argv"], nlohmann::json({"python3", "train.py"}));
  EXPECT_EQ(j["ranks"][0]["executable"], bin + "/python3");
  EXPECT_EQ(j["ranks"][1]["executable"], bin + "/python3");
  EXPECT_TRUE(j["ranks"][0]["torchVersion"].is_null());
  EXPECT_THAT(p.Stderr(), HasSubstr("warning: py: the ranks' interpreter " + bin +
                                    "/python3 (`python3` on the ranks' PATH) cannot import "
                                    "torch: ModuleNotFoundError: No module named 'torch'"));
  EXPECT_EQ(testing::CountLines(p.Stderr(), "cannot import torch"), 1) << "once per interpreter";
}

TEST_F(PlanInterpreterTest, ThePythonWithTorchIsShownWithItsVersion) {
  // Skipped (ctest: Skipped) only when torch is not installed; a probe that crashes or hangs
  // fails (tests/support/python_probe.h).
  auto missing = testing::MissingPythonModules("/usr/bin/python3", {"torch"}, milliseconds(60'000));
  ASSERT_TRUE(missing.ok()) << missing.status().ToString();
  if (!missing->empty()) {
    GTEST_SKIP() << "/usr/bin/python3 has no torch here: scripts/install-deps.sh installs it";
  }
  auto p = Plan("python3, train.py", "/usr/bin:/bin");
  ASSERT_EQ(p.Wait(milliseconds(60'000)), 0) << p.Stderr();
  auto j = nlohmann::json::parse(p.Stdout());
  EXPECT_EQ(j["ranks"][0]["executable"], "/usr/bin/python3");
  ASSERT_TRUE(j["ranks"][0]["torchVersion"].is_string()) << j.dump();
  EXPECT_FALSE(j["ranks"][0]["torchVersion"].get<std::string>().empty());
  EXPECT_THAT(p.Stderr(), Not(HasSubstr("warning")));
}

TEST_F(PlanInterpreterTest, AProgramThatIsNotPythonIsShownAndNotProbed) {
  auto p = Plan("\"true\"", "/usr/bin:/bin");
  ASSERT_EQ(p.Wait(milliseconds(60'000)), 0) << p.Stderr();
  auto j = nlohmann::json::parse(p.Stdout());
  EXPECT_EQ(j["ranks"][0]["executable"], "/usr/bin/true");
  EXPECT_FALSE(j["ranks"][0].contains("torchVersion"));
  EXPECT_EQ(p.Stderr(), "");
}

}  // namespace
}  // namespace spawnpoint::agent
