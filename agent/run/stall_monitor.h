// StallMonitor watches one node's ranks for stalls (issue 13). For each attempt it makes
// every rank's progress record (agent/progress/progress_record.h) and, for Python ranks,
// the file the shim's faulthandler dumps stacks into; on the gang's ticks it reads the
// records (StallWatch decides who is stalled), takes the stalled ranks' stacks, names the
// culprit (a rank not waiting in a collective, else the one with the fewest steps; its
// peers are said to wait on it, not reported as stalled) and acts as
// spec.stallPolicy.action says. It also names a straggler among this node's ranks
// (StragglerWatch: own work per step over stallPolicy.stragglerRatio times the others') in
// one log line per episode; a straggler is reported, never acted on. Used from the gang's
// thread only; not thread-safe.
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
#include "agent/run/straggler_watch.h"
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
    // The agent's loader workers of a rank, whose CPU time counts as the rank's (a rank
    // waiting for its batches is not idle). May be empty.
    std::function<std::vector<pid_t>(int rank)> loader_pids;
    // Where the ranks' CPU times are read (tests: a fake tree).
    std::string proc_root = "/proc";
    // Every Check: each rank's record as read, the job's median step, and CLOCK_MONOTONIC
    // now (for the status document and the metrics). May be empty.
    std::function<void(const std::vector<RankProgress>& ranks, double median_step_seconds,
                       int64_t now_ns)>
        on_progress;
    // A stall named (StallJson), and null once its culprit steps again or a new attempt
    // starts. May be empty.
    std::function<void(const nlohmann::json& stall)> on_stall;
    // Every Check, after on_progress: each rank's medians of own work and wait per step
    // (BusyMedians, in rank order), the slowest rank's ratio to the others (0: not judged),
    // the named straggler (StragglerJson) or null, and whether that changed at this Check.
    // May be empty.
    std::function<void(const std::vector<RankBusy>& busy, double ratio,
                       const nlohmann::json& straggler, bool changed)>
        on_straggler;
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
  // CPU time of the rank `pid` is, its children (torch's own loader workers) and its agent
  // loader workers; -1 when the rank is gone.
  int64_t RankCpuNs(int rank, pid_t pid) const;
  std::string Where() const;  // "pod P", or "node N" outside Kubernetes
  void ClearStall();
  void CheckStraggler(const std::vector<RankProgress>& progress);

  Options options_;
  std::vector<Rank> ranks_;
  std::unique_ptr<StallWatch> watch_;
  std::unique_ptr<StragglerWatch> stragglers_;
  // The named stall, until its culprit steps again: its rank and step count then.
  std::optional<std::pair<int, uint64_t>> stall_;
  int64_t last_cpu_sample_ns_ = 0;  // CPU times are read about once a second
};

// The status document's "stall": {"rank", "pod", "silentSeconds", "medianStepSeconds",
// "beforeFirstStep", "topFrame", "stackSource", "message", "waiting": [ranks]}.
nlohmann::json StallJson(const std::string& pod, const StalledRank& stalled,
                         double median_step_seconds, const RankStack& stack,
                         const std::string& message, const std::vector<int>& waiting);

// The status document's "straggler": {"rank", "pod", "ratio", "busySeconds",
// "peersBusySeconds", "windowSteps", "message"}.
nlohmann::json StragglerJson(const std::string& pod, const Straggler& straggler,
                             const std::string& message);

// "rank R (WHERE) is 2.00x slower than the other ranks: 0.2 s of its own work per step vs
// 0.1 s (medians of the last 20 steps)".
std::string DescribeStraggler(const Straggler& straggler, const std::string& where);

}  // namespace spawnpoint::agent
