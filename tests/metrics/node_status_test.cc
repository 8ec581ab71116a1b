// NodeStatus in process, on a scripted GPU backend and hand-written loader statistics:
// labels, units, the DCGM-compatible names, counters that survive a rank's restart, rank
// up/down from the gang's events, the ranks' steps and the named stall from the stall
// monitor's readings, and the /status document's aggregates.
#include "agent/status/node_status.h"

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/loader/contract.h"
#include "agent/run/report.h"
#include "agent/status/agent_endpoint.h"
#include "tests/metrics/agent_harness.h"
#include "tests/metrics/http_client.h"
#include "tests/metrics/sample_parser.h"
#include "tests/support/test_process.h"

namespace spawnpoint::agent {
namespace {

using testing::FindSample;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ParseSamples;

class ScriptedGpus : public devices::GpuBackend {
 public:
  std::string Name() const override { return "nvml"; }
  StatusOr<std::vector<devices::GpuDevice>> Discover() override { return devices; }
  StatusOr<std::vector<devices::GpuSample>> Sample() override {
    std::lock_guard<std::mutex> lock(mu);
    if (!error.empty()) return Internal(error);
    return samples;
  }
  std::vector<devices::GpuDevice> devices;
  std::mutex mu;
  std::vector<devices::GpuSample> samples;
  std::string error;
};

devices::GpuDevice Gpu(int index, const std::string& bus) {
  devices::GpuDevice d;
  d.index = index;
  d.uuid = "GPU-" + std::to_string(index);
  d.pci_bus_id = bus;
  d.name = "NVIDIA A100-SXM4-80GB";
  d.vendor = "nvidia";
  d.memory_total_bytes = 80ull << 30;
  return d;
}

class NodeStatusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gpus_.devices = {Gpu(3, "0000:07:00.0"), Gpu(1, "0000:0f:00.0")};
    gpus_.samples = {{.index = 1,
                      .utilisation = 0.2,
                      .memory_used_bytes = 2ull << 30,
                      .memory_total_bytes = 80ull << 30,
                      .power_watts = 110.5,
                      .temperature_celsius = 41},
                     {.index = 3,
                      .utilisation = 0.4,
                      .memory_used_bytes = (4ull << 30) + 123,
                      .memory_total_bytes = 80ull << 30,
                      .power_watts = 130,
                      .temperature_celsius = 43}};
    for (int r = 0; r < 2; ++r) {
      std::filesystem::create_directories(dir_.File("rank-" + std::to_string(r)));
    }
  }

  NodeStatusOptions Options(bool with_gpus = true) {
    NodeStatusOptions o;
    o.identity = {.job = "resnet",
                  .job_namespace = "ml",
                  .pod = "resnet-node-0",
                  .container = "trainer",
                  .hostname = "gpu-node-7",
                  .node_rank = 0};
    o.ranks = {{.rank = 0,
                .local_rank = 0,
                .gpu_index = with_gpus ? 3 : -1,
                .pool_dir = dir_.File("rank-0")},
               {.rank = 1,
                .local_rank = 1,
                .gpu_index = with_gpus ? 1 : -1,
                .pool_dir = dir_.File("rank-1")}};
    if (with_gpus) {
      o.gpus = gpus_.devices;
      o.gpu_backend = &gpus_;
      o.gpu_backend_name = "nvml";
    }
    return o;
  }

  void WriteStats(int rank, double batches, double wait, double stall, double sps, int died = 0) {
    nlohmann::json j = {{"batches", batches},
                        {"samples", batches * 32},
                        {"waitSeconds", wait},
                        {"dataStall", stall},
                        {"samplesPerSecond", sps},
                        {"queueDepth", 2},
                        {"activeWorkers", 4},
                        {"restarts", {{"died", died}, {"hung", 0}, {"oom", 0}, {"shm", 0}}}};
    ASSERT_TRUE(loader::WriteFileAtomically(
                    loader::StatsPath(dir_.File("rank-" + std::to_string(rank))), j.dump())
                    .ok());
  }

  ScriptedGpus gpus_;
  testing::TempDir dir_;
};

