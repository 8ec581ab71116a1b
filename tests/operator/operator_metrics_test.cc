// The operator's metrics on a real Registry: every name docs/metrics.md promises, with its
// type and labels; reconcile, queue, API and lifecycle counting; the per-job families from
// the job cache; and `promtool check metrics` on the rendered text.
#include "operator/metrics/operator_metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "operator/kube/workqueue.h"
#include "tests/kube/fake_clock.h"
#include "tests/metrics/agent_harness.h"

namespace spawnpoint::op {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

kube::ObjectPtr Job(const std::string& ns, const std::string& name, json status) {
  json job = {{"metadata", {{"namespace", ns}, {"name", name}}}};
  if (!status.is_null()) job["status"] = std::move(status);
  return std::make_shared<const json>(std::move(job));
}

// Rows of the "Operator metrics" table in docs/metrics.md: name -> type.
std::map<std::string, std::string> DocumentedOperatorMetrics() {
  std::ifstream in(std::string(SOURCE_DIR) + "/docs/metrics.md");
  std::string line;
  bool in_section = false;
  std::map<std::string, std::string> out;
  static const std::regex row(R"(^\| `([a-z_]+)` \| (counter|gauge|histogram) \|)");
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) in_section = line.find("Operator metrics") != std::string::npos;
    std::smatch m;
    if (in_section && std::regex_search(line, m, row)) out[m[1]] = m[2];
  }
  return out;
}

TEST(OperatorMetricsTest, ExportsEveryDocumentedMetricWithItsType) {
  metrics::Registry registry;
  OperatorMetrics m(&registry);
  kube::Store jobs;
  m.CollectJobs(&jobs);
  m.SetLeader(true);
  jobs.Replace(
      {Job("ml", "a",
           {{"phase", "Running"},
            {"utilisation", {{"gpu", 0.5}, {"dataStall", 0.25}, {"samplesPerSecond", 80}}}})});
  m.ObserveReconcile(0.01, "success");
  m.ObserveApiRequest("GET", 200, 0.002);
  m.ObserveStatusWrite("ml", "", "Pending", 0, 0);
  m.ObserveStatusWrite("ml", "Running", "Succeeded", 0, 1);
  m.ObserveStatusWrite("ml", "Running", "Failed", 0, 0);
  const std::string text = registry.Render();
  const auto documented = DocumentedOperatorMetrics();
  ASSERT_GE(documented.size(), 16u) << "the table in docs/metrics.md was not found";
  for (const auto& [name, type] : documented) {
    EXPECT_NE(text.find("# TYPE " + name + " " + type + "\n"), std::string::npos)
        << name << " (" << type << ") is documented but not exported";
  }
}

