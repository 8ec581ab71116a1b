// The operator's Prometheus metrics, with the names and labels of docs/metrics.md, kept in
// a metrics::Registry that the operator serves at /metrics:
//   - reconciles: duration histogram by result, errors;
//   - the work queue: depth, adds, retries (QueueHooks());
//   - Kubernetes API requests by verb (the HTTP method; WATCH for watches) and code, with
//     latency (ObserveApiRequest, wired to kube::ClientOptions::on_response);
//   - leadership;
//   - job lifecycle totals by namespace, counted from this replica's own status writes
//     (ObserveStatusWrite), so only the leader counts and replicas never double-count;
//   - jobs by phase, and per running job GPU utilisation, data stall, samples per second
//     and the slowest rank's ratio (spawnpoint_job_straggler_ratio), computed at scrape
//     time from the informer cache by the leader only (CollectJobs), so replicas never
//     export a job twice: a finished or deleted job's series are gone from the next scrape,
//     so cardinality is bounded by the live jobs.
// Thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "metrics/registry.h"
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
  // A status write this replica made: the phase and the restart count before and after.
  void ObserveStatusWrite(const std::string& ns, const std::string& old_phase,
                          const std::string& new_phase, int old_restarts, int new_restarts);
  void SetLeader(bool leader);
  // For kube::WorkQueueOptions::metrics: the queue's depth, adds and retries.
  std::shared_ptr<kube::WorkQueueMetrics> QueueHooks();
  // code 0: the request got no answer (connection refused, timeout).
  void ObserveApiRequest(const std::string& verb, int code, double seconds);
  // Reads `jobs` (the TrainingJob informer's cache) on every scrape while SetLeader(true)
  // holds; `jobs` must outlive this object or StopCollectingJobs(), which waits for a
  // scrape in progress, must come first.
  void CollectJobs(const kube::Store* jobs);
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
  std::shared_ptr<metrics::Gauge> queue_depth_;
  std::shared_ptr<metrics::Counter> queue_adds_;
  std::shared_ptr<metrics::Counter> queue_retries_;
  metrics::Family<metrics::Counter>* api_requests_;
  metrics::Family<metrics::Histogram>* api_duration_;
  std::shared_ptr<metrics::Gauge> leader_;
  int jobs_collector_ = 0;
};

// What CollectJobs exports for these TrainingJob objects: spawnpoint_jobs by namespace and
// phase (every phase of a namespace that has jobs, 0 for the empty ones), the per-job
// utilisation gauges of running jobs that report them, and spawnpoint_job_straggler_ratio
// for every running job (0 until it has a figure).
std::vector<metrics::CollectedFamily> JobFamilies(const std::vector<kube::ObjectPtr>& jobs);

}  // namespace spawnpoint::op