TEST(AgentIdentityTest, FromThePodsEnvironment) {
  auto pod = IdentityFromEnvironment({{"POD_NAME", "resnet-node-1"},
                                      {"POD_NAMESPACE", "team-a"},
                                      {"CONTAINER_NAME", "trainer"},
                                      {"NODE_NAME", "gpu-node-7"}},
                                     "resnet-node-1", "resnet", "ml", 1);
  EXPECT_EQ(pod.pod, "resnet-node-1");
  EXPECT_EQ(pod.job_namespace, "team-a");  // the pod's namespace wins
  EXPECT_EQ(pod.container, "trainer");
  EXPECT_EQ(pod.hostname, "gpu-node-7");
  EXPECT_EQ(pod.node_rank, 1);

  auto k8s = IdentityFromEnvironment({{"KUBERNETES_SERVICE_HOST", "10.0.0.1"}}, "pod-host",
                                     "resnet", "ml", 0);
  EXPECT_EQ(k8s.pod, "pod-host");  // a pod's hostname is its name
  EXPECT_EQ(k8s.job_namespace, "ml");
  EXPECT_EQ(k8s.hostname, "pod-host");

  auto laptop = IdentityFromEnvironment({}, "laptop", "resnet", "", 0);
  EXPECT_EQ(laptop.pod, "");
  EXPECT_EQ(laptop.container, "");
  EXPECT_EQ(laptop.job_namespace, "");
  EXPECT_EQ(laptop.hostname, "laptop");
}

TEST(LocalNodeMetricsAddressTest, EachNodeGetsTheNextPort) {
  EXPECT_EQ(LocalNodeMetricsAddress(":9400", 0), ":9400");
  EXPECT_EQ(LocalNodeMetricsAddress(":9400", 2), ":9402");
  EXPECT_EQ(LocalNodeMetricsAddress("127.0.0.1:9400", 1), "127.0.0.1:9401");
  EXPECT_EQ(LocalNodeMetricsAddress("[::1]:9400", 1), "[::1]:9401");
  EXPECT_EQ(LocalNodeMetricsAddress("127.0.0.1:0", 3), "127.0.0.1:0");
  EXPECT_EQ(LocalNodeMetricsAddress("off", 1), "off");
  EXPECT_EQ(LocalNodeMetricsAddress("", 1), "");
  EXPECT_TRUE(MetricsDisabled("off"));
  EXPECT_FALSE(MetricsDisabled(":9400"));
}

TEST_F(NodeStatusTest, GpuMetricsCarryDcgmsLabelsAndBaseUnits) {
  NodeStatus status(Options());
  const std::string text = status.registry().Render();
  auto s = ParseSamples(text);
  EXPECT_EQ(s.at("spawnpoint_gpu_utilisation_ratio{gpu=\"3\",UUID=\"GPU-3\",pci_bus_id=\"0000:07:"
                 "00.0\",model_name=\"NVIDIA A100-SXM4-80GB\",Hostname=\"gpu-node-7\",namespace="
                 "\"ml\",pod=\"resnet-node-0\",container=\"trainer\",rank=\"0\",job=\"resnet\"}"),
            0.4);
  EXPECT_EQ(FindSample(s, "spawnpoint_gpu_utilisation_ratio", {"rank=\"1\""}), 0.2);
  EXPECT_EQ(FindSample(s, "spawnpoint_gpu_memory_used_bytes", {"gpu=\"3\""}), (4ull << 30) + 123);
  EXPECT_EQ(FindSample(s, "spawnpoint_gpu_memory_total_bytes", {"gpu=\"3\""}), 80ull << 30);
  EXPECT_EQ(FindSample(s, "spawnpoint_gpu_power_watts", {"gpu=\"1\""}), 110.5);
  EXPECT_EQ(FindSample(s, "spawnpoint_gpu_temperature_celsius", {"gpu=\"1\""}), 41);
  // Without the option, no DCGM names.
  EXPECT_THAT(text, Not(HasSubstr("DCGM_")));
  EXPECT_EQ(status.registry().CollectErrors(), 0) << status.registry().LastCollectError();
}

TEST_F(NodeStatusTest, DcgmCompatibleNamesUseDcgmsUnitsAndLabels) {
  auto o = Options();
  o.dcgm_compatible_names = true;
  NodeStatus status(o);
  auto s = ParseSamples(status.registry().Render());
  const std::string labels =
      "{gpu=\"3\",UUID=\"GPU-3\",device=\"nvidia3\",pci_bus_id=\"0000:07:00.0\",modelName=\"NVIDIA "
      "A100-SXM4-80GB\",Hostname=\"gpu-node-7\",namespace=\"ml\",pod=\"resnet-node-0\",container="
      "\"trainer\",rank=\"0\",job=\"resnet\"}";
  EXPECT_EQ(s.at("DCGM_FI_DEV_GPU_UTIL" + labels), 40);   // percent
  EXPECT_EQ(s.at("DCGM_FI_DEV_FB_USED" + labels), 4096);  // MiB, rounded down
  EXPECT_EQ(s.at("DCGM_FI_DEV_FB_FREE" + labels), 80 * 1024 - 4096 - 1);
  EXPECT_EQ(s.at("DCGM_FI_DEV_GPU_TEMP" + labels), 43);
  EXPECT_EQ(s.at("DCGM_FI_DEV_POWER_USAGE" + labels), 130);
  EXPECT_EQ(status.registry().CollectErrors(), 0) << status.registry().LastCollectError();
}

