// The operator's metrics on a real Registry: every name docs/metrics.md promises, with its
// type and labels; reconcile, queue, API, lifecycle and admission-wait counting; the per-job
// families from the job cache, the pending waits on a simulated clock; and `promtool check
// metrics` on the rendered text.
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

// Jobs are created at 10:00:00 unless a test says otherwise; scrapes happen at kNow.
constexpr const char* kCreated = "2024-05-01T10:00:00Z";
const WallTime kNow = *ParseTime("2024-05-01T10:05:00Z");

kube::ObjectPtr Job(const std::string& ns, const std::string& name, json status,
                    const std::string& created = kCreated) {
  json job = {{"metadata", {{"namespace", ns}, {"name", name}, {"creationTimestamp", created}}}};
  if (!status.is_null()) job["status"] = std::move(status);
  return std::make_shared<const json>(std::move(job));
}

json Cond(const std::string& type, const std::string& status, const std::string& reason,
          const std::string& at = kCreated) {
  return {{"type", type}, {"status", status}, {"reason", reason}, {"lastTransitionTime", at}};
}

// label values -> value of one collected family.
std::map<std::vector<std::string>, double> Samples(
    const std::vector<metrics::CollectedFamily>& families, const std::string& name) {
  std::map<std::vector<std::string>, double> out;
  for (const auto& f : families) {
    if (f.name != name) continue;
    for (const auto& s : f.samples) out[s.label_values] = s.value;
  }
  return out;
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
  SimulatedClock clock;
  WallClock wall(&clock, kNow);
  m.CollectJobs(&jobs, &wall);
  m.SetLeader(true);
  jobs.Replace(
      {Job("ml", "a",
           {{"phase", "Running"},
            {"conditions", {Cond("Running", "True", "GangRunning")}},
            {"utilisation", {{"gpu", 0.5}, {"dataStall", 0.25}, {"samplesPerSecond", 80}}}}),
       Job("ml", "b", {{"phase", "Pending"}})});
  m.ObserveReconcile(0.01, "success");
  m.ObserveApiRequest("GET", 200, 0.002);
  m.ObserveStatusWrite("ml", "", "Pending", 0, 0);
  m.ObserveStatusWrite("ml", "Running", "Succeeded", 0, 1);
  m.ObserveStatusWrite("ml", "Running", "Failed", 0, 0);
  m.ObserveStatusWrite("ml", "Queued", "Pending", 0, 0, std::chrono::seconds(42));
  const std::string text = registry.Render();
  const auto documented = DocumentedOperatorMetrics();
  ASSERT_GE(documented.size(), 16u) << "the table in docs/metrics.md was not found";
  for (const auto& [name, type] : documented) {
    EXPECT_NE(text.find("# TYPE " + name + " " + type + "\n"), std::string::npos)
        << name << " (" << type << ") is documented but not exported";
  }
  // And the other way: nothing exported that the table does not list.
  static const std::regex type_line(R"(# TYPE ([a-z_]+) ([a-z]+)\n)");
  for (std::sregex_iterator it(text.begin(), text.end(), type_line), end; it != end; ++it) {
    auto row = documented.find((*it)[1]);
    EXPECT_TRUE(row != documented.end() && row->second == (*it)[2])
        << (*it)[1] << " (" << (*it)[2] << ") is exported but not in docs/metrics.md's table";
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
                   Job("cv", "d", {{"phase", "Running"}}), Job("cv", "e", {{"phase", "Queued"}})},
                  kNow);
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
       Job("ml", "c", {{"phase", "Succeeded"}, {"utilisation", {{"slowestRankRatio", 3}}}})},
      kNow);
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
  SimulatedClock clock;
  WallClock wall(&clock, kNow);
  m.CollectJobs(&jobs, &wall);
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

