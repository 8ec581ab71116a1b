#include "agent/status/node_status.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <fstream>
#include <set>

#include "agent/loader/contract.h"

namespace spawnpoint::agent {
namespace {

using metrics::CollectedFamily;
using metrics::MetricType;
using nlohmann::json;

constexpr const char* kPhases[] = {"Starting",  "Running", "Restarting",
                                   "Succeeded", "Failed",  "Terminated"};
// The Loader's restart causes (LoaderStats: restarts.died, hung, oom, shm).
constexpr const char* kWorkerCauses[] = {"died", "hung", "oom", "shm"};

std::string Env(const std::map<std::string, std::string>& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() ? "" : it->second;
}

std::optional<json> ReadJsonFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  return j;
}

double Number(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

std::string UtcNow() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// The document's "stepSource": where the rank's steps are counted; null before its first.
json StepSourceName(progress::StepSource source) {
  switch (source) {
    case progress::StepSource::kOptimizer:
      return "optimizer";
    case progress::StepSource::kLoader:
      return "loader";
    case progress::StepSource::kExplicit:
      return "explicit";
    case progress::StepSource::kNone:
      break;
  }
  return nullptr;
}

template <typename T>
T* Must(StatusOr<T*> family) {
  // The names are constants of this file, checked by the tests: registration cannot fail.
  return family.ok() ? *family : nullptr;
}

}  // namespace

NodeIdentity IdentityFromEnvironment(const std::map<std::string, std::string>& env,
                                     const std::string& host_name, const std::string& job,
                                     const std::string& job_namespace, int node_rank) {
  NodeIdentity id;
  id.job = job;
  id.node_rank = node_rank;
  id.pod = Env(env, "POD_NAME");
  if (id.pod.empty() && !Env(env, "KUBERNETES_SERVICE_HOST").empty()) id.pod = host_name;
  id.job_namespace = Env(env, "POD_NAMESPACE");
  if (id.job_namespace.empty()) id.job_namespace = job_namespace;
  id.container = Env(env, "CONTAINER_NAME");
  id.hostname = Env(env, "NODE_NAME");
  if (id.hostname.empty()) id.hostname = host_name;
  return id;
}

std::vector<RankInfo> RanksOfPlan(const NodePlan& plan) {
  std::vector<RankInfo> out;
  for (const auto& r : plan.ranks) {
    RankInfo info;
    info.rank = r.rank;
    info.local_rank = r.local_rank;
    const auto& d = r.devices;
    if (d.device_ordinal >= 0 && d.device_ordinal < static_cast<int>(d.visible.size())) {
      info.gpu_index = d.visible[d.device_ordinal].index;
    }
    if (r.pool) info.pool_dir = r.pool->dir;
    out.push_back(info);
  }
  return out;
}

std::vector<devices::GpuDevice> GpusOfPlan(const NodePlan& plan) {
  std::vector<devices::GpuDevice> out;
  std::set<int> seen;
  for (const auto& r : plan.ranks) {
    const auto& d = r.devices;
    if (d.device_ordinal >= 0 && d.device_ordinal < static_cast<int>(d.visible.size()) &&
        seen.insert(d.visible[d.device_ordinal].index).second) {
      out.push_back(d.visible[d.device_ordinal]);
    }
  }
  return out;
}

NodeStatus::NodeStatus(NodeStatusOptions options)
    : options_(std::move(options)), up_(options_.ranks.size(), false) {
  const std::vector<std::string> node = {"namespace", "job"};
  const std::vector<std::string> rank = {"namespace", "job", "rank"};
  rank_up_ = Must(
      registry_.AddGauge({.name = "spawnpoint_rank_up",
                          .help = "1 while the rank's process runs in the current attempt, else 0.",
                          .labels = rank}));
  rank_restarts_ = Must(registry_.AddCounter(
      {.name = "spawnpoint_rank_restarts_total",
       .help = "Times the rank was restarted (whole-gang restarts of the job).",
       .labels = rank}));
  rank_failures_ = Must(registry_.AddCounter(
      {.name = "spawnpoint_rank_failures_total",
       .help = "Rank failures by classified reason (UserError, OOMKilled, ShmExhausted, ...).",
       .labels = {"namespace", "job", "rank", "reason"}}));
  ranks_ = Must(registry_.AddGauge(
      {.name = "spawnpoint_agent_ranks", .help = "Ranks this node runs.", .labels = node}));
  ranks_up_ = Must(
      registry_.AddGauge({.name = "spawnpoint_agent_ranks_up",
                          .help = "Ranks of this node running now (as of the last status tick).",
                          .labels = node}));
  restarts_total_ = Must(registry_.AddCounter(
      {.name = "spawnpoint_agent_restarts_total",
       .help = "Whole-gang restarts of the job, including those before this agent started.",
       .labels = node}));
  phase_ = Must(registry_.AddGauge(
      {.name = "spawnpoint_agent_phase",
       .help = "1 for the node's current phase (Starting, Running, Restarting, Succeeded, "
               "Failed, Terminated), 0 for the others.",
       .labels = {"namespace", "job", "phase"}}));
  gpu_errors_ = Must(registry_.AddCounter(
      {.name = "spawnpoint_agent_gpu_sample_errors_total",
       .help = "GPU readings that failed (the GPU metrics are missing from those scrapes).",
       .labels = node}));
  rank_steps_ = Must(registry_.AddCounter(
      {.name = "spawnpoint_rank_steps_total",
       .help = "Training steps the rank made (optimizer steps, loader batches or explicit "
               "spawnpoint.step() calls), over every attempt.",
       .labels = rank}));
  // 5 ms to ~82 s: steps of a small model on a CPU to those of a large one.
  rank_step_seconds_ = Must(registry_.AddHistogram(
      {.name = "spawnpoint_rank_step_seconds",
       .help = "Duration of the rank's training steps (from the previous step's end).",
       .labels = rank},
      metrics::ExponentialBuckets(0.005, 2, 15)));
  rank_last_step_age_ = Must(registry_.AddGauge(
      {.name = "spawnpoint_rank_last_step_age_seconds",
       .help = "Seconds since the rank's last step (since it started, before its first), as "
               "of the agent's last progress reading.",
       .labels = rank}));
  standby_memory_ = Must(registry_.AddGauge(
      {.name = "spawnpoint_rank_standby_memory_bytes",
       .help = "Resident memory of the rank's warm standby (restartPolicy.standby), 0 without "
               "one.",
       .labels = rank}));
  rank_stalled_ = Must(
      registry_.AddGauge({.name = "spawnpoint_rank_stalled",
                          .help = "1 while the rank is named as stalled (stallPolicy), else 0.",
                          .labels = rank}));
  straggler_ratio_ = Must(registry_.AddGauge(
      {.name = "spawnpoint_job_straggler_ratio",
       .help = "The slowest rank's work per step over the median of the other ranks' on this "
               "node (own work: step time minus the wait for peers; medians over 20 steps); 0 "
               "while fewer than two ranks have 20 steps.",
       .labels = node}));
  auto* info =
      Must(registry_.AddGauge({.name = "spawnpoint_agent_info",
                               .help = "Always 1; the labels describe the agent.",
                               .labels = {"namespace", "job", "pod", "node_rank", "gpu_backend"}}));
  auto* start = Must(registry_.AddGauge({.name = "spawnpoint_agent_start_time_seconds",
                                         .help = "When the agent started, in Unix time.",
                                         .labels = node}));

  const auto& id = options_.identity;
  info->WithLabels({id.job_namespace, id.job, id.pod, std::to_string(id.node_rank),
                    options_.gpu_backend_name})
      ->Set(1);
  start->WithLabels({id.job_namespace, id.job})->Set(static_cast<double>(std::time(nullptr)));
  ranks_->WithLabels({id.job_namespace, id.job})->Set(static_cast<double>(options_.ranks.size()));
  ranks_up_->WithLabels({id.job_namespace, id.job})->Set(0);
  restarts_total_->WithLabels({id.job_namespace, id.job})->Inc(options_.restart_count);
  gpu_errors_->WithLabels({id.job_namespace, id.job});
  straggler_ratio_->WithLabels({id.job_namespace, id.job})->Set(0);
  for (const char* p : kPhases) {
    phase_->WithLabels({id.job_namespace, id.job, p})->Set(std::string(p) == "Starting");
  }
  for (const auto& r : options_.ranks) {
    const std::vector<std::string> l = {id.job_namespace, id.job, std::to_string(r.rank)};
    rank_up_->WithLabels(l)->Set(0);
    rank_restarts_->WithLabels(l)->Inc(options_.restart_count);
    rank_steps_->WithLabels(l);
    rank_step_seconds_->WithLabels(l);
    rank_stalled_->WithLabels(l)->Set(0);
    standby_memory_->WithLabels(l)->Set(0);
  }
  restarts_ = options_.restart_count;
  registry_.AddCollector([this](std::vector<CollectedFamily>* out) { Collect(out); });
}

void NodeStatus::OnPhase(const std::string& phase, int up, int total, int restarts) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Apply(phase, up, total, restarts);
  }
  Publish();
}