TEST_F(NodeStatusTest, AFailedGpuReadingDropsTheGpuSeriesAndIsCounted) {
  NodeStatus status(Options());
  {
    std::lock_guard<std::mutex> lock(gpus_.mu);
    gpus_.error = "nvmlDeviceGetCount_v2(): GPU is lost";
  }
  auto s = ParseSamples(status.registry().Render());
  EXPECT_TRUE(std::isnan(FindSample(s, "spawnpoint_gpu_utilisation_ratio")));
  EXPECT_EQ(FindSample(s, "spawnpoint_agent_gpu_sample_errors_total"), 1);
  auto j = status.StatusJson();
  EXPECT_TRUE(j["gpuUtilisation"].is_null());
  EXPECT_THAT(j["gpuError"].get<std::string>(), HasSubstr("GPU is lost"));
  EXPECT_EQ(j["gpus"].size(), 2u);  // still listed, without readings
}

TEST_F(NodeStatusTest, LoaderCountersKeepGoingUpWhenARankRestarts) {
  NodeStatus status(Options());
  status.OnPhase("Running", 2, 2, 0);
  WriteStats(0, 100, 1.5, 0.05, 320, /*died=*/1);
  auto s = ParseSamples(status.registry().Render());
  EXPECT_EQ(FindSample(s, "spawnpoint_loader_batches_total", {"rank=\"0\""}), 100);
  EXPECT_EQ(FindSample(s, "spawnpoint_loader_samples_total", {"rank=\"0\""}), 3200);
  EXPECT_EQ(FindSample(s, "spawnpoint_loader_data_stall_seconds_total", {"rank=\"0\""}), 1.5);
  EXPECT_EQ(FindSample(s, "spawnpoint_loader_worker_restarts_total", {"rank=\"0\"", "died"}), 1);
  // Rank 1 has written nothing yet: no loader series for it.
  EXPECT_TRUE(std::isnan(FindSample(s, "spawnpoint_loader_batches_total", {"rank=\"1\""})));

  // The rank restarted: its new Loader counts from zero again.
  WriteStats(0, 7, 0.25, 0.01, 300, /*died=*/0);
  s = ParseSamples(status.registry().Render());
  EXPECT_EQ(FindSample(s, "spawnpoint_loader_batches_total", {"rank=\"0\""}), 107);
  EXPECT_EQ(FindSample(s, "spawnpoint_loader_data_stall_seconds_total", {"rank=\"0\""}), 1.75);
  EXPECT_EQ(FindSample(s, "spawnpoint_loader_worker_restarts_total", {"rank=\"0\"", "died"}), 1);
  WriteStats(0, 10, 0.5, 0.01, 300, /*died=*/2);
  s = ParseSamples(status.registry().Render());
  EXPECT_EQ(FindSample(s, "spawnpoint_loader_batches_total", {"rank=\"0\""}), 110);
  EXPECT_EQ(FindSample(s, "spawnpoint_loader_worker_restarts_total", {"rank=\"0\"", "died"}), 3);
  EXPECT_EQ(FindSample(s, "spawnpoint_loader_data_stall_ratio", {"rank=\"0\""}), 0.01);
  EXPECT_EQ(FindSample(s, "spawnpoint_loader_queue_depth", {"rank=\"0\""}), 2);
  EXPECT_EQ(FindSample(s, "spawnpoint_loader_active_workers", {"rank=\"0\""}), 4);
}