TEST(OperatorMetricsTest, ReconcilesByResultAndErrors) {
  metrics::Registry registry;
  OperatorMetrics m(&registry);
  for (int i = 1; i <= 10; ++i) m.ObserveReconcile(0.003, i <= 7 ? "success" : "error");
  m.ObserveReconcile(0.1, "requeue");
  const std::string text = registry.Render();
  EXPECT_THAT(text,
              HasSubstr("spawnpoint_reconcile_duration_seconds_count{result=\"success\"} 7\n"));
  EXPECT_THAT(text, HasSubstr("spawnpoint_reconcile_duration_seconds_count{result=\"error\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("spawnpoint_reconcile_duration_seconds_bucket{result=\"requeue\","
                              "le=\"0.064\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("spawnpoint_reconcile_duration_seconds_bucket{result=\"requeue\","
                              "le=\"0.128\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("spawnpoint_reconcile_errors_total 3\n"));
}

TEST(OperatorMetricsTest, LifecycleTotalsComeFromStatusWrites) {
  metrics::Registry registry;
  OperatorMetrics m(&registry);
  m.ObserveStatusWrite("ml", "", "Pending", 0, 0);               // created
  m.ObserveStatusWrite("ml", "Pending", "Running", 0, 0);        // nothing counted
  m.ObserveStatusWrite("ml", "Running", "Restarting", 0, 1);     // one gang restart
  m.ObserveStatusWrite("ml", "Restarting", "Restarting", 1, 1);  // same restart, rewritten
  m.ObserveStatusWrite("ml", "Restarting", "Running", 1, 1);
  m.ObserveStatusWrite("ml", "Running", "Succeeded", 1, 1);
  m.ObserveStatusWrite("ml", "Succeeded", "Succeeded", 1, 1);  // e.g. a condition update
  m.ObserveStatusWrite("cv", "", "Failed", 0, 0);              // failed on its first look
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("spawnpoint_jobs_created_total{namespace=\"ml\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("spawnpoint_jobs_created_total{namespace=\"cv\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("spawnpoint_jobs_restarted_total{namespace=\"ml\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("spawnpoint_jobs_succeeded_total{namespace=\"ml\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("spawnpoint_jobs_failed_total{namespace=\"cv\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("spawnpoint_jobs_failed_total{namespace=\"ml\"} 0\n"))
      << "a namespace's series start at 0";
}

TEST(OperatorMetricsTest, QueueHooksFollowARealWorkQueue) {
  metrics::Registry registry;
  OperatorMetrics m(&registry);
  kube::testing::FakeClock clock;
  kube::WorkQueue queue(&clock, {.name = "t", .metrics = m.QueueHooks()});
  queue.Add("ml/a");
  queue.Add("ml/b");
  queue.Add("ml/a");  // collapsed: not an add
  EXPECT_THAT(registry.Render(), HasSubstr("spawnpoint_workqueue_depth 2\n"));
  auto key = queue.Get();
  ASSERT_TRUE(key);
  queue.AddRateLimited(*key);
  queue.Done(*key);
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("spawnpoint_workqueue_adds_total 2\n"));
  EXPECT_THAT(text, HasSubstr("spawnpoint_workqueue_retries_total 1\n"));
  EXPECT_THAT(text, HasSubstr("spawnpoint_workqueue_depth 1\n"));
  queue.ShutDown();
}

TEST(OperatorMetricsTest, ApiRequestsByVerbAndCode) {
  metrics::Registry registry;
  OperatorMetrics m(&registry);
  m.ObserveApiRequest("GET", 200, 0.001);
  m.ObserveApiRequest("GET", 200, 0.001);
  m.ObserveApiRequest("PUT", 409, 0.002);
  m.ObserveApiRequest("WATCH", 0, 1.0);
  m.SetLeader(true);
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("spawnpoint_api_requests_total{verb=\"GET\",code=\"200\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("spawnpoint_api_requests_total{verb=\"PUT\",code=\"409\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("spawnpoint_api_requests_total{verb=\"WATCH\",code=\"0\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("spawnpoint_api_request_duration_seconds_count{verb=\"GET\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("spawnpoint_leader 1\n"));
}

TEST(OperatorMetricsTest, JobFamiliesCountPhasesAndExportOnlyRunningJobs) {
  const json util = {{"gpu", 0.75}, {"dataStall", 0.1}, {"samplesPerSecond", 1200.5}};
  auto families =
      JobFamilies({Job("ml", "a", {{"phase", "Running"}, {"utilisation", util}}),
                   Job("ml", "b", {{"phase", "Succeeded"}, {"utilisation", util}}),
                   Job("ml", "c", nullptr),  // not reconciled yet
                   Job("cv", "d", {{"phase", "Running"}}), Job("cv", "e", {{"phase", "Queued"}})});
  std::map<std::string, const metrics::CollectedFamily*> by_name;
  for (const auto& f : families) by_name[f.name] = &f;
  ASSERT_TRUE(by_name.count("spawnpoint_jobs"));
  std::map<std::vector<std::string>, double> phases;
  for (const auto& s : by_name["spawnpoint_jobs"]->samples) phases[s.label_values] = s.value;
  EXPECT_EQ(phases[std::vector<std::string>({"ml", "Running"})], 1);
  EXPECT_EQ(phases[std::vector<std::string>({"ml", "Succeeded"})], 1);
  EXPECT_EQ(phases[std::vector<std::string>({"ml", "Pending"})], 1);
  EXPECT_EQ(phases[std::vector<std::string>({"ml", "Failed"})], 0);
  EXPECT_EQ(phases[std::vector<std::string>({"cv", "Running"})], 1);
  EXPECT_EQ(phases[std::vector<std::string>({"cv", "Queued"})], 1);
  EXPECT_EQ(phases.size(), 14u) << "seven phases for each of two namespaces";

  ASSERT_TRUE(by_name.count("spawnpoint_job_gpu_utilisation_ratio"));
  const auto& gpu = by_name["spawnpoint_job_gpu_utilisation_ratio"]->samples;
  ASSERT_EQ(gpu.size(), 1u) << "only the running job that reports utilisation";
  EXPECT_EQ(gpu[0].label_values, std::vector<std::string>({"ml", "a"}));
  EXPECT_EQ(gpu[0].value, 0.75);
  EXPECT_EQ(by_name["spawnpoint_job_samples_per_second"]->samples[0].value, 1200.5);
  EXPECT_EQ(by_name["spawnpoint_job_data_stall_ratio"]->samples[0].value, 0.1);
}

TEST(OperatorMetricsTest, EveryRunningJobHasItsSlowestRanksRatio) {
  auto families = JobFamilies(
      {Job("ml", "a", {{"phase", "Running"}, {"utilisation", {{"slowestRankRatio", 1.98}}}}),
       Job("ml", "b", {{"phase", "Running"}, {"utilisation", {{"gpu", 0.5}}}}),
       Job("ml", "c", {{"phase", "Succeeded"}, {"utilisation", {{"slowestRankRatio", 3}}}})});
  std::map<std::vector<std::string>, double> ratios;
  for (const auto& f : families) {
    if (f.name != "spawnpoint_job_straggler_ratio") continue;
    for (const auto& s : f.samples) ratios[s.label_values] = s.value;
  }
  EXPECT_EQ(ratios,
            (std::map<std::vector<std::string>, double>{{{"ml", "a"}, 1.98}, {{"ml", "b"}, 0}}))
      << "running jobs only, 0 until the agents have a figure";
}

TEST(OperatorMetricsTest, FinishedJobsLeaveTheNextScrape) {
  metrics::Registry registry;
  OperatorMetrics m(&registry);
  kube::Store jobs;
  m.CollectJobs(&jobs);
  const json util = {{"gpu", 0.5}, {"dataStall", 0.2}, {"samplesPerSecond", 10}};
  jobs.Replace({Job("ml", "a", {{"phase", "Running"}, {"utilisation", util}})});
  EXPECT_THAT(registry.Render(), Not(HasSubstr("namespace=\"ml\"")))
      << "a standby replica exports no job series";
  m.SetLeader(true);
  EXPECT_THAT(registry.Render(),
              HasSubstr("spawnpoint_job_gpu_utilisation_ratio{namespace=\"ml\",job=\"a\"} 0.5\n"));
  jobs.Replace({Job("ml", "a", {{"phase", "Succeeded"}, {"utilisation", util}})});
  std::string text = registry.Render();
  EXPECT_THAT(text, Not(HasSubstr("spawnpoint_job_gpu_utilisation_ratio{")));
  EXPECT_THAT(text, HasSubstr("spawnpoint_jobs{namespace=\"ml\",phase=\"Succeeded\"} 1\n"));
  jobs.Replace({});
  text = registry.Render();
  EXPECT_THAT(text, Not(HasSubstr("namespace=\"ml\"")));
  m.StopCollectingJobs();
}

TEST(OperatorMetricsTest, PromtoolAcceptsTheExposition) {
  metrics::Registry registry;
  OperatorMetrics m(&registry);
  kube::Store jobs;
  m.CollectJobs(&jobs);
  m.SetLeader(true);
  jobs.Replace(
      {Job("ml", "we\"ird\\name",
           {{"phase", "Running"}, {"utilisation", {{"gpu", 0.5}, {"slowestRankRatio", 1.98}}}})});
  m.ObserveReconcile(0.01, "success");
  m.ObserveApiRequest("PATCH", 422, 0.01);
  m.ObserveStatusWrite("ml", "", "Running", 0, 0);
  auto promtool = testing::PromtoolCheckMetrics(registry.Render());
  ASSERT_TRUE(promtool)
      << "promtool is not installed: scripts/install-deps.sh (make deps) installs it";
  EXPECT_EQ(promtool->code, 0) << promtool->output;
  EXPECT_EQ(promtool->output, "") << "promtool has remarks";
}

}  // namespace
}  // namespace spawnpoint::op
