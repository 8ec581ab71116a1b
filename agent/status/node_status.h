// What one node agent exports about its node: Prometheus metrics (per GPU, per rank, per
// node) and the JSON status document, which the agent serves at /status (the operator reads
// it for a job's status.utilisation) and writes to --status-file. Both views come from the
// same reading, so they agree. The document is described field by field in docs/status.md.
//
// Two kinds of input:
//  - events from the gang supervision (OnPhase, OnRankFailure): phases, ranks up, restarts,
//    the last failure; and from the stall monitor (OnProgress, OnStall): every rank's steps
//    and the named stall;
//  - readings taken when someone asks (a scrape, Publish()): the GPU backend's Sample(),
//    every rank's loader statistics file (loader::StatsPath) and every pool's StatusJson().
//
// One document, one serializer: Publish() takes a reading, makes the next document, hands
// its text to NodeStatusOptions::on_document (the status file's writer) and returns the
// same text (what /status serves). Documents are made and handed on one at a time, in
// order, so the file never goes back to an older one.
//
// The loader's counts restart from zero when a rank restarts (a new Loader); the exported
// counters add the previous incarnation's last value, so they only ever go up.
//
// Thread-safety: every method is thread-safe; readings from concurrent scrapes are
// serialised. The GPU backend, the pool_status callback and on_document must be
// thread-safe (on_document is called under a lock, one call at a time).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/devices/gpu_backend.h"
#include "agent/plan/node_plan.h"
#include "agent/run/stall_watch.h"
#include "agent/run/straggler_watch.h"
#include "metrics/registry.h"

namespace spawnpoint::agent {

// Who this agent is, for labels.
struct NodeIdentity {
  std::string job;
  std::string job_namespace;
  std::string pod;        // "" when unknown
  std::string container;  // "" when unknown
  std::string hostname;   // the node's, as DCGM exporter's Hostname label
  int node_rank = 0;
};

// From the environment the operator gives its pods (POD_NAME and POD_NAMESPACE through the
// downward API, CONTAINER_NAME, NODE_NAME): pod = POD_NAME, else `host_name` inside
// Kubernetes (KUBERNETES_SERVICE_HOST set; a pod's hostname is its name), else "";
// namespace = POD_NAMESPACE, else the job's; container = CONTAINER_NAME or "";
// hostname = NODE_NAME, else `host_name`. Pure.
NodeIdentity IdentityFromEnvironment(const std::map<std::string, std::string>& env,
                                     const std::string& host_name, const std::string& job,
                                     const std::string& job_namespace, int node_rank);

struct RankInfo {
  int rank = 0;
  int local_rank = 0;
  int gpu_index = -1;    // the backend's index of the GPU the rank uses; -1: a CPU rank
  std::string pool_dir;  // its loader pool directory; "" without an agent-owned pool
};

// The ranks of a node plan, and the GPUs they use (each once, in rank order). Pure.
std::vector<RankInfo> RanksOfPlan(const NodePlan& plan);
std::vector<devices::GpuDevice> GpusOfPlan(const NodePlan& plan);

struct NodeStatusOptions {
  NodeIdentity identity;
  std::vector<RankInfo> ranks;
  std::vector<devices::GpuDevice> gpus;        // the GPUs the ranks use: labels and the mean
  devices::GpuBackend* gpu_backend = nullptr;  // sampled when read; nullptr: no GPU metrics
  std::string gpu_backend_name = "none";
  // Every agent-owned pool's PoolSupervisor::StatusJson(); empty: no pools.
  std::function<std::vector<nlohmann::json>()> pool_status;
  // Also export DCGM exporter's names and labels, so DCGM dashboards (Grafana 12239) work.
  bool dcgm_compatible_names = false;
  int restart_count = 0;  // gang restarts made before this agent started (--restart-count)
  // The gang's members: this node's ranks (-1: ranks.size()), or the node agents when the
  // agent runs a job's every node on this machine (and has no ranks of its own).
  int members = -1;
  // Called with each new document's text (newline-terminated, byte for byte what /status
  // serves), one call at a time, in order; nullptr: nobody. The agent writes its
  // --status-file here.
  std::function<void(const std::string& text)> on_document;
};

class NodeStatus {
 public:
  explicit NodeStatus(NodeStatusOptions options);
  NodeStatus(const NodeStatus&) = delete;
  NodeStatus& operator=(const NodeStatus&) = delete;