TEST_F(NodeStatusTest, RanksUpDownRestartsAndFailuresFollowTheGang) {
  auto o = Options();
  o.restart_count = 2;  // a pod of the job's third attempt
  NodeStatus status(o);
  auto s = ParseSamples(status.registry().Render());
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_up", {"rank=\"0\""}), 0);
  EXPECT_EQ(FindSample(s, "spawnpoint_agent_phase", {"phase=\"Starting\""}), 1);
  EXPECT_EQ(FindSample(s, "spawnpoint_agent_restarts_total"), 2);
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_restarts_total", {"rank=\"1\""}), 2);
  EXPECT_EQ(FindSample(s, "spawnpoint_agent_ranks"), 2);

  status.OnPhase("Running", 2, 2, 2);
  s = ParseSamples(status.registry().Render());
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_up", {"rank=\"0\""}), 1);
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_up", {"rank=\"1\""}), 1);
  EXPECT_EQ(FindSample(s, "spawnpoint_agent_ranks_up"), 2);
  EXPECT_EQ(FindSample(s, "spawnpoint_agent_phase", {"phase=\"Running\""}), 1);
  EXPECT_EQ(FindSample(s, "spawnpoint_agent_phase", {"phase=\"Starting\""}), 0);

  status.OnRankFailure(1, "OOMKilled");
  status.OnPhase("Running", 1, 2, 2);  // a status tick while the other is being stopped
  s = ParseSamples(status.registry().Render());
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_up", {"rank=\"0\""}), 1);
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_up", {"rank=\"1\""}), 0);
  EXPECT_EQ(FindSample(s, "spawnpoint_agent_ranks_up"), 1);
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_failures_total", {"rank=\"1\"", "OOMKilled"}), 1);

  status.OnPhase("Restarting", 0, 0, 3);
  s = ParseSamples(status.registry().Render());
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_up", {"rank=\"0\""}), 0);
  EXPECT_EQ(FindSample(s, "spawnpoint_agent_restarts_total"), 3);
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_restarts_total", {"rank=\"0\""}), 3);
  EXPECT_EQ(FindSample(s, "spawnpoint_agent_phase", {"phase=\"Restarting\""}), 1);
  EXPECT_EQ(status.StatusJson()["phase"], "Restarting");

  status.OnPhase("Running", 2, 2, 3);
  s = ParseSamples(status.registry().Render());
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_up", {"rank=\"1\""}), 1);
  EXPECT_EQ(FindSample(s, "spawnpoint_agent_restarts_total"), 3);  // no double count

  status.OnPhase("Succeeded", 0, 0, 3);
  s = ParseSamples(status.registry().Render());
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_up", {"rank=\"1\""}), 0);
  EXPECT_EQ(FindSample(s, "spawnpoint_agent_phase", {"phase=\"Succeeded\""}), 1);
}

TEST_F(NodeStatusTest, StatusDocumentAggregatesWhatTheOperatorReads) {
  NodeStatus status(Options());
  auto j = status.StatusJson();
  EXPECT_EQ(j["job"], "resnet");
  EXPECT_EQ(j["namespace"], "ml");
  EXPECT_EQ(j["pod"], "resnet-node-0");
  EXPECT_EQ(j["phase"], "Starting");
  EXPECT_EQ(j["ranks"], 2);
  EXPECT_EQ(j["ranksUp"], 0);
  EXPECT_EQ(j["restarts"], 0);
  EXPECT_DOUBLE_EQ(j["gpuUtilisation"].get<double>(), 0.3);
  EXPECT_TRUE(j["dataStall"].is_null());  // no loader statistics yet
  EXPECT_TRUE(j["samplesPerSecond"].is_null());
  EXPECT_EQ(j["gpus"][0]["uuid"], "GPU-3");
  EXPECT_EQ(j["gpus"][0]["rank"], 0);
  EXPECT_EQ(j["gpus"][0]["utilisation"], 0.4);
  EXPECT_EQ(j["gpus"][1]["powerWatts"], 110.5);

  status.OnPhase("Running", 2, 2, 0);
  WriteStats(0, 10, 0.1, 0.02, 300);
  WriteStats(1, 10, 0.1, 0.06, 200);
  j = status.StatusJson();
  EXPECT_EQ(j["ranksUp"], 2);
  EXPECT_DOUBLE_EQ(j["dataStall"].get<double>(), 0.04);
  EXPECT_DOUBLE_EQ(j["samplesPerSecond"].get<double>(), 500);
  // The shape the operator's reader takes apart: loader[].stats.{dataStall,samplesPerSecond}.
  EXPECT_EQ(j["loader"][1]["rank"], 1);
  EXPECT_EQ(j["loader"][1]["up"], true);
  EXPECT_EQ(j["loader"][1]["stats"]["dataStall"], 0.06);

  // Down ranks deliver nothing, whatever their last statistics said.
  status.OnPhase("Restarting", 0, 0, 1);
  j = status.StatusJson();
  EXPECT_EQ(j["samplesPerSecond"], 0);
  EXPECT_TRUE(j["dataStall"].is_null());
  EXPECT_EQ(j["restarts"], 1);
  auto s = ParseSamples(status.registry().Render());
  EXPECT_EQ(FindSample(s, "spawnpoint_loader_samples_per_second", {"rank=\"0\""}), 0);
}