// One series per True condition, with its reason: the alerts select Failed, Stalled with
// reason RankStalled (never Straggler) and QuotaExceeded by these labels.
TEST(OperatorMetricsTest, EveryTrueConditionIsOneSeriesWithItsReason) {
  auto families = JobFamilies(
      {Job("ml", "hung",
           {{"phase", "Running"},
            {"conditions",
             {Cond("Created", "True", "GangCreated"), Cond("Running", "True", "GangRunning"),
              Cond("Stalled", "True", "RankStalled"), Cond("Restarting", "False", "GangRunning"),
              Cond("Stalled", "True", "Straggler")}}}),  // a type repeated: the first counts
       Job("ml", "slow",
           {{"phase", "Running"}, {"conditions", {Cond("Stalled", "True", "Straggler")}}}),
       Job("ml", "denied",
           {{"phase", "Pending"},
            {"conditions",
             {Cond("QuotaExceeded", "True", "ExceededQuota"), Cond("Created", "Unknown", "")}}}),
       // Finished jobs keep theirs until deleted: the Failed alert names the job from it.
       Job("cv", "broken",
           {{"phase", "Failed"}, {"conditions", {Cond("Failed", "True", "MaxRestartsReached")}}}),
       Job("cv", "fresh", nullptr)},
      kNow);
  using Labels = std::vector<std::string>;
  EXPECT_EQ(Samples(families, "spawnpoint_job_condition"),
            (std::map<Labels, double>{{{"ml", "hung", "Created", "GangCreated"}, 1},
                                      {{"ml", "hung", "Running", "GangRunning"}, 1},
                                      {{"ml", "hung", "Stalled", "RankStalled"}, 1},
                                      {{"ml", "slow", "Stalled", "Straggler"}, 1},
                                      {{"ml", "denied", "QuotaExceeded", "ExceededQuota"}, 1},
                                      {{"cv", "broken", "Failed", "MaxRestartsReached"}, 1}}));
}

// A Pending or Queued job's wait, read against the injected wall clock at each scrape: from
// its creation, or from when it last stopped running, was resumed or had its spec corrected.
TEST(OperatorMetricsTest, PendingSecondsCountTheCurrentWaitOnTheWallClock) {
  metrics::Registry registry;
  OperatorMetrics m(&registry);
  kube::Store jobs;
  SimulatedClock clock;
  WallClock wall(&clock, kNow);  // 10:05:00
  m.CollectJobs(&jobs, &wall);
  m.SetLeader(true);
  jobs.Replace({
      // Never reconciled, or Pending since creation (its Running condition False from its
      // first reconcile on): 300 s.
      Job("ml", "new", nullptr),
      Job("ml", "waiting",
          {{"phase", "Pending"},
           {"conditions",
            {Cond("Running", "False", "PodPending", "2024-05-01T10:00:01Z"),
             Cond("QuotaExceeded", "True", "ExceededQuota", "2024-05-01T10:00:02Z")}}}),
      // Ran, then Kueue evicted it at 10:04:00: waiting again for 60 s.
      Job("ml", "evicted",
          {{"phase", "Queued"},
           {"conditions",
            {Cond("Running", "False", "Preempted", "2024-05-01T10:04:00Z"),
             Cond("Queued", "True", "Preempted", "2024-05-01T10:04:00Z")}}},
          "2024-05-01T08:00:00Z"),
      // Suspended for an hour, resumed at 10:04:30: 30 s.
      Job("ml", "resumed",
          {{"phase", "Pending"},
           {"conditions",
            {Cond("Running", "False", "JobSuspended", "2024-05-01T09:00:00Z"),
             Cond("Suspended", "False", "JobResumed", "2024-05-01T10:04:30Z")}}},
          "2024-05-01T08:00:00Z"),
      // Spec corrected at 10:04:50 after failing as InvalidSpec: 10 s.
      Job("ml", "corrected",
          {{"phase", "Pending"},
           {"conditions", {Cond("Failed", "False", "SpecCorrected", "2024-05-01T10:04:50Z")}}},
          "2024-05-01T08:00:00Z"),
      // Created after this replica's clock reads now (clock skew): 0, never negative.
      Job("ml", "ahead", {{"phase", "Pending"}}, "2024-05-01T10:05:07Z"),
      // Not waiting: no series.
      Job("ml", "running", {{"phase", "Running"}}),
      Job("ml", "restarting", {{"phase", "Restarting"}}),
      Job("ml", "suspended", {{"phase", "Suspended"}}),
      Job("ml", "done", {{"phase", "Succeeded"}}),
      Job("ml", "failed", {{"phase", "Failed"}}),
  });
  auto pending = [&] {
    auto families = JobFamilies(jobs.List(), wall.Now());
    return Samples(families, "spawnpoint_job_pending_seconds");
  };
  using Labels = std::vector<std::string>;
  EXPECT_EQ(pending(), (std::map<Labels, double>{{{"ml", "new"}, 300},
                                                 {{"ml", "waiting"}, 299},
                                                 {{"ml", "evicted"}, 60},
                                                 {{"ml", "resumed"}, 30},
                                                 {{"ml", "corrected"}, 10},
                                                 {{"ml", "ahead"}, 0}}));
  clock.Advance(std::chrono::minutes(10));
  EXPECT_EQ(pending()[Labels({"ml", "new"})], 900);
  EXPECT_EQ(pending()[Labels({"ml", "evicted"})], 660);
  // The scrape reads the same clock.
  EXPECT_THAT(registry.Render(),
              HasSubstr("spawnpoint_job_pending_seconds{namespace=\"ml\",job=\"new\"} 900\n"));
  // Once it runs, its series is gone.
  jobs.Replace({Job("ml", "new", {{"phase", "Running"}})});
  EXPECT_THAT(registry.Render(), Not(HasSubstr("spawnpoint_job_pending_seconds{")));
  m.StopCollectingJobs();
}