  // The gang's state, as the agent's status line reports it: phase is "Running",
  // "Restarting", "Succeeded", "Failed" or "Terminated"; `up` members are running (0 but
  // while Running; `total` is not used: the members are fixed); restarts counts gang
  // restarts so far (including those before this agent started). Then publishes.
  void OnPhase(const std::string& phase, int up, int total, int restarts);
  // A rank failed with a classified reason (exit_cause.h: "OOMKilled", "UserError", ...).
  // `failure` (RankFailure::ToJson(): rank, exit code, signal, cause) becomes the
  // document's lastFailure from the next document on; null keeps the previous one. Rank -1:
  // the agent's own failure, counted in no rank's metrics.
  void OnRankFailure(int rank, const std::string& reason, const nlohmann::json& failure = nullptr);
  // The ranks' progress records as the stall monitor read them at a gang tick
  // (StallMonitor::Options::on_progress): `median_step_seconds` is the job's on this node (0:
  // no step yet), `now_ns` the CLOCK_MONOTONIC time of the reading. Counts the new steps and
  // observes their durations (from each record's recent durations) into the step metrics,
  // sets the last step's age, and keeps the figures for the next document's "progress" and
  // "medianStepSeconds". A record whose started_ns changed is a new attempt's: its steps
  // count from zero again. Does not publish (ticks are frequent).
  void OnProgress(const std::vector<RankProgress>& ranks, double median_step_seconds,
                  int64_t now_ns);
  // The named stall (StallJson: rank, pod, silentSeconds, ...), or null once it is cleared
  // (StallMonitor::Options::on_stall): the document's "stall" and its rank's "stalled", and
  // spawnpoint_rank_stalled. Then publishes.
  void OnStall(const nlohmann::json& stall);
  // The ranks' own work and wait per step and the straggler verdict at a gang tick
  // (StallMonitor::Options::on_straggler): each rank's "busySeconds" and "waitSeconds" in
  // "progress", the document's "straggler" (StragglerJson or null) and
  // spawnpoint_job_straggler_ratio (the slowest rank's ratio; 0 while not judged).
  // Publishes when `changed`.
  void OnStraggler(const std::vector<RankBusy>& busy, double ratio, const nlohmann::json& straggler,
                   bool changed);

  // Each warm standby's resident memory, by rank, and the ranks whose standby is ready
  // (agent/run/standby_rank.h), as of a gang tick: the document's "standbys" ([{"rank",
  // "memoryBytes", "ready"}]) and spawnpoint_rank_standby_memory_bytes (0 for a rank without
  // one). Does not publish.
  void OnStandbys(const std::map<int, int64_t>& memory_bytes, const std::set<int>& ready);

  std::string phase() const;
  // Takes a reading and publishes the next document (see above): its text, as /status
  // serves it and on_document got it.
  std::string Publish();
  // Publish(), parsed.
  nlohmann::json StatusJson();
  // The text of the last document published; "" before the first.
  std::string LastDocument() const;
  // Holds every metric; render it for /metrics.
  metrics::Registry& registry() { return registry_; }

