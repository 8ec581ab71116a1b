// A real Prometheus (the Debian package's binary, loopback only, its own config and data
// directory, 1 s scrape interval) scrapes a running agent on the fake NVML library, and
// its HTTP API must return the series and values the fake GPUs and the loader produce.
// Skipped, with the reason, only when the prometheus binary is not installed.
#include <signal.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/metrics/agent_harness.h"
#include "tests/metrics/http_client.h"

namespace spawnpoint::testing {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr milliseconds kDeadline{90'000};

std::string UrlEncode(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

class Prometheus {
 public:
  // Starts prometheus scraping `target` (HOST:PORT) every second. Its web port is picked
  // free just before the start; if another process takes it first, it is tried again.
  Prometheus(const std::string& binary, const std::string& target) {
    WriteFile(dir_.File("prometheus.yml"),
              "global:\n"
              "  scrape_interval: 1s\n"
              "  scrape_timeout: 1s\n"
              "  evaluation_interval: 1s\n"
              "scrape_configs:\n"
              "  - job_name: spawnpoint-agent\n"
              // Our series carry job (the TrainingJob); keep it instead of renaming it to
              // exported_job, as the chart's PodMonitor does (docs/metrics.md).
              "    honor_labels: true\n"
              "    static_configs:\n"
              "      - targets: ['" +
                  target + "']\n");
    for (int attempt = 0; attempt < 3 && port_ == 0; ++attempt) {
      const int port = PickFreePort();
      process_ = std::make_unique<TestProcess>(std::vector<std::string>{
          binary, "--config.file=" + dir_.File("prometheus.yml"),
          "--storage.tsdb.path=" + dir_.File("data"),
          "--web.listen-address=127.0.0.1:" + std::to_string(port), "--log.level=warn"});
      // Ready when its own API answers; a lost port race ends the process instead.
      const bool up = WaitUntil(
          [&] {
            if (!process_->Running()) return true;
            auto r = HttpGet("127.0.0.1", port, "/-/ready", "GET", milliseconds(1000));
            return r.ok() && r->status == 200;
          },
          milliseconds(30'000));
      if (up && process_->Running()) port_ = port;
    }
  }
  ~Prometheus() {
    if (process_ && process_->Running()) {
      kill(process_->pid(), SIGTERM);
      process_->Wait(milliseconds(20'000));
    }
  }
  int port() const { return port_; }
  std::string Log() const { return process_ ? process_->Stderr() : ""; }

  // The API's whole answer to an instant query ({"status": "success", "data": ...} or
  // {"status": "error", "error": ...}); null when there was no answer.
  json Raw(const std::string& promql) {
    auto r = HttpGet("127.0.0.1", port_, "/api/v1/query?query=" + UrlEncode(promql));
    if (!r.ok()) return json();
    json j = json::parse(r->body, nullptr, false);
    return j.is_discarded() ? json() : j;
  }
  // The instant vector of a PromQL query: the "result" array, or empty on any error.
  json Query(const std::string& promql) {
    json j = Raw(promql);
    if (!j.is_object() || j.value("status", "") != "success") return json::array();
    return j["data"].value("result", json::array());
  }
  // What Grafana's label_values(match, label) asks: GET /api/v1/label/<label>/values.
  json LabelValues(const std::string& label, const std::string& match) {
    auto r = HttpGet("127.0.0.1", port_,
                     "/api/v1/label/" + label + "/values?match[]=" + UrlEncode(match));
    if (!r.ok() || r->status != 200) return json();
    json j = json::parse(r->body, nullptr, false);
    return j.is_discarded() ? json() : j.value("data", json());
  }
  // The value of the single series `promql` returns, polled until `accept` holds for it.
  std::optional<double> Poll(const std::string& promql, const std::function<bool(double)>& accept) {
    std::optional<double> value;
    WaitUntil(
        [&] {
          json result = Query(promql);
          if (result.size() != 1) return false;
          value = std::stod(result[0]["value"][1].get<std::string>());
          return accept(*value);
        },
        kDeadline);
    return value;
  }

 private:
  TempDir dir_;
  std::unique_ptr<TestProcess> process_;
  int port_ = 0;
};

TEST(PrometheusTest, ScrapesTheAgentAndAnswersWithTheFakeGpusValues) {
  auto binary = FindProgram("prometheus");
  if (!binary) {
    GTEST_SKIP() << "prometheus is not installed (Debian package \"prometheus\", which "
                    "scripts/install-deps.sh installs)";
  }
  auto env = AgentUnderTest::DefaultEnv();
  env["FAKE_NVML_CONFIG"] = FAKE_NVML_CONFIG_DIR "/eight_gpus_two_numa.conf";
  AgentUnderTest agent(AGENT_BIN, LoaderGpuJobManifest(LOADER_TRAINER_BIN, 2),
                       {"--gpu-backend", "nvml", "--nvml-library", FAKE_NVML_PATH, "--metrics-addr",
                        "127.0.0.1:0", "--dcgm-compatible-names"},
                       env);
  auto ports = agent.WaitForEndpoints();
  ASSERT_EQ(ports.size(), 1u) << agent.Stderr();
  const std::string target = "127.0.0.1:" + std::to_string(ports[0]);

  Prometheus prom(*binary, target);
  ASSERT_GT(prom.port(), 0) << "prometheus did not start:\n" << prom.Log();

  // The first scrape comes a second or two after start-up.
  auto up = prom.Poll("up{instance=\"" + target + "\"}", [](double v) { return v == 1; });
  ASSERT_EQ(up, 1.0) << prom.Log();

  // Known values of the fake GPUs, selected by the labels a dashboard uses.
  EXPECT_EQ(prom.Poll("spawnpoint_gpu_utilisation_ratio{job=\"metrics-demo\",rank=\"0\"}",
                      [](double v) { return v == 0.4; }),
            0.4);
  EXPECT_EQ(prom.Poll("spawnpoint_gpu_utilisation_ratio{UUID=\"GPU-6b7c1a2e-0000-4000-8000-"
                      "00000000000f\",namespace=\"ml\",pod=\"metrics-demo-node-0\"}",
                      [](double v) { return v == 0.2; }),
            0.2);
  auto mean = prom.Poll("avg(spawnpoint_gpu_utilisation_ratio{job=\"metrics-demo\"})",
                        [](double v) { return std::abs(v - 0.3) < 1e-9; });
  ASSERT_TRUE(mean.has_value());
  EXPECT_NEAR(*mean, 0.3, 1e-9);
  EXPECT_EQ(prom.Poll("spawnpoint_gpu_memory_used_bytes{gpu=\"3\"}",
                      [](double v) { return v == 4294967296.0; }),
            4294967296.0);
  // What dashboard 12239 asks for.
  EXPECT_EQ(prom.Poll("DCGM_FI_DEV_GPU_UTIL{instance=~\"" + target + "\",gpu=~\"3\"}",
                      [](double v) { return v == 40; }),
            40);
  EXPECT_EQ(prom.Poll("sum(DCGM_FI_DEV_POWER_USAGE{instance=~\"" + target + "\"})",
                      [](double v) { return v == 240; }),
            240);
  EXPECT_EQ(prom.Poll("DCGM_FI_DEV_FB_USED{gpu=\"1\"}", [](double v) { return v == 2048; }), 2048);
  // Its template variables: label_values(DCGM_FI_DEV_GPU_TEMP, gpu) and (..., instance).
  EXPECT_EQ(prom.LabelValues("gpu", "DCGM_FI_DEV_GPU_TEMP"), json({"1", "3"}));
  EXPECT_EQ(prom.LabelValues("instance", "DCGM_FI_DEV_GPU_TEMP"), json({target}));

  // Counters work as counters: the loader's samples have a positive rate.
  auto rate = prom.Poll("sum(rate(spawnpoint_loader_samples_total{job=\"metrics-demo\"}[5s]))",
                        [](double v) { return v > 0; });
  ASSERT_TRUE(rate.has_value());
  EXPECT_GT(*rate, 0);
  EXPECT_EQ(
      prom.Poll("sum(spawnpoint_rank_up{job=\"metrics-demo\"})", [](double v) { return v == 2; }),
      2);
  EXPECT_EQ(prom.Poll("spawnpoint_agent_phase{job=\"metrics-demo\",phase=\"Running\"}",
                      [](double v) { return v == 1; }),
            1);

  // Every query of the Grafana dashboard is valid PromQL, and those over the agent's
  // metrics find data (failures need a failure; the operator's panels need the operator).
  std::ifstream in(DASHBOARD_JSON);
  json dashboard = json::parse(in, nullptr, false);
  ASSERT_TRUE(dashboard.is_object()) << DASHBOARD_JSON;
  int queries = 0;
  bool operator_row = false;  // the panels after the "Operator" row read operator metrics
  for (const auto& panel : dashboard["panels"]) {
    if (panel["type"] == "row") operator_row = panel["title"] == "Operator";
    for (const auto& target : panel.value("targets", json::array())) {
      std::string expr = target["expr"];
      for (auto [var, value] : {std::pair{"$namespace", ".*"}, std::pair{"$job", ".*"},
                                std::pair{"$__rate_interval", "5s"}}) {
        for (size_t at; (at = expr.find(var)) != std::string::npos;) {
          expr.replace(at, strlen(var), value);
        }
      }
      ++queries;
      const std::string title = panel["title"];
      json answer = prom.Raw(expr);
      ASSERT_EQ(answer.value("status", ""), "success") << title << ": " << expr << "\n" << answer;
      if (title == "Rank failures by reason" || operator_row) continue;
      EXPECT_TRUE(WaitUntil([&] { return !prom.Query(expr).empty(); }, kDeadline))
          << title << ": no data for " << expr;
    }
  }
  EXPECT_GE(queries, 15);
}

}  // namespace
}  // namespace spawnpoint::testing
