// The operator's Prometheus metrics, with the names and labels of docs/metrics.md, kept in
// a metrics::Registry that the operator serves at /metrics:
//   - reconciles: duration histogram by result, errors;
//   - the work queue: depth, adds, retries (QueueHooks());
//   - Kubernetes API requests by verb (the HTTP method; WATCH for watches) and code, with
//     latency (ObserveApiRequest, wired to kube::ClientOptions::on_response);
//   - leadership;
//   - job lifecycle totals by namespace, and the time gangs waited for Kueue's admission,
//     counted from this replica's own status writes (ObserveStatusWrite), so only the leader
//     counts and replicas never double-count;
//   - jobs by phase, each job's True conditions, how long a Pending or Queued job has
//     waited, and per running job GPU utilisation, data stall, samples per second and the
//     slowest rank's ratio (spawnpoint_job_straggler_ratio), computed at scrape time from the
//     informer cache by the leader only (CollectJobs), so replicas never export a job twice:
//     a deleted job's series (and a finished job's, but for its conditions) are gone from
//     the next scrape, so cardinality is bounded by the live jobs.
// Thread-safe.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "metrics/registry.h"
#include "operator/common/wall_clock.h"
#include "operator/kube/store.h"
#include "operator/kube/workqueue.h"

namespace spawnpoint::op {

class OperatorMetrics {
 public:
  // Registers every family in `registry`, which must outlive this object.
  explicit OperatorMetrics(metrics::Registry* registry);
  ~OperatorMetrics();  // StopCollectingJobs()
  OperatorMetrics(const OperatorMetrics&) = delete;
  OperatorMetrics& operator=(const OperatorMetrics&) = delete;

  // result: "success", "requeue" or "error"; "error" also counts an error.
  void ObserveReconcile(double seconds, const std::string& result);
  // A status write this replica made: the phase and the restart count before and after, and
  // the wait for Kueue's admission it ended, if it did (ReconcileResult::admission_wait).
  void ObserveStatusWrite(const std::string& ns, const std::string& old_phase,
                          const std::string& new_phase, int old_restarts, int new_restarts,
                          std::optional<Clock::Duration> admission_wait = std::nullopt);
  void SetLeader(bool leader);
  // For kube::WorkQueueOptions::metrics: the queue's depth, adds and retries.
  std::shared_ptr<kube::WorkQueueMetrics> QueueHooks();
  // code 0: the request got no answer (connection refused, timeout).
  void ObserveApiRequest(const std::string& verb, int code, double seconds);
  // Reads `jobs` (the TrainingJob informer's cache) on every scrape while SetLeader(true)
  // holds, and `clock` for the waits of pending jobs; both must outlive this object or
  // StopCollectingJobs(), which waits for a scrape in progress, must come first.
  void CollectJobs(const kube::Store* jobs, const WallClock* clock);
  void StopCollectingJobs();

 private:
  class QueueHooksImpl;

  metrics::Registry* const registry_;
  metrics::Family<metrics::Histogram>* reconcile_duration_;
  std::shared_ptr<metrics::Counter> reconcile_errors_;
  metrics::Family<metrics::Counter>* jobs_created_;
  metrics::Family<metrics::Counter>* jobs_succeeded_;
  metrics::Family<metrics::Counter>* jobs_failed_;
  metrics::Family<metrics::Counter>* jobs_restarted_;
  metrics::Family<metrics::Histogram>* admission_wait_;
  std::shared_ptr<metrics::Gauge> queue_depth_;
  std::shared_ptr<metrics::Counter> queue_adds_;
  std::shared_ptr<metrics::Counter> queue_retries_;
  metrics::Family<metrics::Counter>* api_requests_;
  metrics::Family<metrics::Histogram>* api_duration_;
  std::shared_ptr<metrics::Gauge> leader_;
  int jobs_collector_ = 0;
};

// What CollectJobs exports for these TrainingJob objects at wall time `now`: spawnpoint_jobs
// by namespace and phase (every phase of a namespace that has jobs, 0 for the empty ones),
// spawnpoint_job_condition for each True condition of every job, spawnpoint_job_pending_seconds
// for every Pending or Queued job (PendingSince), the per-job utilisation gauges of running
// jobs that report them, and spawnpoint_job_straggler_ratio for every running job (0 until it
// has a figure).
std::vector<metrics::CollectedFamily> JobFamilies(const std::vector<kube::ObjectPtr>& jobs,
                                                  WallTime now);

// When a Pending or Queued job's current wait for its pods to run began: the latest of its
// creationTimestamp and the lastTransitionTime of its Running condition (False: it stopped
// running, or never ran), its Suspended condition (False: resumed) and its Failed condition
// (False: its spec was corrected). nullopt in any other phase, or when no time parses.
std::optional<WallTime> PendingSince(const nlohmann::json& job);

}  // namespace spawnpoint::op