 private:
  // Keeps a counter monotonic across resets of its source (a restarted rank's Loader).
  struct Monotonic {
    double base = 0, last = 0;
    double Update(double v) {
      if (v < last) base += last;
      last = v;
      return base + v;
    }
  };
  struct GpuReading {
    devices::GpuDevice device;
    int rank = -1;
    std::optional<devices::GpuSample> sample;
  };
  struct RankReading {
    RankInfo info;
    bool up = false;
    std::optional<nlohmann::json> stats;                // the Loader's stats.json as written
    std::optional<nlohmann::json> pool;                 // the pool's StatusJson()
    double batches = 0, samples = 0, wait_seconds = 0;  // monotonic
    std::map<std::string, double> worker_restarts;      // by cause, monotonic
  };
  struct Reading {
    std::vector<GpuReading> gpus;
    std::string gpu_error;
    std::vector<RankReading> ranks;
    std::string phase;
    int ranks_up = 0;
    int members_up = 0;
    int restarts = 0;
    nlohmann::json last_failure;
    nlohmann::json progress;  // the document's "progress" (an array)
    double median_step_seconds = 0;
    nlohmann::json stall;
    nlohmann::json straggler;
    nlohmann::json standbys;
  };
  // One rank's progress as of the last tick.
  struct RankSteps {
    int rank = 0;
    uint64_t steps = 0;
    double last_step_age_seconds = 0;  // not known before the rank's first step
    progress::StepSource source = progress::StepSource::kNone;
    int64_t started_ns = 0;  // which attempt's record
  };

  Reading Read();  // takes mu_
  // OnPhase's bookkeeping. REQUIRES: mu_ held.
  void Apply(const std::string& phase, int up, int total, int restarts);
  void Collect(std::vector<metrics::CollectedFamily>* out);
  // The document of one reading. REQUIRES: doc_mu_ held.
  nlohmann::json Document(const Reading& r);

  const NodeStatusOptions options_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  metrics::Registry registry_;
  // Families kept up to date by events.
  metrics::Family<metrics::Gauge>* rank_up_ = nullptr;
  metrics::Family<metrics::Counter>* rank_restarts_ = nullptr;
  metrics::Family<metrics::Counter>* rank_failures_ = nullptr;
  metrics::Family<metrics::Gauge>* ranks_ = nullptr;
  metrics::Family<metrics::Gauge>* ranks_up_ = nullptr;
  metrics::Family<metrics::Counter>* restarts_total_ = nullptr;
  metrics::Family<metrics::Gauge>* phase_ = nullptr;
  metrics::Family<metrics::Counter>* gpu_errors_ = nullptr;
  metrics::Family<metrics::Counter>* rank_steps_ = nullptr;
  metrics::Family<metrics::Histogram>* rank_step_seconds_ = nullptr;
  metrics::Family<metrics::Gauge>* rank_last_step_age_ = nullptr;
  metrics::Family<metrics::Gauge>* rank_stalled_ = nullptr;
  metrics::Family<metrics::Gauge>* straggler_ratio_ = nullptr;
  metrics::Family<metrics::Gauge>* standby_memory_ = nullptr;

  // Publishing: held while a document is made and handed to on_document, so documents
  // go out one at a time and in order. Taken before mu_, never while holding it.
  mutable std::mutex doc_mu_;
  std::string last_document_;  // guarded by doc_mu_

  mutable std::mutex mu_;  // the state below and the readings
  std::string phase_name_ = "Starting";
  std::vector<bool> up_;  // per entry of options_.ranks
  int ranks_up_count_ = 0;
  int members_up_ = 0;
  int restarts_ = 0;
  nlohmann::json last_failure_;                                 // null until a rank fails
  std::map<std::pair<int, std::string>, Monotonic> monotonic_;  // (rank, field)
  std::vector<RankSteps> progress_;  // the last tick's, in rank order; empty before it
  double median_step_seconds_ = 0;   // the last tick's; 0: no step yet
  nlohmann::json stall_;             // the named stall; null when none
  std::vector<RankBusy> busy_;       // the last tick's medians (any order)
  nlohmann::json straggler_;         // the named straggler; null when none
  nlohmann::json standbys_ = nlohmann::json::array();  // the last tick's standbys
};

}  // namespace spawnpoint::agent