// Observed from the status write that admits the gang, as the lifecycle totals are.
TEST(OperatorMetricsTest, AdmissionWaitsAreAHistogramByNamespace) {
  metrics::Registry registry;
  OperatorMetrics m(&registry);
  m.ObserveStatusWrite("ml", "", "Pending", 0, 0);
  std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("spawnpoint_job_admission_wait_seconds_count{namespace=\"ml\"} 0\n"))
      << "from a namespace's first job on, at 0";
  m.ObserveStatusWrite("ml", "Queued", "Pending", 0, 0, std::chrono::seconds(90));
  m.ObserveStatusWrite("ml", "Pending", "Running", 0, 0);  // no wait ended: nothing observed
  m.ObserveStatusWrite("ml", "Queued", "Running", 0, 0, std::chrono::seconds(4000));
  text = registry.Render();
  EXPECT_THAT(text, HasSubstr("spawnpoint_job_admission_wait_seconds_bucket{namespace=\"ml\","
                              "le=\"60\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("spawnpoint_job_admission_wait_seconds_bucket{namespace=\"ml\","
                              "le=\"120\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("spawnpoint_job_admission_wait_seconds_bucket{namespace=\"ml\","
                              "le=\"7200\"} 2\n"));
  EXPECT_THAT(text,
              HasSubstr("spawnpoint_job_admission_wait_seconds_sum{namespace=\"ml\"} 4090\n"));
  EXPECT_THAT(text, HasSubstr("spawnpoint_job_admission_wait_seconds_count{namespace=\"ml\"} 2\n"));
}

TEST(OperatorMetricsTest, PromtoolAcceptsTheExposition) {
  metrics::Registry registry;
  OperatorMetrics m(&registry);
  kube::Store jobs;
  SimulatedClock clock;
  WallClock wall(&clock, kNow);
  m.CollectJobs(&jobs, &wall);
  m.SetLeader(true);
  jobs.Replace({Job("ml", "we\"ird\\name",
                    {{"phase", "Running"},
                     {"conditions", {Cond("Stalled", "True", "RankStalled")}},
                     {"utilisation", {{"gpu", 0.5}, {"slowestRankRatio", 1.98}}}}),
                Job("ml", "queued", {{"phase", "Queued"}})});
  m.ObserveReconcile(0.01, "success");
  m.ObserveApiRequest("PATCH", 422, 0.01);
  m.ObserveStatusWrite("ml", "", "Running", 0, 0);
  m.ObserveStatusWrite("ml", "Queued", "Pending", 0, 0, std::chrono::seconds(12));
  auto promtool = testing::PromtoolCheckMetrics(registry.Render());
  ASSERT_TRUE(promtool)
      << "promtool is not installed: scripts/install-deps.sh (make deps) installs it";
  EXPECT_EQ(promtool->code, 0) << promtool->output;
  EXPECT_EQ(promtool->output, "") << "promtool has remarks";
}

}  // namespace
}  // namespace spawnpoint::op
