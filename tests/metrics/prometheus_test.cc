// A real Prometheus (the Debian package's binary, loopback only, its own config and data
// directory, 1 s scrape interval) scrapes a running agent on the fake NVML library and a
// running operator (on the real control plane of the operator_cluster fixture, with a job
// applied by kubectl), and its HTTP
// API must return the series and values the fake GPUs, the loader and the job produce.
// Fails, naming the package, when the prometheus binary is not installed: make deps installs
// it, and a test that skipped for want of it would pass without having run.
#include <signal.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/metrics/agent_harness.h"
#include "tests/metrics/http_client.h"
#include "tests/operator/harness.h"
#include "tests/support/free_port.h"

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
  // Starts prometheus scraping each target (scrape job name -> HOST:PORT) every second.
  // Its web port is picked free just before the start; if another process takes it first,
  // it is tried again.
  Prometheus(const std::string& binary, const std::map<std::string, std::string>& targets) {
    std::string config =
        "global:\n"
        "  scrape_interval: 1s\n"
        "  scrape_timeout: 1s\n"
        "  evaluation_interval: 1s\n"
        "scrape_configs:\n";
    for (const auto& [name, target] : targets) {
      config += "  - job_name: " + name +
                "\n"
                // Our series carry job (the TrainingJob); keep it instead of renaming it to
                // exported_job, as the chart's ServiceMonitor and PodMonitor do.
                "    honor_labels: true\n"
                "    static_configs:\n"
                "      - targets: ['" +
                target + "']\n";
    }
    WriteFile(dir_.File("prometheus.yml"), config);
    for (int attempt = 0; attempt < 3 && port_ == 0; ++attempt) {
      const int port = spawnpoint::testing::FreePort(1);
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

TEST(PrometheusTest, ScrapesTheAgentAndTheOperator) {
  auto binary = FindProgram("prometheus");
  ASSERT_TRUE(binary) << "prometheus is not installed (Debian package \"prometheus\", which "
                         "scripts/install-deps.sh installs: make deps)";
  auto env = AgentUnderTest::DefaultEnv();
  env["FAKE_NVML_CONFIG"] = FAKE_NVML_CONFIG_DIR "/eight_gpus_two_numa.conf";
  AgentUnderTest agent(AGENT_BIN, LoaderGpuJobManifest(LOADER_TRAINER_BIN, 2),
                       {"--gpu-backend", "nvml", "--nvml-library", FAKE_NVML_PATH, "--metrics-addr",
                        "127.0.0.1:0", "--dcgm-compatible-names"},
                       env);
  auto ports = agent.WaitForEndpoints();
  ASSERT_EQ(ports.size(), 1u) << agent.Stderr();
  const std::string target = "127.0.0.1:" + std::to_string(ports[0]);

  // The operator, running one job to Running on the real control plane (simulated pods).
  op::testing::OperatorHarness cluster;
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  cluster.StartOperator();
  const int operator_port = cluster.ProbePort();
  ASSERT_GT(operator_port, 0) << cluster.Log();
  ASSERT_TRUE(cluster.Apply(op::testing::TestJob("scraped")));
  ASSERT_TRUE(cluster.WaitFor([&] { return cluster.Pods("scraped").size() == 2; }))
      << cluster.Log();
  for (const auto& pod : cluster.Pods("scraped")) {
    cluster.Api(
        "PATCH",
        "/api/v1/namespaces/$NS/pods/" + pod["metadata"]["name"].get<std::string>() + "/status",
        R"({"status":{"phase":"Running"}})", "application/merge-patch+json");
  }
  ASSERT_TRUE(cluster.WaitPhase("scraped", "Running")) << cluster.Log();
  const std::string operator_target = "127.0.0.1:" + std::to_string(operator_port);

  Prometheus prom(*binary,
                  {{"spawnpoint-agent", target}, {"spawnpoint-operator", operator_target}});
  ASSERT_GT(prom.port(), 0) << "prometheus did not start:\n" << prom.Log();

  // The first scrape comes a second or two after start-up.
  auto up = prom.Poll("up{instance=\"" + target + "\"}", [](double v) { return v == 1; });
  ASSERT_EQ(up, 1.0) << prom.Log();
  auto operator_up =
      prom.Poll("up{instance=\"" + operator_target + "\"}", [](double v) { return v == 1; });
  ASSERT_EQ(operator_up, 1.0) << prom.Log();

  // The operator's view: the job by phase, its lifecycle, leadership, reconciles, requests.
  const std::string ns = cluster.ns();
  EXPECT_EQ(prom.Poll("spawnpoint_jobs{namespace=\"" + ns + "\",phase=\"Running\"}",
                      [](double v) { return v == 1; }),
            1);
  EXPECT_EQ(prom.Poll("spawnpoint_jobs_created_total{namespace=\"" + ns + "\"}",
                      [](double v) { return v == 1; }),
            1);
  EXPECT_EQ(prom.Poll("spawnpoint_leader", [](double v) { return v == 1; }), 1);
  auto reconciles = prom.Poll("sum(spawnpoint_reconcile_duration_seconds_count)",
                              [](double v) { return v >= 2; });
  ASSERT_TRUE(reconciles.has_value());
  EXPECT_GE(*reconciles, 2);
  auto pod_creates = prom.Poll("spawnpoint_api_requests_total{verb=\"POST\",code=\"201\"}",
                               [](double v) { return v >= 2; });
  ASSERT_TRUE(pod_creates.has_value()) << "two pods and a service were created";
  EXPECT_GE(*pod_creates, 3);

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

  // Every query of the Grafana dashboard is valid PromQL and finds data (but the failures
  // panel: that needs a failure; and the waiting time: that needs a job that does not run).
  std::ifstream in(DASHBOARD_JSON);
  json dashboard = json::parse(in, nullptr, false);
  ASSERT_TRUE(dashboard.is_object()) << DASHBOARD_JSON;
  int queries = 0;
  for (const auto& panel : dashboard["panels"]) {
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
      if (title == "Rank failures by reason" || title == "Time waiting for pods") continue;
      EXPECT_TRUE(WaitUntil([&] { return !prom.Query(expr).empty(); }, kDeadline))
          << title << ": no data for " << expr;
    }
  }
  EXPECT_GE(queries, 20);
}

}  // namespace
}  // namespace spawnpoint::testing
