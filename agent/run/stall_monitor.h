// StallMonitor watches one node's ranks for stalls (issue 13). For each attempt it makes
// every rank's progress record (agent/progress/progress_record.h) and, for Python ranks,
// the file the shim's faulthandler dumps stacks into; on the gang's ticks it reads the
// records (StallWatch decides who is stalled), takes the stalled ranks' stacks, names the
// culprit (a rank not waiting in a collective, else the one with the fewest steps; its
// peers are said to wait on it, not reported as stalled) and acts as
// spec.stallPolicy.action says. Used from the gang's thread only; not thread-safe.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/process/spawner.h"
#include "agent/progress/progress_file.h"
#include "agent/run/rank_stacks.h"
#include "agent/run/stall_watch.h"
#include "agent/supervisor/exit_cause.h"
#include "agent/supervisor/gang.h"
#include "api/stall_policy.h"

namespace spawnpoint::agent {

class StallMonitor {
 public:
  struct Options {
    std::string job;
    std::string pod;  // this node's pod ("" outside Kubernetes: the report names the node)
    int node_rank = 0;
    int nodes = 1;  // the job's; with more, a node whose silent ranks all wait in a
                    // collective leaves the naming (and the action) to the culprit's node
    api::StallPolicy policy;
    std::string dir;                              // records and stack files; must exist
    ProcessSpawner* spawner = nullptr;            // runs gdb
    std::function<void(const std::string&)> say;  // one line of the agent's log
    // Every Check: each rank's record as read, the job's median step, and CLOCK_MONOTONIC
    // now (for the status document and the metrics). May be empty.
    std::function<void(const std::vector<RankProgress>& ranks, double median_step_seconds,
                       int64_t now_ns)>
        on_progress;
    // A stall named (StallJson), and null once its culprit steps again or a new attempt
    // starts. May be empty.
    std::function<void(const nlohmann::json& stall)> on_stall;
  };
  explicit StallMonitor(Options options);

  // Fresh records for an attempt: adds SPAWNPOINT_PROGRESS_FILE to every member's
  // environment, and SPAWNPOINT_STACK_SIGNAL and _FILE to the Python ranks' (members whose
  // environment has SPAWNPOINT_SHIM=1).
  Status Prepare(std::vector<GangMember>& members);

  // GangOptions::check_health: the running ranks and their pids. A failure to stop the gang
  // with when a rank is stalled and the action is Restart or Fail.
  std::optional<RankFailure> Check(const std::vector<std::pair<int, pid_t>>& running);

  // The signal Python ranks dump their stacks on.
  static int StackSignal();

 private:
  struct Rank {
    int rank = 0;
    int local_rank = 0;
    bool python = false;
    std::string stack_file;
    int64_t started_ns = 0;
    std::unique_ptr<progress::ProgressFile> record;
  };

  std::string Describe(const StalledRank& s, const RankStack& stack) const;
  void ClearStall();

  Options options_;
  std::vector<Rank> ranks_;
  std::unique_ptr<StallWatch> watch_;
  // The named stall, until its culprit steps again: its rank and step count then.
  std::optional<std::pair<int, uint64_t>> stall_;
};

// The status document's "stall": {"rank", "pod", "silentSeconds", "medianStepSeconds",
// "beforeFirstStep", "topFrame", "stackSource", "message", "waiting": [ranks]}.
nlohmann::json StallJson(const std::string& pod, const StalledRank& stalled,
                         double median_step_seconds, const RankStack& stack,
                         const std::string& message, const std::vector<int>& waiting);

}  // namespace spawnpoint::agent