TEST_F(NodeStatusTest, ACpuJobHasNoGpuSeriesAndANullGpuUtilisation) {
  NodeStatus status(Options(/*with_gpus=*/false));
  const std::string text = status.registry().Render();
  EXPECT_THAT(text, Not(HasSubstr("spawnpoint_gpu_")));
  EXPECT_THAT(text, HasSubstr("gpu_backend=\"none\""));
  auto j = status.StatusJson();
  EXPECT_TRUE(j["gpuUtilisation"].is_null());
  EXPECT_TRUE(j["gpus"].empty());
}

TEST_F(NodeStatusTest, PoolExitsByReasonAreExported) {
  auto o = Options(false);
  o.pool_status = [] {
    return std::vector<nlohmann::json>{
        {{"rank", 0}, {"exitsByReason", {{"Killed", 2}, {"OOMKilled", 1}}}},
        {{"rank", 1}, {"exitsByReason", nlohmann::json::object()}}};
  };
  NodeStatus status(o);
  auto s = ParseSamples(status.registry().Render());
  EXPECT_EQ(FindSample(s, "spawnpoint_loader_worker_exits_total", {"rank=\"0\"", "Killed"}), 2);
  EXPECT_EQ(FindSample(s, "spawnpoint_loader_worker_exits_total", {"reason=\"OOMKilled\""}), 1);
  EXPECT_EQ(status.StatusJson()["loader"][0]["pool"]["exitsByReason"]["Killed"], 2);
}

// One rank's record as the stall monitor reads it: `durations_ms` the ring's newest
// durations (oldest first), the last step ending at `last_s`, the attempt started at
// `started_s` (seconds on the monotonic clock).
RankProgress Record(int rank, uint64_t steps, std::vector<uint32_t> durations_ms, double last_s,
                    double started_s, progress::StepSource source = progress::StepSource::kLoader) {
  RankProgress p;
  p.rank = rank;
  p.started_ns = static_cast<int64_t>(started_s * 1e9);
  p.snapshot.steps = steps;
  p.snapshot.last_step_ns = steps > 0 ? static_cast<int64_t>(last_s * 1e9) : 0;
  p.snapshot.source = steps > 0 ? source : progress::StepSource::kNone;
  for (uint32_t ms : durations_ms) p.snapshot.recent_us.push_back(ms * 1000);
  return p;
}

constexpr int64_t Ns(double seconds) { return static_cast<int64_t>(seconds * 1e9); }

TEST_F(NodeStatusTest, ProgressIsEmptyAndTheStallNullBeforeTheFirstTick) {
  NodeStatus status(Options(false));
  auto j = status.StatusJson();
  ASSERT_TRUE(j.contains("progress"));
  EXPECT_TRUE(j["progress"].is_array());
  EXPECT_TRUE(j["progress"].empty());
  ASSERT_TRUE(j.contains("medianStepSeconds"));
  EXPECT_TRUE(j["medianStepSeconds"].is_null());
  ASSERT_TRUE(j.contains("stall"));
  EXPECT_TRUE(j["stall"].is_null());
  auto s = ParseSamples(status.registry().Render());
  for (const char* rank : {"rank=\"0\"", "rank=\"1\""}) {
    EXPECT_EQ(FindSample(s, "spawnpoint_rank_stalled", {rank}), 0) << rank;
    EXPECT_EQ(FindSample(s, "spawnpoint_rank_steps_total", {rank}), 0) << rank;
    EXPECT_EQ(FindSample(s, "spawnpoint_rank_step_seconds_count", {rank}), 0) << rank;
  }
  // The age is not known before the first reading.
  EXPECT_TRUE(std::isnan(FindSample(s, "spawnpoint_rank_last_step_age_seconds")));
}

