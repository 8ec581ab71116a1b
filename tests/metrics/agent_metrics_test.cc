// The real agent's endpoint: `spawnpoint-agent run` on the fake NVML library (known
// utilisation, memory, power and temperature per GPU) with real ranks and loader pools,
// scraped while it runs. Its output must pass `promtool check metrics`.
#include <sys/socket.h>
#include <sys/stat.h>

#include <chrono>
#include <regex>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "metrics/server.h"
#include "tests/metrics/agent_harness.h"
#include "tests/metrics/http_client.h"
#include "tests/metrics/sample_parser.h"

namespace spawnpoint::testing {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr milliseconds kDeadline{60'000};

std::vector<std::string> FakeNvmlFlags() {
  return {"--gpu-backend", "nvml",           "--nvml-library",
          FAKE_NVML_PATH,  "--metrics-addr", "127.0.0.1:0"};
}

std::map<std::string, std::string> GpuEnv() {
  auto env = AgentUnderTest::DefaultEnv();
  env["FAKE_NVML_CONFIG"] = FAKE_NVML_CONFIG_DIR "/eight_gpus_two_numa.conf";
  return env;
}

// Scrapes until `ready` holds for the parsed samples; the last scrape's text.
std::string ScrapeUntil(AgentUnderTest& agent, int port,
                        const std::function<bool(const std::map<std::string, double>&)>& ready) {
  std::string text;
  WaitUntil(
      [&] {
        text = agent.Get(port, "/metrics");
        return !text.empty() && ready(ParseSamples(text));
      },
      kDeadline);
  return text;
}

bool Has(const std::map<std::string, double>& s, const std::string& name,
         std::initializer_list<std::string> needles, double at_least) {
  const double v = FindSample(s, name, needles);
  return !std::isnan(v) && v >= at_least;
}

// GPUs in topology order with unknown NUMA nodes (the real /sys has none of the fake
// buses): bus 07 (NVML index 3, 40 %, 4 GiB, 130 W, 43 C) for rank 0, bus 0f (index 1,
// 20 %, 2 GiB, 110 W, 41 C) for rank 1.
TEST(AgentMetricsTest, GpuJobMetricsCarryTheGpuValuesAndPassPromtool) {
  AgentUnderTest agent(AGENT_BIN, LoaderGpuJobManifest(LOADER_TRAINER_BIN, 2), FakeNvmlFlags(),
                       GpuEnv());
  auto ports = agent.WaitForEndpoints();
  ASSERT_EQ(ports.size(), 1u) << agent.Stderr();
  const int port = ports[0];

  // Loader statistics arrive about a second after the ranks start.
  const std::string text = ScrapeUntil(agent, port, [](const auto& s) {
    return Has(s, "spawnpoint_loader_batches_total", {"rank=\"0\""}, 1) &&
           Has(s, "spawnpoint_loader_batches_total", {"rank=\"1\""}, 1) &&
           Has(s, "spawnpoint_rank_up", {"rank=\"1\""}, 1) &&
           Has(s, "spawnpoint_rank_step_seconds_count", {"rank=\"0\""}, 1) &&
           Has(s, "spawnpoint_rank_step_seconds_count", {"rank=\"1\""}, 1);
  });
  auto s = ParseSamples(text);
  const std::string rank0 =
      "{gpu=\"3\",UUID=\"GPU-6b7c1a2e-0000-4000-8000-000000000007\",pci_bus_id=\"0000:07:00.0\","
      "model_name=\"NVIDIA A100-SXM4-80GB\",Hostname=\"gpu-node-7\",namespace=\"ml\",pod="
      "\"metrics-demo-node-0\",container=\"trainer\",rank=\"0\",job=\"metrics-demo\"}";
  ASSERT_EQ(s.count("spawnpoint_gpu_utilisation_ratio" + rank0), 1u) << text;
  EXPECT_EQ(s.at("spawnpoint_gpu_utilisation_ratio" + rank0), 0.4);
  EXPECT_EQ(s.at("spawnpoint_gpu_memory_used_bytes" + rank0), 4294967296.0);
  EXPECT_EQ(s.at("spawnpoint_gpu_memory_total_bytes" + rank0), 85899345920.0);
  EXPECT_EQ(s.at("spawnpoint_gpu_power_watts" + rank0), 130);
  EXPECT_EQ(s.at("spawnpoint_gpu_temperature_celsius" + rank0), 43);
  EXPECT_EQ(FindSample(s, "spawnpoint_gpu_utilisation_ratio", {"rank=\"1\"", "gpu=\"1\""}), 0.2);
  EXPECT_EQ(FindSample(s, "spawnpoint_agent_phase", {"phase=\"Running\""}), 1);
  EXPECT_EQ(FindSample(s, "spawnpoint_agent_ranks_up"), 2);
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_up", {"rank=\"0\""}), 1);
  EXPECT_EQ(FindSample(s, "spawnpoint_agent_info", {"gpu_backend=\"nvml\""}), 1);
  EXPECT_EQ(FindSample(s, "spawnpoint_loader_active_workers", {"rank=\"0\""}), 1);
  // The loader's Next() counts the ranks' steps (the stall monitor reads them every tick).
  EXPECT_GE(FindSample(s, "spawnpoint_rank_steps_total", {"rank=\"1\""}), 1);
  EXPECT_GE(FindSample(s, "spawnpoint_rank_last_step_age_seconds", {"rank=\"1\""}), 0);
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_stalled", {"rank=\"0\""}), 0);
  EXPECT_THAT(text, Not(HasSubstr("DCGM_")));

  // Counters move between scrapes while the trainer consumes.
  const double before = FindSample(s, "spawnpoint_loader_samples_total", {"rank=\"0\""});
  ScrapeUntil(agent, port, [&](const auto& later) {
    return FindSample(later, "spawnpoint_loader_samples_total", {"rank=\"0\""}) > before;
  });
  EXPECT_GT(FindSample(ParseSamples(agent.Get(port, "/metrics")), "spawnpoint_loader_samples_total",
                       {"rank=\"0\""}),
            before);

  auto metrics = HttpGet("127.0.0.1", port, "/metrics");
  ASSERT_TRUE(metrics.ok());
  EXPECT_EQ(metrics->headers["content-type"], "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(HttpGet("127.0.0.1", port, "/healthz")->status, 200);
  EXPECT_EQ(HttpGet("127.0.0.1", port, "/readyz")->status, 200);

  auto status = HttpGet("127.0.0.1", port, "/status");
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->headers["content-type"], "application/json");
  auto j = nlohmann::json::parse(status->body);
  EXPECT_EQ(j["phase"], "Running");
  EXPECT_EQ(j["ranks"], 2);
  EXPECT_EQ(j["ranksUp"], 2);
  EXPECT_EQ(j["restarts"], 0);
  EXPECT_NEAR(j["gpuUtilisation"].get<double>(), 0.3, 1e-9);
  EXPECT_GE(j["dataStall"].get<double>(), 0.0);
  EXPECT_LE(j["dataStall"].get<double>(), 1.0);
  EXPECT_GT(j["samplesPerSecond"].get<double>(), 0.0);
  EXPECT_EQ(j["gpus"][0]["pciBusId"], "0000:07:00.0");
  EXPECT_EQ(j["loader"][1]["stats"]["poolWorkers"], 1);
  ASSERT_EQ(j["progress"].size(), 2u) << j.dump();
  EXPECT_EQ(j["progress"][1]["rank"], 1);
  EXPECT_GE(j["progress"][1]["steps"].get<uint64_t>(), 1u);
  EXPECT_EQ(j["progress"][1]["stepSource"], "loader");
  EXPECT_EQ(j["progress"][1]["stalled"], false);
  EXPECT_TRUE(j["stall"].is_null());

  auto promtool = PromtoolCheckMetrics(text);
  ASSERT_TRUE(promtool)
      << "promtool is not installed: scripts/install-deps.sh (make deps) installs it";
  EXPECT_EQ(promtool->code, 0) << promtool->output << "\n" << text;
  EXPECT_EQ(promtool->output, "");
  EXPECT_EQ(agent.Stop(), 143) << agent.Stderr();  // 128 + SIGTERM, as docs/running.md says
}