void NodeStatus::Apply(const std::string& phase, int up, int total, int restarts) {
  const auto& id = options_.identity;
  phase_name_ = phase;
  // The gang reports how many ranks run, not which: all of them or none is exact; in
  // between (ranks finishing at different times, or being stopped after a failure) the
  // per-rank flags keep what was last known until the attempt ends (OnRankFailure, then a
  // phase other than Running, clear them).
  const bool running = phase == "Running";
  members_up_ = running ? up : 0;
  ranks_up_count_ = options_.ranks.empty() ? 0 : members_up_;
  if (!running || up == 0) {
    std::fill(up_.begin(), up_.end(), false);
  } else if (up == total) {
    std::fill(up_.begin(), up_.end(), true);
  }
  if (restarts > restarts_) {
    const int delta = restarts - restarts_;
    restarts_ = restarts;
    restarts_total_->WithLabels({id.job_namespace, id.job})->Inc(delta);
    for (const auto& r : options_.ranks) {
      rank_restarts_->WithLabels({id.job_namespace, id.job, std::to_string(r.rank)})->Inc(delta);
    }
  }
  ranks_up_->WithLabels({id.job_namespace, id.job})->Set(ranks_up_count_);
  for (size_t i = 0; i < options_.ranks.size(); ++i) {
    rank_up_->WithLabels({id.job_namespace, id.job, std::to_string(options_.ranks[i].rank)})
        ->Set(up_[i] ? 1 : 0);
  }
  for (const char* p : kPhases) {
    phase_->WithLabels({id.job_namespace, id.job, p})->Set(phase == p ? 1 : 0);
  }
}