TEST_F(NodeStatusTest, ProgressTicksCountEachStepOnceAndKeepCountingAcrossAttempts) {
  NodeStatus status(Options(false));
  // Rank 0 made 3 steps (0.1, 0.2, 0.3 s), the last at 10 s; rank 1 none since it started.
  status.OnProgress({Record(1, 0, {}, 0, 1), Record(0, 3, {100, 200, 300}, 10, 1)}, 0.2, Ns(10.5));
  auto j = status.StatusJson();
  ASSERT_EQ(j["progress"].size(), 2u);
  EXPECT_EQ(j["progress"][0],
            nlohmann::json::parse(R"({"rank": 0, "steps": 3, "lastStepAgeSeconds": 0.5,
                                      "stepSource": "loader", "stalled": false,
                                      "busySeconds": null, "waitSeconds": null})"));
  EXPECT_EQ(j["progress"][1]["rank"], 1) << "in rank order";
  EXPECT_EQ(j["progress"][1]["steps"], 0);
  EXPECT_TRUE(j["progress"][1]["lastStepAgeSeconds"].is_null()) << "no step yet";
  EXPECT_TRUE(j["progress"][1]["stepSource"].is_null());
  EXPECT_DOUBLE_EQ(j["medianStepSeconds"].get<double>(), 0.2);
  auto s = ParseSamples(status.registry().Render());
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_steps_total", {"rank=\"0\""}), 3);
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_step_seconds_count", {"rank=\"0\""}), 3);
  EXPECT_DOUBLE_EQ(FindSample(s, "spawnpoint_rank_step_seconds_sum", {"rank=\"0\""}), 0.6);
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_step_seconds_bucket", {"rank=\"0\"", "le=\"+Inf\""}), 3);
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_step_seconds_bucket", {"rank=\"0\"", "le=\"0.01\""}), 0);
  EXPECT_DOUBLE_EQ(FindSample(s, "spawnpoint_rank_last_step_age_seconds", {"rank=\"0\""}), 0.5);
  // Before its first step, the age counts from the rank's start.
  EXPECT_DOUBLE_EQ(FindSample(s, "spawnpoint_rank_last_step_age_seconds", {"rank=\"1\""}), 9.5);

  // The same reading again observes nothing twice; two new steps observe the ring's newest two.
  status.OnProgress({Record(0, 3, {100, 200, 300}, 10, 1), Record(1, 0, {}, 0, 1)}, 0.2, Ns(11));
  status.OnProgress({Record(0, 5, {100, 200, 300, 400, 500}, 12, 1), Record(1, 1, {2000}, 12, 1)},
                    0.3, Ns(12.25));
  s = ParseSamples(status.registry().Render());
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_steps_total", {"rank=\"0\""}), 5);
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_step_seconds_count", {"rank=\"0\""}), 5);
  EXPECT_DOUBLE_EQ(FindSample(s, "spawnpoint_rank_step_seconds_sum", {"rank=\"0\""}), 1.5);
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_steps_total", {"rank=\"1\""}), 1);
  EXPECT_DOUBLE_EQ(FindSample(s, "spawnpoint_rank_step_seconds_sum", {"rank=\"1\""}), 2);
  EXPECT_DOUBLE_EQ(FindSample(s, "spawnpoint_rank_last_step_age_seconds", {"rank=\"1\""}), 0.25);
  j = status.StatusJson();
  EXPECT_EQ(j["progress"][1]["steps"], 1);
  EXPECT_DOUBLE_EQ(j["progress"][1]["lastStepAgeSeconds"].get<double>(), 0.25);

  // A new attempt's record (another start) counts from zero: its steps add to the counter.
  status.OnProgress({Record(0, 2, {50, 50}, 21, 20), Record(1, 0, {}, 0, 20)}, 0.05, Ns(21));
  s = ParseSamples(status.registry().Render());
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_steps_total", {"rank=\"0\""}), 7);
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_step_seconds_count", {"rank=\"0\""}), 7);
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_steps_total", {"rank=\"1\""}), 1);
  EXPECT_EQ(status.StatusJson()["progress"][0]["steps"], 2) << "the document shows the attempt's";

  // More steps between two ticks than the ring keeps: all counted, the 256 newest observed.
  status.OnProgress(
      {Record(0, 1002, std::vector<uint32_t>(256, 10), 30, 20, progress::StepSource::kExplicit)},
      0.01, Ns(30));
  s = ParseSamples(status.registry().Render());
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_steps_total", {"rank=\"0\""}), 1007);
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_step_seconds_count", {"rank=\"0\""}), 7 + 256);
  EXPECT_EQ(status.StatusJson()["progress"][0]["stepSource"], "explicit");

  const std::string text = status.registry().Render();
  auto promtool = testing::PromtoolCheckMetrics(text);
  ASSERT_TRUE(promtool)
      << "promtool is not installed: scripts/install-deps.sh (make deps) installs it";
  EXPECT_EQ(promtool->code, 0) << promtool->output << "\n" << text;
  EXPECT_EQ(promtool->output, "");
}