// Grafana dashboard 12239 selects DCGM_FI_DEV_* by instance and gpu, in DCGM's units.
TEST(AgentMetricsTest, DcgmCompatibleNamesHaveDcgmsUnitsAndLabels) {
  auto flags = FakeNvmlFlags();
  flags.push_back("--dcgm-compatible-names");
  AgentUnderTest agent(AGENT_BIN, LoaderGpuJobManifest(LOADER_TRAINER_BIN, 2), flags, GpuEnv());
  auto ports = agent.WaitForEndpoints();
  ASSERT_EQ(ports.size(), 1u) << agent.Stderr();
  const std::string text = ScrapeUntil(
      agent, ports[0], [](const auto& s) { return Has(s, "DCGM_FI_DEV_GPU_UTIL", {}, 0); });
  auto s = ParseSamples(text);
  const std::string gpu3 =
      "{gpu=\"3\",UUID=\"GPU-6b7c1a2e-0000-4000-8000-000000000007\",device=\"nvidia3\","
      "pci_bus_id=\"0000:07:00.0\",modelName=\"NVIDIA A100-SXM4-80GB\",Hostname=\"gpu-node-7\","
      "namespace=\"ml\",pod=\"metrics-demo-node-0\",container=\"trainer\",rank=\"0\","
      "job=\"metrics-demo\"}";
  ASSERT_EQ(s.count("DCGM_FI_DEV_GPU_UTIL" + gpu3), 1u) << text;
  EXPECT_EQ(s.at("DCGM_FI_DEV_GPU_UTIL" + gpu3), 40);
  EXPECT_EQ(s.at("DCGM_FI_DEV_FB_USED" + gpu3), 4096);
  EXPECT_EQ(s.at("DCGM_FI_DEV_FB_FREE" + gpu3), 81920 - 4096);
  EXPECT_EQ(s.at("DCGM_FI_DEV_GPU_TEMP" + gpu3), 43);
  EXPECT_EQ(s.at("DCGM_FI_DEV_POWER_USAGE" + gpu3), 130);
  EXPECT_EQ(FindSample(s, "DCGM_FI_DEV_GPU_UTIL", {"gpu=\"1\"", "device=\"nvidia1\""}), 20);
  // Our own names are still there.
  EXPECT_EQ(FindSample(s, "spawnpoint_gpu_utilisation_ratio", {"gpu=\"3\""}), 0.4);

  auto promtool = PromtoolCheckMetrics(text);
  ASSERT_TRUE(promtool)
      << "promtool is not installed: scripts/install-deps.sh (make deps) installs it";
  // DCGM's own label name modelName is camelCase, which promtool's linter flags (exit 3).
  // That must be the only complaint: no parse error, nothing about our own families.
  std::istringstream lines(promtool->output);
  std::string line;
  int complaints = 0;
  while (std::getline(lines, line)) {
    ++complaints;
    EXPECT_THAT(line, ::testing::MatchesRegex(
                          "DCGM_FI_DEV_[A-Z_]+ label names should be written in 'snake_case' not "
                          "'camelCase'"));
  }
  EXPECT_GT(complaints, 0);
  EXPECT_EQ(promtool->code, 3) << promtool->output;
}