void NodeStatus::OnRankFailure(int rank, const std::string& reason, const json& failure) {
  const auto& id = options_.identity;
  std::lock_guard<std::mutex> lock(mu_);
  if (failure.is_object()) {
    last_failure_ = failure;
    // Stable fields: "signal" is there, null, when no signal ended the rank.
    if (!last_failure_.contains("signal")) last_failure_["signal"] = nullptr;
    last_failure_["time"] = UtcNow();
  }
  if (rank < 0) return;  // the agent's own failure (AgentError): no rank's
  rank_failures_->WithLabels({id.job_namespace, id.job, std::to_string(rank), reason})->Inc();
  for (size_t i = 0; i < options_.ranks.size(); ++i) {
    if (options_.ranks[i].rank == rank) {
      up_[i] = false;
      rank_up_->WithLabels({id.job_namespace, id.job, std::to_string(rank)})->Set(0);
    }
  }
}

void NodeStatus::OnProgress(const std::vector<RankProgress>& ranks, double median_step_seconds,
                            int64_t now_ns) {
  const auto& id = options_.identity;
  std::vector<RankSteps> next;
  std::lock_guard<std::mutex> lock(mu_);
  for (const RankProgress& p : ranks) {
    const progress::ProgressSnapshot& s = p.snapshot;
    RankSteps r{.rank = p.rank,
                .steps = s.steps,
                .last_step_age_seconds = s.steps > 0 ? (now_ns - s.last_step_ns) / 1e9 : 0,
                .source = s.source,
                .started_ns = p.started_ns};
    // The steps since the last tick: all of them in a new attempt's record.
    uint64_t before = 0;
    for (const RankSteps& prev : progress_) {
      if (prev.rank == p.rank && prev.started_ns == p.started_ns && prev.steps <= s.steps) {
        before = prev.steps;
      }
    }
    const std::vector<std::string> l = {id.job_namespace, id.job, std::to_string(p.rank)};
    const uint64_t fresh = s.steps - before;
    if (fresh > 0) {
      rank_steps_->WithLabels(l)->Inc(static_cast<double>(fresh));
      // The ring's newest durations are those steps' (at most its 256).
      const size_t n = static_cast<size_t>(std::min<uint64_t>(fresh, s.recent_us.size()));
      auto histogram = rank_step_seconds_->WithLabels(l);
      for (size_t i = s.recent_us.size() - n; i < s.recent_us.size(); ++i) {
        histogram->Observe(s.recent_us[i] / 1e6);
      }
    }
    rank_last_step_age_->WithLabels(l)->Set(
        (now_ns - (s.steps > 0 ? s.last_step_ns : p.started_ns)) / 1e9);
    next.push_back(r);
  }
  std::sort(next.begin(), next.end(),
            [](const RankSteps& a, const RankSteps& b) { return a.rank < b.rank; });
  progress_ = std::move(next);
  median_step_seconds_ = median_step_seconds;
}