TEST_F(NodeStatusTest, TheNamedStallIsPublishedAndMarksItsRank) {
  const std::string file = dir_.File("status.json");
  auto o = Options(false);
  o.on_document = [file](const std::string& text) {
    EXPECT_TRUE(WriteStatusFile(file, text).ok());
  };
  NodeStatus status(o);
  status.OnProgress({Record(0, 40, {100}, 10, 1), Record(1, 5, {100}, 2, 1)}, 0.1, Ns(10));
  // As StallJson makes it.
  const auto stall = nlohmann::json::parse(R"({"rank": 1, "pod": "resnet-node-0",
      "silentSeconds": 8.0, "medianStepSeconds": 0.1, "beforeFirstStep": false,
      "topFrame": "HangForever", "stackSource": "gdb",
      "message": "rank 1 (pod resnet-node-0) made no step for 8.0 s", "waiting": [0]})");
  status.OnStall(stall);
  // Published at once: the status file has it without a tick or a GET.
  auto j = nlohmann::json::parse(testing::ReadFile(file));
  EXPECT_EQ(j["stall"], stall);
  EXPECT_EQ(j["stall"]["rank"], 1);
  EXPECT_EQ(j["progress"][1]["stalled"], true);
  EXPECT_EQ(j["progress"][0]["stalled"], false) << "the peer waits on it: not stalled";
  auto s = ParseSamples(status.registry().Render());
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_stalled", {"rank=\"1\""}), 1);
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_stalled", {"rank=\"0\""}), 0);

  // Cleared (its culprit stepped again, or a new attempt).
  status.OnStall(nullptr);
  j = nlohmann::json::parse(testing::ReadFile(file));
  EXPECT_TRUE(j["stall"].is_null());
  EXPECT_EQ(j["progress"][1]["stalled"], false);
  s = ParseSamples(status.registry().Render());
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_stalled", {"rank=\"1\""}), 0);
}

TEST_F(NodeStatusTest, TheStragglerIsPublishedWithEveryRanksWorkAndWait) {
  const std::string file = dir_.File("status.json");
  auto o = Options(false);
  o.on_document = [file](const std::string& text) {
    EXPECT_TRUE(WriteStatusFile(file, text).ok());
  };
  NodeStatus status(o);
  auto s = ParseSamples(status.registry().Render());
  EXPECT_EQ(FindSample(s, "spawnpoint_job_straggler_ratio"), 0) << "not judged yet";
  EXPECT_TRUE(status.StatusJson()["straggler"].is_null());
  status.OnProgress({Record(0, 40, {200}, 10, 1), Record(1, 40, {200}, 10, 1)}, 0.2, Ns(10));
  // As StragglerJson makes it.
  const auto straggler = nlohmann::json::parse(R"({"rank": 1, "pod": "resnet-node-0",
      "ratio": 1.96, "busySeconds": 0.196, "peersBusySeconds": 0.1, "windowSteps": 20,
      "message": "rank 1 (pod resnet-node-0) is 1.96x slower than the other ranks"})");
  status.OnStraggler({RankBusy{0, 0.1, 0.1}, RankBusy{1, 0.196, 0.004}}, 1.96, straggler, true);
  auto j = nlohmann::json::parse(testing::ReadFile(file));  // published at once
  EXPECT_EQ(j["straggler"], straggler);
  EXPECT_DOUBLE_EQ(j["progress"][0]["busySeconds"].get<double>(), 0.1);
  EXPECT_DOUBLE_EQ(j["progress"][1]["busySeconds"].get<double>(), 0.196);
  EXPECT_DOUBLE_EQ(j["progress"][1]["waitSeconds"].get<double>(), 0.004);
  s = ParseSamples(status.registry().Render());
  EXPECT_DOUBLE_EQ(FindSample(s, "spawnpoint_job_straggler_ratio"), 1.96);

  // A tick without a change is not published; a rank without a window shows null.
  status.OnStraggler({RankBusy{0, 0.1, 0.1}, RankBusy{1}}, 0, nullptr, false);
  EXPECT_EQ(nlohmann::json::parse(testing::ReadFile(file))["straggler"], straggler);
  j = status.StatusJson();
  EXPECT_TRUE(j["straggler"].is_null());
  EXPECT_TRUE(j["progress"][1]["busySeconds"].is_null());
  s = ParseSamples(status.registry().Render());
  EXPECT_EQ(FindSample(s, "spawnpoint_job_straggler_ratio"), 0);
}