// A rank killed once: the failure by reason, the restart on every rank, both ranks up again.
TEST(AgentMetricsTest, RankFailuresAndGangRestartsAreCounted) {
  TempDir marks;
  AgentUnderTest agent(AGENT_BIN,
                       TestRankJobManifest(TEST_RANK_BIN, 1, 2,
                                           {"--fail-rank", "1", "--signal", "9", "--after-ms",
                                            "300", "--fail-once", marks.path(), "--run-ms", "-1"},
                                           /*max_restarts=*/1),
                       {"--metrics-addr", "127.0.0.1:0"});
  auto ports = agent.WaitForEndpoints();
  ASSERT_EQ(ports.size(), 1u) << agent.Stderr();
  const std::string text = ScrapeUntil(agent, ports[0], [](const auto& s) {
    return Has(s, "spawnpoint_agent_restarts_total", {}, 1) &&
           Has(s, "spawnpoint_agent_ranks_up", {}, 2);
  });
  auto s = ParseSamples(text);
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_failures_total", {"rank=\"1\"", "reason=\"Killed\""}), 1)
      << text;
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_restarts_total", {"rank=\"0\""}), 1);
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_restarts_total", {"rank=\"1\""}), 1);
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_up", {"rank=\"0\""}), 1);
  EXPECT_EQ(FindSample(s, "spawnpoint_rank_up", {"rank=\"1\""}), 1);
  EXPECT_EQ(FindSample(s, "spawnpoint_agent_phase", {"phase=\"Running\""}), 1);
  EXPECT_THAT(text, Not(HasSubstr("spawnpoint_gpu_")));  // a CPU job
  auto j = nlohmann::json::parse(agent.Get(ports[0], "/status"));
  EXPECT_EQ(j["restarts"], 1);
  EXPECT_TRUE(j["gpuUtilisation"].is_null());
  EXPECT_TRUE(j["samplesPerSecond"].is_null());  // spawnpoint-test-rank has no loader

  auto promtool = PromtoolCheckMetrics(text);
  ASSERT_TRUE(promtool)
      << "promtool is not installed: scripts/install-deps.sh (make deps) installs it";
  EXPECT_EQ(promtool->code, 0) << promtool->output;
}

