#include "agent/run/rank_changes.h"

#include <algorithm>
#include <string>

#include "api/stall_policy.h"

namespace spawnpoint::agent {
namespace {

// "0-3", "5", "0,2,4" for an ascending CPU list.
std::string CpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

bool AgentSet(const RankPlan& r, const std::string& name) {
  return std::find(r.spawnpoint_env.begin(), r.spawnpoint_env.end(), name) !=
         r.spawnpoint_env.end();
}

std::string Pinning(const NodePlan& plan, const api::TrainingJob& job) {
  std::string cpus;
  for (const RankPlan& r : plan.ranks) {
    if (!cpus.empty()) cpus += ", ";
    cpus += "rank " + std::to_string(r.rank) + ": " + CpuList(r.devices.cpus);
  }
  const RankPlan& first = plan.ranks.front();
  std::string line = "each rank is pinned to its CPUs (" + cpus + ")";
  auto omp = first.env.find("OMP_NUM_THREADS");
  const bool from_job = std::any_of(job.spec.trainer.env.begin(), job.spec.trainer.env.end(),
                                    [](const auto& e) { return e.name == "OMP_NUM_THREADS"; });
  if (omp != first.env.end() && AgentSet(first, "OMP_NUM_THREADS") && !from_job) {
    line += ", with OMP_NUM_THREADS=" + omp->second + " (its CPUs; torchrun sets 1)";
  } else if (omp != first.env.end()) {
    line += "; OMP_NUM_THREADS=" + omp->second + " as the job or the environment sets it";
  }
  return line + "; its loader workers run on the same CPUs";
}

std::string Loaders(const NodePlan& plan, const api::TrainingJob& job) {
  const RankPlan& first = plan.ranks.front();
  const api::LoaderSpec& loader = job.spec.loader;
  std::string line = "Python DataLoaders: ";
  if (loader.workers_per_rank == 0) {
    line += "num_workers as the code says, on torch's own workers (loader.workersPerRank: 0)";
  } else if (first.pool && first.pool->python) {
    const std::string n = std::to_string(first.pool->workers);
    line += "one the code leaves at num_workers=0 gets " + n + " worker" +
            (first.pool->workers == 1 ? "" : "s") + " from the agent's pool (" +
            (loader.workers_per_rank ? "loader.workersPerRank" : "loader.workersPerRank auto") +
            ") unless its dataset draws from the random streams; one asking for more grows the "
            "pool (up to " +
            std::to_string(first.pool->max_workers) + " per rank)";
  } else {
    line += "on torch's own workers" +
            (first.pool_skipped.empty() ? std::string() : " (" + first.pool_skipped + ")") +
            "; one the code leaves at num_workers=0 gets the job's loader.workersPerRank";
  }
  line += "; multiprocessing_context='spawn' where the code sets none";
  line += loader.persistent_workers
              ? "; persistent_workers=True where the code sets none (loader.persistentWorkers)"
              : "; persistent_workers as the code says";
  return line;
}

std::string StallRule(const api::StallPolicy& p) {
  std::string rule;
  if (p.timeout_seconds) {
    rule = "a rank that makes no step for " + std::to_string(*p.timeout_seconds) + " s";
  } else {
    rule = "a rank that makes no step while its peers wait " +
           std::to_string(api::StallPolicy::kPeerWaitSeconds) +
           " s for it in a collective, or, after " +
           std::to_string(api::StallPolicy::kAutoArmSteps) + " steps, for max(" +
           std::to_string(api::StallPolicy::kAutoFloorSeconds) + " s, " +
           std::to_string(api::StallPolicy::kAutoMedianFactor) + "x the median step)";
  }
  if (p.startup_timeout_seconds > 0) {
    rule += " (before its first step: " + std::to_string(p.startup_timeout_seconds) + " s)";
  }
  return rule + " is named with its stack (stallPolicy: action " + api::StallActionName(p.action) +
         ")";
}

}  // namespace

std::vector<std::string> RankChanges(const NodePlan& plan, const api::TrainingJob& job) {
  std::vector<std::string> lines;
  if (plan.ranks.empty()) return lines;
  lines.push_back(Pinning(plan, job));
  const RankPlan& first = plan.ranks.front();
  auto shim = first.env.find("SPAWNPOINT_SHIM");
  if (shim != first.env.end() && shim->second == "1") {
    lines.push_back(
        "Python: multiprocessing's default start method is spawn (fork where the code asks "
        "for it, with a warning); on node 0, init_process_group (env://) waits for rank 0's "
        "store to listen instead of retrying a refused connect a second later");
    lines.push_back(Loaders(plan, job));
    const api::RestartPolicy& restarts = job.spec.restart_policy;
    if (restarts.max_restarts > 0) {
      std::string line =
          "restarts: when an attempt fails, a Python rank stopped with SIGTERM ends once its "
          "exit handlers have run (atexit, logging and stdout flushed), by SIGTERM's default "
          "action, without the interpreter's finalization";
      if (restarts.standby) {
        line +=
            "; each Python rank restarts in a warm standby, a process that did its imports "
            "while the attempt ran (at idle CPU priority, no GPU context), at the cost of its "
            "memory (restartPolicy.standby)";
      }
      lines.push_back(line);
    }
  }
  lines.push_back(StallRule(job.spec.stall_policy));
  return lines;
}

}  // namespace spawnpoint::agent
