#include "operator/metrics/operator_metrics.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include "operator/common/object.h"
#include "operator/reconciler/job_status.h"

namespace spawnpoint::op {
namespace {

using metrics::CollectedFamily;
using metrics::MetricType;

// Phases as the reconciler writes them; a job it has not seen yet counts as Pending.
constexpr const char* kPhases[] = {phase::kPending,    phase::kQueued,    phase::kRunning,
                                   phase::kRestarting, phase::kSucceeded, phase::kFailed,
                                   phase::kSuspended};

// Waits for Kueue's admission: seconds while a queue has room, to hours or a day behind other
// teams' jobs.
const std::vector<double> kAdmissionWaitBuckets = {1,   5,    15,   30,   60,    120,   300,
                                                   600, 1800, 3600, 7200, 14400, 43200, 86400};

// Registration can only fail on a programming error (a bad or duplicate name), which the
// unit tests catch; crash loudly rather than run without metrics.
template <typename T>
T Must(StatusOr<T> added) {
  if (!added.ok()) {
    fprintf(stderr, "operator metrics: %s\n", added.status().ToString().c_str());
    abort();
  }
  return *added;
}

}  // namespace

// Holds the series, not the OperatorMetrics, so the queue may outlive it.
class OperatorMetrics::QueueHooksImpl : public kube::WorkQueueMetrics {
 public:
  QueueHooksImpl(std::shared_ptr<metrics::Gauge> depth, std::shared_ptr<metrics::Counter> adds,
                 std::shared_ptr<metrics::Counter> retries)
      : depth_(std::move(depth)), adds_(std::move(adds)), retries_(std::move(retries)) {}
  void OnAdd(const std::string&) override { adds_->Inc(); }
  void OnDepth(size_t depth) override { depth_->Set(static_cast<double>(depth)); }
  void OnRetry(const std::string&) override { retries_->Inc(); }