// Top-level keys, and those of a loader entry: what must not change across phases.
std::set<std::string> DocumentKeys(const nlohmann::json& j) {
  std::set<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.insert(k);
  for (const auto& [k, v] : j["loader"][0].items()) keys.insert("loader[]." + k);
  return keys;
}

// One status document (docs/status.md): while the job runs, what /status serves is byte for
// byte what --status-file holds; the final file has the final phase, the same members and
// every field; a failure names the rank, its exit code and cause.
TEST(AgentMetricsTest, TheStatusFileIsTheDocumentStatusServesAtEveryPhase) {
  for (int code : {0, 3}) {
    SCOPED_TRACE("rank 1 exits " + std::to_string(code));
    TempDir dir;
    const std::string file = dir.File("status.json");
    // Ranks that wait for the test's word, then rank 1 exits with `code`.
    WriteFile(dir.File("rank.sh"),
              "#!/bin/sh\nwhile [ ! -e \"$1/go\" ]; do sleep 0.05; done\n"
              "if [ \"$RANK\" = 1 ]; then exit \"$2\"; fi\nexit 0\n");
    ASSERT_EQ(chmod(dir.File("rank.sh").c_str(), 0755), 0);
    const std::string manifest =
        "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\n"
        "metadata: {name: status-demo, namespace: ml}\n"
        "spec:\n  procsPerNode: 2\n  shmSize: 64Mi\n  loader: {workersPerRank: 0}\n"
        "  template:\n    spec:\n      containers:\n      - name: trainer\n"
        "        command: [\"" +
        dir.File("rank.sh") + "\", \"" + dir.path() + "\", \"" + std::to_string(code) + "\"]\n";
    // No status tick during the test: only its own GETs publish while the ranks wait.
    AgentUnderTest agent(
        AGENT_BIN, manifest,
        {"--metrics-addr", "127.0.0.1:0", "--status-file", file, "--status-interval", "3600"});
    auto ports = agent.WaitForEndpoints();
    ASSERT_EQ(ports.size(), 1u) << agent.Stderr();
    const int port = ports[0];

    std::string served;
    ASSERT_TRUE(WaitUntil(
        [&] {
          served = agent.Get(port, "/status");
          auto j = nlohmann::json::parse(served, nullptr, false);
          return j.is_object() && j["phase"] == "Running" && j["membersUp"] == 2;
        },
        kDeadline))
        << served << agent.Stderr();
    for (int i = 0; i < 3; ++i) {
      const std::string before = ReadFile(file);
      served = agent.Get(port, "/status");
      EXPECT_EQ(ReadFile(file), served) << "the file is the document /status served";
      EXPECT_NE(served, before) << "each reading is a new document";
    }
    auto running = nlohmann::json::parse(served);
    EXPECT_EQ(running["members"], 2);
    EXPECT_EQ(running["ranks"], 2);
    EXPECT_EQ(running["ranksUp"], 2);
    EXPECT_EQ(running["loader"].size(), 2u);
    EXPECT_TRUE(running["lastFailure"].is_null());

    WriteFile(dir.File("go"), "");
    EXPECT_EQ(agent.process().Wait(kDeadline), code == 0 ? 0 : 1) << agent.Stderr();
    auto final_doc = nlohmann::json::parse(ReadFile(file), nullptr, false);
    ASSERT_TRUE(final_doc.is_object()) << ReadFile(file);
    EXPECT_EQ(final_doc["phase"], code == 0 ? "Succeeded" : "Failed");
    EXPECT_EQ(final_doc["members"], 2) << "members stay the number of members";
    EXPECT_EQ(final_doc["membersUp"], 0);
    EXPECT_EQ(final_doc["ranks"], 2);
    EXPECT_EQ(final_doc["loader"].size(), 2u);
    EXPECT_EQ(final_doc["loader"][1]["up"], false);
    EXPECT_EQ(DocumentKeys(final_doc), DocumentKeys(running));
    EXPECT_EQ(final_doc["job"], "status-demo");
    EXPECT_EQ(final_doc["pod"], "metrics-demo-node-0");
    if (code == 0) {
      EXPECT_TRUE(final_doc["lastFailure"].is_null());
    } else {
      EXPECT_EQ(final_doc["lastFailure"]["rank"], 1);
      EXPECT_EQ(final_doc["lastFailure"]["exitCode"], 3);
      EXPECT_EQ(final_doc["lastFailure"]["reason"], "UserError");
      EXPECT_EQ(final_doc["lastFailure"]["message"], "user error: exited with code 3");
    }
  }
}