// Every spawnpoint_rank_* row of docs/metrics.md's agent tables is exported with its type
// (the loader's and the GPUs' series need readings and are tested above).
TEST_F(NodeStatusTest, ExportsEveryDocumentedRankMetricWithItsType) {
  std::ifstream in(std::string(SOURCE_DIR) + "/docs/metrics.md");
  std::map<std::string, std::string> documented;
  static const std::regex row(R"(^\| `(spawnpoint_rank_[a-z_]+)` \| (counter|gauge|histogram) \|)");
  bool agent = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("## ", 0) == 0) agent = line.find("Agent metrics") != std::string::npos;
    std::smatch m;
    if (agent && std::regex_search(line, m, row)) documented[m[1]] = m[2];
  }
  ASSERT_GE(documented.size(), 7u) << "the rank rows of docs/metrics.md were not found";
  NodeStatus status(Options(false));
  status.OnProgress({Record(0, 1, {100}, 1, 0), Record(1, 0, {}, 0, 0)}, 0.1, Ns(1));
  status.OnRankFailure(1, "UserError");  // failures have series once there is one
  const std::string text = status.registry().Render();
  for (const auto& [name, type] : documented) {
    EXPECT_NE(text.find("# TYPE " + name + " " + type + "\n"), std::string::npos)
        << name << " (" << type << ") is documented but not exported";
  }
}

// Top-level keys, and those of the first loader entry: what must not change across phases.
std::set<std::string> Keys(const nlohmann::json& j) {
  std::set<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.insert(k);
  for (const auto& [k, v] : j["loader"][0].items()) keys.insert("loader[]." + k);
  for (const auto& [k, v] : j["gpus"][0].items()) keys.insert("gpus[]." + k);
  return keys;
}

// One document: what /status serves is, byte for byte, what the status file holds, at
// every phase; members stay the members and no field disappears.
TEST_F(NodeStatusTest, TheStatusFileIsTheDocumentStatusServes) {
  const std::string file = dir_.File("status.json");
  auto o = Options();
  o.on_document = [file](const std::string& text) {
    EXPECT_TRUE(WriteStatusFile(file, text).ok());
  };
  NodeStatus status(o);
  auto endpoint = AgentEndpoint::Start("127.0.0.1:0", &status);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().message();
  const int port = (*endpoint)->port();
  auto get = [&] {
    auto r = testing::HttpGet("127.0.0.1", port, "/status");
    return r.ok() && r->status == 200 ? r->body : "GET /status failed";
  };

  status.OnPhase("Running", 2, 2, 0);
  const std::string running_file = testing::ReadFile(file);
  EXPECT_EQ(running_file, status.LastDocument());
  WriteStats(0, 10, 0.5, 0.05, 320);
  const std::string served = get();
  EXPECT_EQ(served, testing::ReadFile(file)) << "a GET publishes the document it serves";
  EXPECT_NE(served, running_file) << "the loader statistics moved";
  auto running = nlohmann::json::parse(served);
  EXPECT_EQ(running["members"], 2);
  EXPECT_EQ(running["membersUp"], 2);
  EXPECT_TRUE(running["lastFailure"].is_null());
  EXPECT_EQ(running["loader"][0]["stats"]["batches"], 10);
  EXPECT_TRUE(running["loader"][1]["stats"].is_null()) << "no statistics yet, but the field";

  // A failure: the last document the endpoint served and the file are the same.
  gpus_.samples[0].power_watts.reset();  // a reading the backend no longer gives
  status.OnRankFailure(1, "UserError",
                       {{"rank", 1},
                        {"localRank", 1},
                        {"nodeRank", 0},
                        {"exitCode", 3},
                        {"reason", "UserError"},
                        {"message", "user error: exited with code 3"}});
  status.OnPhase("Failed", 0, 0, 0);
  const std::string failed_file = testing::ReadFile(file);
  auto failed = nlohmann::json::parse(failed_file);
  EXPECT_EQ(failed["phase"], "Failed");
  EXPECT_EQ(failed["members"], 2) << "members stay the number of members";
  EXPECT_EQ(failed["membersUp"], 0);
  EXPECT_EQ(failed["lastFailure"]["exitCode"], 3);
  EXPECT_TRUE(failed["lastFailure"]["signal"].is_null());
  EXPECT_EQ(Keys(failed), Keys(running));
  const std::string last = get();
  EXPECT_EQ(last, testing::ReadFile(file));
  EXPECT_EQ(nlohmann::json::parse(last)["phase"], "Failed");

  status.OnPhase("Succeeded", 0, 0, 0);
  const std::string succeeded = get();
  EXPECT_EQ(succeeded, testing::ReadFile(file));
  EXPECT_EQ(Keys(nlohmann::json::parse(testing::ReadFile(file))), Keys(running));
}

}  // namespace
}  // namespace spawnpoint::agent