void NodeStatus::OnStall(const json& stall) {
  const auto& id = options_.identity;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stall_ = stall.is_object() ? stall : json(nullptr);
    const int stalled = stall_.is_object() ? stall_.value("rank", -1) : -1;
    for (const auto& r : options_.ranks) {
      rank_stalled_->WithLabels({id.job_namespace, id.job, std::to_string(r.rank)})
          ->Set(r.rank == stalled ? 1 : 0);
    }
  }
  Publish();
}

void NodeStatus::OnStandbys(const std::map<int, int64_t>& memory_bytes,
                            const std::set<int>& ready) {
  const auto& id = options_.identity;
  std::lock_guard<std::mutex> lock(mu_);
  standbys_ = json::array();
  for (const auto& r : options_.ranks) {
    auto it = memory_bytes.find(r.rank);
    const int64_t bytes = it != memory_bytes.end() ? it->second : 0;
    standby_memory_->WithLabels({id.job_namespace, id.job, std::to_string(r.rank)})
        ->Set(static_cast<double>(bytes));
    if (it != memory_bytes.end()) {
      standbys_.push_back(
          {{"rank", r.rank}, {"memoryBytes", bytes}, {"ready", ready.count(r.rank) > 0}});
    }
  }
}

void NodeStatus::OnStraggler(const std::vector<RankBusy>& busy, double ratio, const json& straggler,
                             bool changed) {
  const auto& id = options_.identity;
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = busy;
    straggler_ = straggler.is_object() ? straggler : json(nullptr);
    straggler_ratio_->WithLabels({id.job_namespace, id.job})->Set(ratio);
  }
  if (changed) Publish();
}

std::string NodeStatus::phase() const {
  std::lock_guard<std::mutex> lock(mu_);
  return phase_name_;
}

NodeStatus::Reading NodeStatus::Read() {
  Reading r;
  // The slow parts (GPU queries, file reads) run before the lock; only the bookkeeping of
  // the monotonic counters needs it.
  if (options_.gpu_backend != nullptr && !options_.gpus.empty()) {
    auto samples = options_.gpu_backend->Sample();
    if (!samples.ok()) {
      r.gpu_error = samples.status().message();
      gpu_errors_->WithLabels({options_.identity.job_namespace, options_.identity.job})->Inc();
    }
    for (const auto& d : options_.gpus) {
      GpuReading g;
      g.device = d;
      for (const auto& rank : options_.ranks) {
        if (rank.gpu_index == d.index) g.rank = rank.rank;
      }
      if (samples.ok()) {
        for (const auto& s : *samples) {
          if (s.index == d.index) g.sample = s;
        }
      }
      r.gpus.push_back(std::move(g));
    }
  }
  std::vector<json> pools = options_.pool_status ? options_.pool_status() : std::vector<json>{};
  for (const auto& info : options_.ranks) {
    RankReading rr;
    rr.info = info;
    if (!info.pool_dir.empty()) rr.stats = ReadJsonFile(loader::StatsPath(info.pool_dir));
    for (const auto& p : pools) {
      if (p.is_object() && p.value("rank", -1) == info.rank) rr.pool = p;
    }
    r.ranks.push_back(std::move(rr));
  }

  std::lock_guard<std::mutex> lock(mu_);
  r.phase = phase_name_;
  r.ranks_up = ranks_up_count_;
  r.members_up = members_up_;
  r.restarts = restarts_;
  r.last_failure = last_failure_;
  r.median_step_seconds = median_step_seconds_;
  r.stall = stall_;
  r.straggler = straggler_;
  r.standbys = standbys_;
  r.progress = json::array();
  const int stalled = stall_.is_object() ? stall_.value("rank", -1) : -1;
  for (const RankSteps& p : progress_) {
    r.progress.push_back(
        {{"rank", p.rank},
         {"steps", p.steps},
         {"lastStepAgeSeconds", p.steps > 0 ? json(p.last_step_age_seconds) : json(nullptr)},
         {"stepSource", StepSourceName(p.source)},
         {"stalled", p.rank == stalled},
         {"busySeconds", nullptr},
         {"waitSeconds", nullptr}});
    for (const RankBusy& b : busy_) {
      if (b.rank != p.rank) continue;
      if (b.busy_seconds) r.progress.back()["busySeconds"] = *b.busy_seconds;
      if (b.wait_seconds) r.progress.back()["waitSeconds"] = *b.wait_seconds;
    }
  }
  for (size_t i = 0; i < r.ranks.size(); ++i) {
    RankReading& rr = r.ranks[i];
    rr.up = up_[i];
    if (!rr.stats) continue;
    const json& s = *rr.stats;
    auto mono = [&](const std::string& field, double v) {
      return monotonic_[{rr.info.rank, field}].Update(v);
    };
    rr.batches = mono("batches", Number(s, "batches"));
    rr.samples = mono("samples", Number(s, "samples"));
    rr.wait_seconds = mono("waitSeconds", Number(s, "waitSeconds"));
    const json restarts = s.value("restarts", json::object());
    for (const char* cause : kWorkerCauses) {
      rr.worker_restarts[cause] = mono(std::string("restarts.") + cause,
                                       restarts.is_object() ? Number(restarts, cause) : 0);
    }
  }
  return r;
}