// Jobs run their course whether the endpoint is off or its port is taken.
TEST(AgentMetricsTest, OffServesNothingAndABusyPortOnlyWarns) {
  auto busy = metrics::MetricsServer::Start({.address = "127.0.0.1:0"});
  ASSERT_TRUE(busy.ok());
  const std::string manifest = TestRankJobManifest(TEST_RANK_BIN, 1, 2, {"--run-ms", "50"});

  AgentUnderTest taken(AGENT_BIN, manifest,
                       {"--metrics-addr", "127.0.0.1:" + std::to_string((*busy)->port())});
  EXPECT_EQ(taken.process().Wait(kDeadline), 0) << taken.Stderr();
  EXPECT_THAT(taken.Stderr(), HasSubstr("warning: rank-demo: no metrics or status endpoint"));
  EXPECT_THAT(taken.Stderr(), HasSubstr("Address already in use"));
  EXPECT_THAT(taken.Stderr(), HasSubstr("all ranks succeeded"));

  AgentUnderTest off(AGENT_BIN, manifest, {"--metrics-addr", "off"});
  EXPECT_EQ(off.process().Wait(kDeadline), 0) << off.Stderr();
  EXPECT_THAT(off.Stderr(), Not(HasSubstr("metrics on")));
  EXPECT_THAT(off.Stderr(), Not(HasSubstr("warning")));
}

TEST(AgentMetricsTest, ABadAddressIsABadFlag) {
  TestProcess p({AGENT_BIN, "run", "-f", "job.yaml", "--metrics-addr", "localhost"});
  EXPECT_EQ(p.Wait(kDeadline), 2);
  EXPECT_THAT(p.Stderr(), HasSubstr("--metrics-addr: listen address \"localhost\" needs a port"));
}

// A two-node job run on this machine: each node agent serves its own ranks on its own port.
TEST(AgentMetricsTest, LocalNodesEachServeTheirOwnRanks) {
  AgentUnderTest agent(AGENT_BIN, TestRankJobManifest(TEST_RANK_BIN, 2, 1, {"--run-ms", "-1"}),
                       {"--metrics-addr", "127.0.0.1:0"});
  auto ports = agent.WaitForEndpoints(2);
  ASSERT_EQ(ports.size(), 2u) << agent.Stderr();
  EXPECT_NE(ports[0], ports[1]);
  std::set<std::string> ranks_seen;
  for (int port : ports) {
    const std::string text = ScrapeUntil(
        agent, port, [](const auto& s) { return Has(s, "spawnpoint_agent_ranks_up", {}, 1); });
    auto s = ParseSamples(text);
    for (const char* r : {"0", "1"}) {
      if (!std::isnan(FindSample(s, "spawnpoint_rank_up", {std::string("rank=\"") + r + "\""}))) {
        ranks_seen.insert(r);
      }
    }
    EXPECT_EQ(FindSample(s, "spawnpoint_agent_ranks"), 1);
  }
  EXPECT_EQ(ranks_seen, (std::set<std::string>{"0", "1"}));
}

}  // namespace
}  // namespace spawnpoint::testing
