#include "agent/run/loader_pools.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "agent/loader/contract.h"
#include "agent/run/report.h"

namespace spawnpoint::agent {
namespace {

using std::chrono::milliseconds;

// How long a DataLoader's iter() waits for its pool to grow before it is told it cannot.
constexpr milliseconds kGrowthLimit{30'000};

// The statistics a rank's loader last wrote, or a discarded value.
nlohmann::json ReadStats(const PoolPlan& pool) {
  std::ifstream in(loader::StatsPath(pool.dir));
  return nlohmann::json::parse(in, nullptr, false);
}

}  // namespace

Status LoaderPools::Start(const NodePlan& plan, ProcessSpawner* spawner,
                          const std::string& memory_events) {
  for (const auto& r : plan.ranks) {
    if (!r.pool) {
      if (!r.pool_skipped.empty() && r.local_rank == 0) {
        Say(plan.job_name + ": no agent-owned loader workers: " + r.pool_skipped);
      }
      continue;
    }
    loader::PoolSpec spec;
    spec.rank = r.rank;
    spec.workers = r.pool->workers;
    spec.dir = r.pool->dir;
    spec.argv = r.pool->argv;
    spec.env = r.pool->env;
    spec.cpus = r.devices.cpus;
    // Python workers import torch for a second or more, as the rank does: on a rank with
    // few CPUs, all of them at once would slow the rank and worker 0, whose batch comes
    // first. Run as many start-ups at once as the rank leaves CPUs free (at least one).
    if (r.pool->python && !r.devices.cpus.empty()) {
      spec.start_concurrency = std::max(1, static_cast<int>(r.devices.cpus.size()) - 1);
    }
    spec.sink_fd = 2;
    spec.memory_events_path = memory_events;
    auto pool = std::make_unique<loader::PoolSupervisor>(spawner, spec);
    if (Status s = pool->Start(); !s.ok()) {
      pool->StopAndReap(milliseconds(1000));
      Stop(milliseconds(1000));
      return s.WithPrefix("rank " + std::to_string(r.rank) + " loader workers");
    }
    pools_.push_back(std::move(pool));
    auto growth = std::make_shared<Growth>();
    growth_.push_back(growth);
    if (r.pool->python) {
      auto service = loader::RankPoolService::Start(
          {.dir = r.pool->dir,
           .pool_workers = r.pool->workers,
           .max_workers = r.pool->max_workers,
           .grow = [growth](int workers) { return growth->Wait(workers, kGrowthLimit); },
           .rank = r.rank,
           .world_size = plan.world_size,
           .log = [](const std::string& line) { Say(line); }});
      if (!service.ok()) {
        Stop(milliseconds(1000));
        return service.status().WithPrefix("rank " + std::to_string(r.rank) + " loader service");
      }
      services_.push_back(std::move(service).value());
    }
  }
  if (!pools_.empty()) {
    auto count = [](size_t n, const std::string& what) {
      return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
    };
    Say(plan.job_name + ": " +
        count(pools_.size(),
              plan.ranks.front().pool->python ? "Python loader pool" : "loader pool") +
        " of " + count(static_cast<size_t>(pools_.front()->spec().workers), "worker") + " started" +
        (plan.ranks.front().pool->auto_workers ? " (workersPerRank auto: ranks pick the knee)"
                                               : ""));
  }
  return Status::Ok();
}

void LoaderPools::Stop(milliseconds grace) {
  for (auto& g : growth_) g->Cancel();  // a service waiting for its pool gives up
  services_.clear();                    // their sessions let go of the workers first
  for (auto& p : pools_) p->StopAndReap(grace);
  pools_.clear();
  growth_.clear();
}

bool LoaderPools::OnChildExited(pid_t pid, int wait_status) {
  for (auto& p : pools_) {
    if (p->OnChildExited(pid, wait_status)) return true;
  }
  return false;
}

std::vector<pid_t> LoaderPools::Pids() const {
  std::vector<pid_t> pids;
  for (auto& p : pools_) {
    auto more = p->Pids();
    pids.insert(pids.end(), more.begin(), more.end());
  }
  return pids;
}

std::vector<pid_t> LoaderPools::PidsOf(int rank) const {
  for (const auto& p : pools_) {
    if (p->spec().rank == rank) return p->Pids();
  }
  return {};
}

void LoaderPools::Tick() {
  for (size_t i = 0; i < pools_.size(); ++i) {
    pools_[i]->Tick();
    if (i < growth_.size()) growth_[i]->Serve(pools_[i].get());
  }
}

Status LoaderPools::Growth::Wait(int workers, milliseconds limit) {
  std::unique_lock<std::mutex> lock(mu_);
  want_ = std::max(want_, workers);
  const bool done =
      cv_.wait_for(lock, limit, [&] { return have_ >= workers || !error_.ok() || cancelled_; });
  if (cancelled_) return Unavailable("the agent is stopping");
  if (!error_.ok()) return error_;
  if (!done) {
    return Unavailable("the agent did not grow the pool within " +
                       std::to_string(limit.count() / 1000) + " s");
  }
  return Status::Ok();
}

void LoaderPools::Growth::Serve(loader::PoolSupervisor* pool) {
  int want = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_ || want_ <= have_ || !error_.ok()) return;
    want = want_;
  }
  Status st = pool->Grow(want);
  std::lock_guard<std::mutex> lock(mu_);
  have_ = pool->Size();
  if (!st.ok()) error_ = st;
  cv_.notify_all();
}

void LoaderPools::Growth::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  cv_.notify_all();
}

std::string LoaderPools::Summary(const NodePlan& plan) const {
  double stall = 0, samples = 0;
  int reporting = 0;
  for (const auto& r : plan.ranks) {
    if (!r.pool) continue;
    nlohmann::json j = ReadStats(*r.pool);
    if (j.is_discarded() || !j.is_object()) continue;
    stall += j.value("dataStall", 0.0);
    samples += j.value("samplesPerSecond", 0.0);
    ++reporting;
  }
  if (reporting == 0) return "";
  char buf[96];
  snprintf(buf, sizeof(buf), ", data stall %.0f%%, %.0f samples/s", 100.0 * stall / reporting,
           samples);
  return buf;
}

}  // namespace spawnpoint::agent