std::string NodeStatus::Publish() {
  std::lock_guard<std::mutex> lock(doc_mu_);
  std::string text = Document(Read()).dump() + "\n";
  last_document_ = text;
  if (options_.on_document) options_.on_document(text);
  return text;
}

json NodeStatus::StatusJson() { return json::parse(Publish()); }

std::string NodeStatus::LastDocument() const {
  std::lock_guard<std::mutex> lock(doc_mu_);
  return last_document_;
}

json NodeStatus::Document(const Reading& r) {
  const auto& id = options_.identity;
  json gpus = json::array();
  double util_sum = 0;
  int util_n = 0;
  for (const auto& g : r.gpus) {
    json e = {{"gpu", g.device.index},
              {"uuid", g.device.uuid},
              {"pciBusId", g.device.pci_bus_id},
              {"modelName", g.device.name},
              {"rank", g.rank >= 0 ? json(g.rank) : json(nullptr)}};
    // Every reading is there, null when the backend gave none.
    auto value = [](const auto& v) { return v ? json(*v) : json(nullptr); };
    const devices::GpuSample none{};
    const auto& s = g.sample ? *g.sample : none;
    e["utilisation"] = value(s.utilisation);
    e["memoryUsedBytes"] = value(s.memory_used_bytes);
    e["memoryTotalBytes"] = value(s.memory_total_bytes);
    e["powerWatts"] = value(s.power_watts);
    e["temperatureCelsius"] = value(s.temperature_celsius);
    if (s.utilisation) {
      util_sum += *s.utilisation;
      ++util_n;
    }
    gpus.push_back(std::move(e));
  }

  json loader = json::array();
  double stall_sum = 0, sps_sum = 0;
  int stall_n = 0, sps_n = 0;
  for (const auto& rr : r.ranks) {
    json e = {{"rank", rr.info.rank},
              {"localRank", rr.info.local_rank},
              {"up", rr.up},
              {"stats", rr.stats ? *rr.stats : json(nullptr)},
              {"pool", rr.pool ? *rr.pool : json(nullptr)}};
    if (rr.stats) {
      e["stats"] = *rr.stats;
      ++sps_n;
      if (rr.up) {
        sps_sum += Number(*rr.stats, "samplesPerSecond");
        stall_sum += Number(*rr.stats, "dataStall");
        ++stall_n;
      }
    }
    loader.push_back(std::move(e));
  }

  json out = {
      {"job", id.job},
      {"namespace", id.job_namespace},
      {"nodeRank", id.node_rank},
      {"pod", id.pod},
      {"hostname", id.hostname},
      {"phase", r.phase},
      {"members",
       options_.members >= 0 ? options_.members : static_cast<int>(options_.ranks.size())},
      {"membersUp", r.members_up},
      {"ranks", options_.ranks.size()},
      {"ranksUp", r.ranks_up},
      {"restarts", r.restarts},
      {"lastFailure", r.last_failure},
      {"gpuBackend", options_.gpu_backend_name},
      {"gpuUtilisation", util_n > 0 ? json(util_sum / util_n) : json(nullptr)},
      {"dataStall", stall_n > 0 ? json(stall_sum / stall_n) : json(nullptr)},
      {"samplesPerSecond", sps_n > 0 ? json(sps_sum) : json(nullptr)},
      {"gpus", gpus},
      {"loader", loader},
      {"progress", r.progress},
      {"medianStepSeconds",
       r.median_step_seconds > 0 ? json(r.median_step_seconds) : json(nullptr)},
      {"stall", r.stall},
      {"straggler", r.straggler},
      {"standbys", r.standbys},
      {"elapsedSeconds",
       std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count()},
      {"updated", UtcNow()},
      {"gpuError", r.gpu_error.empty() ? json(nullptr) : json(r.gpu_error)},
  };
  return out;
}

}  // namespace spawnpoint::agent