 private:
  const std::shared_ptr<metrics::Gauge> depth_;
  const std::shared_ptr<metrics::Counter> adds_;
  const std::shared_ptr<metrics::Counter> retries_;
};

OperatorMetrics::OperatorMetrics(metrics::Registry* registry) : registry_(registry) {
  // 0.5 ms .. ~16 s: reconciles from the cache take milliseconds, API calls tens of them.
  const std::vector<double> latency = metrics::ExponentialBuckets(0.0005, 2, 16);
  reconcile_duration_ =
      Must(registry->AddHistogram({.name = "spawnpoint_reconcile_duration_seconds",
                                   .help = "Time per reconcile, by result (success, requeue, "
                                           "error).",
                                   .labels = {"result"}},
                                  latency));
  reconcile_errors_ = Must(registry->AddCounter({.name = "spawnpoint_reconcile_errors_total",
                                                 .help = "Reconciles that returned an error."}))
                          ->WithLabels({});
  auto per_namespace = [&](const char* name, const char* help) {
    return Must(registry->AddCounter({.name = name, .help = help, .labels = {"namespace"}}));
  };
  jobs_created_ = per_namespace("spawnpoint_jobs_created_total",
                                "TrainingJobs the operator started (first status written).");
  jobs_succeeded_ =
      per_namespace("spawnpoint_jobs_succeeded_total", "TrainingJobs that reached Succeeded.");
  jobs_failed_ = per_namespace("spawnpoint_jobs_failed_total", "TrainingJobs that reached Failed.");
  jobs_restarted_ =
      per_namespace("spawnpoint_jobs_restarted_total", "Whole-gang restarts the operator made.");
  admission_wait_ = Must(registry->AddHistogram(
      {.name = "spawnpoint_job_admission_wait_seconds",
       .help = "Time TrainingJobs' gangs waited for Kueue's admission (spec.scheduling.gang "
               "kueue), by namespace: from the Queued condition turning True (the whole gang "
               "created and gated, or evicted by Kueue) to its turning False (Admitted), "
               "observed once per admission.",
       .labels = {"namespace"}},
      kAdmissionWaitBuckets));
  queue_depth_ = Must(registry->AddGauge({.name = "spawnpoint_workqueue_depth",
                                          .help = "Job keys waiting for a worker."}))
                     ->WithLabels({});
  queue_adds_ = Must(registry->AddCounter({.name = "spawnpoint_workqueue_adds_total",
                                           .help = "Job keys added to the work queue."}))
                    ->WithLabels({});
  queue_retries_ =
      Must(registry->AddCounter({.name = "spawnpoint_workqueue_retries_total",
                                 .help = "Job keys re-added with backoff after a failure."}))
          ->WithLabels({});
  api_requests_ = Must(registry->AddCounter(
      {.name = "spawnpoint_api_requests_total",
       .help = "Kubernetes API requests by verb (HTTP method, WATCH for watches) and status "
               "code (0: no answer).",
       .labels = {"verb", "code"}}));
  api_duration_ = Must(registry->AddHistogram(
      {.name = "spawnpoint_api_request_duration_seconds",
       .help = "Kubernetes API request latency by verb (a watch: until its headers arrive).",
       .labels = {"verb"}},
      latency));
  leader_ = Must(registry->AddGauge({.name = "spawnpoint_leader",
                                     .help = "1 while this replica leads (or runs alone)."}))
                ->WithLabels({});
}

OperatorMetrics::~OperatorMetrics() { StopCollectingJobs(); }

void OperatorMetrics::ObserveReconcile(double seconds, const std::string& result) {
  reconcile_duration_->WithLabels({result})->Observe(seconds);
  if (result == "error") reconcile_errors_->Inc();
}

void OperatorMetrics::ObserveStatusWrite(const std::string& ns, const std::string& old_phase,
                                         const std::string& new_phase, int old_restarts,
                                         int new_restarts,
                                         std::optional<Clock::Duration> admission_wait) {
  // Every namespace's series exist from its first job on, at 0, so rate() and increase()
  // see the first success or failure rather than a series appearing.
  auto created = jobs_created_->WithLabels({ns});
  auto succeeded = jobs_succeeded_->WithLabels({ns});
  auto failed = jobs_failed_->WithLabels({ns});
  auto restarted = jobs_restarted_->WithLabels({ns});
  auto waited = admission_wait_->WithLabels({ns});
  if (old_phase.empty() && !new_phase.empty()) created->Inc();
  if (new_phase != old_phase && new_phase == phase::kSucceeded) succeeded->Inc();
  if (new_phase != old_phase && new_phase == phase::kFailed) failed->Inc();
  if (new_restarts > old_restarts) restarted->Inc(new_restarts - old_restarts);
  if (admission_wait) waited->Observe(std::chrono::duration<double>(*admission_wait).count());
}

void OperatorMetrics::SetLeader(bool leader) { leader_->Set(leader ? 1 : 0); }

std::shared_ptr<kube::WorkQueueMetrics> OperatorMetrics::QueueHooks() {
  return std::make_shared<QueueHooksImpl>(queue_depth_, queue_adds_, queue_retries_);
}

void OperatorMetrics::ObserveApiRequest(const std::string& verb, int code, double seconds) {
  api_requests_->WithLabels({verb, std::to_string(code)})->Inc();
  api_duration_->WithLabels({verb})->Observe(seconds);
}

void OperatorMetrics::CollectJobs(const kube::Store* jobs, const WallClock* clock) {
  StopCollectingJobs();
  // Only the leader exports them: standby replicas have the same cache, and a dashboard's
  // sum over replicas would count every job once per replica.
  jobs_collector_ =
      registry_->AddCollector([jobs, clock, leader = leader_](std::vector<CollectedFamily>* out) {
        if (leader->Value() != 1) return;
        for (auto& family : JobFamilies(jobs->List(), clock->Now())) {
          out->push_back(std::move(family));
        }
      });
}

void OperatorMetrics::StopCollectingJobs() {
  if (jobs_collector_ != 0) registry_->RemoveCollector(jobs_collector_);
  jobs_collector_ = 0;
}

std::optional<WallTime> PendingSince(const nlohmann::json& job) {
  std::string current = Str(job, "/status/phase"_json_pointer);
  if (current.empty()) current = phase::kPending;
  if (current != phase::kPending && current != phase::kQueued) return std::nullopt;
  std::optional<WallTime> since = ParseTime(Str(job, "/metadata/creationTimestamp"_json_pointer));
  const auto conditions = "/status/conditions"_json_pointer;
  if (job.contains(conditions) && job.at(conditions).is_array()) {
    for (const auto& c : job.at(conditions)) {
      if (!c.is_object() || c.value("status", "") != "False") continue;
      const std::string type = c.value("type", "");
      if (type != condition::kRunning && type != condition::kSuspended &&
          type != condition::kFailed) {
        continue;
      }
      std::optional<WallTime> at = ParseTime(c.value("lastTransitionTime", ""));
      if (at && (!since || *at > *since)) since = at;
    }
  }
  return since;
}

std::vector<CollectedFamily> JobFamilies(const std::vector<kube::ObjectPtr>& jobs, WallTime now) {
  std::map<std::string, std::map<std::string, int>> by_namespace;  // namespace -> phase -> n
  CollectedFamily conditions{
      .name = "spawnpoint_job_condition",
      .help =
          "1 for each True condition of a TrainingJob, by its type and reason "
          "(status.conditions); a False or absent condition has no series. Every job the "
          "operator knows, finished ones too, until it is deleted.",
      .label_names = {"namespace", "job", "type", "reason"}};
  CollectedFamily pending{
      .name = "spawnpoint_job_pending_seconds",
      .help =
          "Seconds a Pending or Queued TrainingJob has waited for its pods to run: since "
          "it was created, last stopped running, was resumed or had its spec corrected, "
          "whichever came last. No series in other phases.",
      .label_names = {"namespace", "job"}};
  CollectedFamily gpu{.name = "spawnpoint_job_gpu_utilisation_ratio",
                      .help =
                          "Mean GPU utilisation (0-1) of a running job's GPUs, from "
                          "status.utilisation.gpu.",
                      .label_names = {"namespace", "job"}};
  CollectedFamily stall{.name = "spawnpoint_job_data_stall_ratio",
                        .help =
                            "Fraction of time a running job's ranks waited for data (0-1), "
                            "from status.utilisation.dataStall.",
                        .label_names = {"namespace", "job"}};
  CollectedFamily samples{.name = "spawnpoint_job_samples_per_second",
                          .help =
                              "Samples per second over a running job's ranks, from "
                              "status.utilisation.samplesPerSecond.",
                          .label_names = {"namespace", "job"}};
  CollectedFamily straggler{
      .name = "spawnpoint_job_straggler_ratio",
      .help =
          "A running job's slowest rank's own work per step over the median of its other "
          "ranks' (own work: step time minus the wait for peers; medians over 20 steps), "
          "judged over every node, from status.utilisation.slowestRankRatio; 0 while fewer "
          "than two ranks have 20 steps.",
      .label_names = {"namespace", "job"}};
  for (const kube::ObjectPtr& job : jobs) {
    const std::string ns = NamespaceOf(*job), name = NameOf(*job);
    std::string current = Str(*job, "/status/phase"_json_pointer);
    if (current.empty()) current = phase::kPending;
    ++by_namespace[ns][current];
    const auto c = "/status/conditions"_json_pointer;
    if (job->contains(c) && job->at(c).is_array()) {
      std::set<std::string> types;  // one series per type, should a status repeat one
      for (const auto& cond : job->at(c)) {
        if (!cond.is_object() || cond.value("status", "") != "True") continue;
        const std::string type = cond.value("type", "");
        if (type.empty() || !types.insert(type).second) continue;
        conditions.Add({ns, name, type, cond.value("reason", "")}, 1);
      }
    }
    if (std::optional<WallTime> since = PendingSince(*job)) {
      // A clock behind the API server's reads a wait just begun as 0, never negative.
      pending.Add({ns, name}, std::max(0.0, std::chrono::duration<double>(now - *since).count()));
    }
    if (current != phase::kRunning) continue;
    const auto u = "/status/utilisation"_json_pointer;
    const auto slowest = u / "slowestRankRatio";
    straggler.Add({ns, name}, job->contains(slowest) && job->at(slowest).is_number()
                                  ? job->at(slowest).get<double>()
                                  : 0.0);
    if (!job->contains(u)) continue;
    for (auto [field, family] : {std::pair{"gpu", &gpu}, std::pair{"dataStall", &stall},
                                 std::pair{"samplesPerSecond", &samples}}) {
      const auto at = u / field;
      if (job->contains(at) && job->at(at).is_number()) {
        family->Add({ns, name}, job->at(at).get<double>());
      }
    }
  }
  CollectedFamily phases{.name = "spawnpoint_jobs",
                         .help =
                             "TrainingJobs by phase (a job not yet reconciled counts as "
                             "Pending).",
                         .label_names = {"namespace", "phase"}};
  for (const auto& [ns, counts] : by_namespace) {
    for (const char* p : kPhases) {
      auto it = counts.find(p);
      phases.Add({ns, p}, it == counts.end() ? 0 : it->second);
    }
    for (const auto& [p, n] : counts) {
      // A phase newer than this operator still counts.
      if (std::find(std::begin(kPhases), std::end(kPhases), p) == std::end(kPhases)) {
        phases.Add({ns, p}, n);
      }
    }
  }
  std::vector<CollectedFamily> out;
  out.push_back(std::move(phases));
  for (CollectedFamily* f : {&conditions, &pending, &gpu, &stall, &samples, &straggler}) {
    if (!f->samples.empty()) out.push_back(std::move(*f));
  }
  return out;
}

}  // namespace spawnpoint::op
