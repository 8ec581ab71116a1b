// Every rank's loader pool on this node: started before any rank, so workers are warm when
// the ranks connect; kept across attempts; stopped with the job. A Python rank's pool comes
// with the rank's loader service (rank_service.h), which schedules its DataLoaders. Not
// thread-safe: call it from NodeAgent's thread (the endpoint reads the pools themselves, which
// are).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
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

  // The Gang's hooks: a worker's exit (true if the pid was one), the pids to keep, ticks.
  bool OnChildExited(pid_t pid, int wait_status);
  std::vector<pid_t> Pids() const;
  void Tick();

  // ", data stall 4%, 1234 samples/s" from the ranks' loader statistics, or "".
  std::string Summary(const NodePlan& plan) const;

  const std::vector<std::unique_ptr<loader::PoolSupervisor>>* list() const { return &pools_; }

 private:
  std::vector<std::unique_ptr<loader::PoolSupervisor>> pools_;
  std::vector<std::unique_ptr<loader::RankPoolService>> services_;
};

}  // namespace spawnpoint::agent
