// Every rank's loader pool on this node: started before any rank, so workers are warm when
// the ranks connect; kept across attempts; stopped with the job. A Python rank's pool comes
// with the rank's loader service (rank_service.h), which schedules its DataLoaders and may
// ask for the pool to grow: the growth is done by Tick(), on the thread that spawns. Not
// thread-safe: call it from NodeAgent's thread (the endpoint reads the pools themselves, which
// are; the services' growth requests are the one thing other threads hand in).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/loader/pool_supervisor.h"
#include "agent/loader/rank_service.h"
#include "agent/plan/node_plan.h"
#include "agent/process/spawner.h"
#include "common/status.h"

namespace spawnpoint::agent {

class LoaderPools {
 public:
  LoaderPools() = default;
  LoaderPools(const LoaderPools&) = delete;
  LoaderPools& operator=(const LoaderPools&) = delete;

  // Starts the pool of every rank of `plan` that has one and says so; on an error the
  // pools already started are stopped again.
  Status Start(const NodePlan& plan, ProcessSpawner* spawner, const std::string& memory_events);
  // Stops and reaps every worker; the pools are gone afterwards.
  void Stop(std::chrono::milliseconds grace);

  // The Gang's hooks: a worker's exit (true if the pid was one), the pids to keep, ticks
  // (deferred respawns, and the growth the services asked for).
  bool OnChildExited(pid_t pid, int wait_status);
  std::vector<pid_t> Pids() const;
  std::vector<pid_t> PidsOf(int rank) const;  // that rank's workers
  void Tick();

  // ", data stall 4%, 1234 samples/s" from the ranks' loader statistics, or "".
  std::string Summary(const NodePlan& plan) const;

  const std::vector<std::unique_ptr<loader::PoolSupervisor>>* list() const { return &pools_; }

 private:
  // A rank service's request to grow its pool: its thread waits in Wait(), the spawning
  // thread grows the pool in Serve().
  class Growth {
   public:
    // Blocks until the pool has `workers`, the growth failed, or Cancel().
    Status Wait(int workers, std::chrono::milliseconds limit);
    // Grows `pool` to the largest size asked for, if any. REQUIRES: the spawning thread.
    void Serve(loader::PoolSupervisor* pool);
    void Cancel();

   private:
    std::mutex mu_;
    std::condition_variable cv_;
    // Guarded by mu_.
    int want_ = 0;
    int have_ = 0;
    Status error_;
    bool cancelled_ = false;
  };

  std::vector<std::unique_ptr<loader::PoolSupervisor>> pools_;
  std::vector<std::shared_ptr<Growth>> growth_;  // one per pool, same order
  std::vector<std::unique_ptr<loader::RankPoolService>> services_;
};

}  // namespace spawnpoint::agent
