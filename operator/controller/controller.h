// The TrainingJob controller: informers for TrainingJobs and for the pods and services
// they own (selected by the spawnpoint.dev/job-name label), whose events enqueue the
// owning job's "namespace/name", and for ResourceQuotas, whose changes enqueue the jobs of
// their namespace that a quota refused (QuotaExceeded); a rate-limited work queue; and N workers
// that each take a key, reconcile it and requeue it by the result: time-driven work with AddAfter,
// a 409 or a 429/5xx with the key's exponential backoff, a terminal error (422) only logged. The
// queue never hands one key to two workers, so one job is never reconciled concurrently.
// Informers may run before this replica leads (warm caches for a fast failover); workers
// start only when it should act. Thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "operator/common/log.h"
#include "operator/common/wall_clock.h"
#include "operator/controller/event_recorder.h"
#include "operator/controller/kube_cluster.h"
#include "operator/kube/client.h"
#include "operator/kube/informer.h"
#include "operator/kube/workqueue.h"
#include "operator/metrics/operator_metrics.h"
#include "operator/reconciler/reconciler.h"
#include "operator/utilisation/gang_watcher.h"
#include "operator/utilisation/utilisation_poller.h"

namespace spawnpoint::op {

struct ControllerOptions {
  std::vector<std::string> namespaces;  // empty: every namespace
  int workers = 4;
  ReconcilerOptions reconciler;
  // Every period each cached job is reconciled again (0: never; events suffice).
  Clock::Duration resync_period{0};
  std::string instance;  // this replica's identity (events' reportingInstance)
  // Watch ResourceQuotas (list and watch on resourcequotas): a refused job is tried again as
  // soon as its namespace's quota changes, not only after its retry delay. Not waited for by
  // HasSynced: a watch the RBAC refuses costs only that.
  bool watch_quotas = true;
};

class Controller {
 public:
  Controller(kube::Client* client, const WallClock* clock, ControllerOptions options,
             OperatorMetrics* metrics, UtilisationSource* utilisation, Logger log);
  ~Controller();  // Stop()

  void StartInformers();
  bool HasSynced() const;
  bool WaitForSync(std::chrono::milliseconds timeout) const;
  // Starts the workers (idempotent). Call after the caches synced.
  void StartWorkers();
  // Stops the workers (in-flight reconciles finish), the informers and the event recorder.
  void Stop();

  void Enqueue(const std::string& ns, const std::string& name);
  // Running jobs and their pods' IPs, for the utilisation poller.
  std::vector<RunningJob> RunningJobs() const;
  // Running or Restarting jobs whose gang restarts in place, and their current pods' IPs in
  // node order, for the gang watcher.
  std::vector<GangJob> GangJobs() const;

  const kube::Store& jobs() const { return jobs_.store(); }
  const kube::Store& pods() const { return pods_.store(); }
  kube::WorkQueue& queue() { return queue_; }

 private:
  void Worker(int index);
  void ProcessKey(const std::string& key);
  void EnqueueOwner(const kube::ObjectPtr& object);
  // Every job of `ns` whose condition QuotaExceeded is True.
  void EnqueueQuotaRefused(const std::string& ns);

  kube::Client* const client_;
  const WallClock* const clock_;
  // The job's status token, or "" without status tokens.
  std::string StatusToken(const nlohmann::json& job) const;

  const ControllerOptions options_;
  OperatorMetrics* const metrics_;
  const Logger log_;

  kube::Informer jobs_;
  kube::Informer pods_;
  kube::Informer services_;
  std::unique_ptr<kube::Informer> quotas_;  // null unless options_.watch_quotas
  kube::WorkQueue queue_;
  EventRecorder events_;
  KubeCluster cluster_;
  Reconciler reconciler_;

  std::atomic<bool> workers_started_{false};
  std::atomic<bool> stopped_{false};
  std::atomic<uint64_t> reconcile_seq_{0};
  std::vector<std::thread> workers_;
};

}  // namespace spawnpoint::op
