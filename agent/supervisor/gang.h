// Gang runs one attempt of a set of processes that live and die together, as DDP ranks
// must: it spawns every member, forwards their output line by line with a prefix, and
// fails fast. It keeps each member's last lines (agent/supervisor/log_tail.h) to say why
// it failed. When a member exits non-zero or dies, the others get SIGTERM and, after the
// grace period, SIGKILL; the same happens when the agent is asked to stop. When it
// returns, every member and every descendant they left behind (the agent is a child
// subreaper) has been reaped: no orphan, no zombie (with overlap_exit, a failed attempt's
// are past their user code and reaped by the caller's next wait). Run() blocks the calling thread,
// which must be the one that created the SignalWatcher. Not thread-safe. Grace periods,
// status and tick intervals run on GangOptions::clock; poll() still waits on the real
// descriptors, so under a SimulatedClock a grace period ends only when the clock moves.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "agent/process/spawner.h"
#include "agent/supervisor/exit_cause.h"
#include "agent/supervisor/failure_cause.h"
#include "agent/supervisor/signals.h"
#include "common/clock.h"

namespace spawnpoint::agent {

struct GangMember {
  std::string label;  // output prefix, e.g. "rank 3"
  int rank = 0;
  int local_rank = 0;
  int node_rank = 0;
  SpawnOptions spawn;  // stdout/stderr are replaced by pipes when prefix_output is set
  bool prefix_output = true;
};

struct GangOptions {
  std::chrono::milliseconds grace_period{30'000};
  std::chrono::milliseconds status_interval{10'000};
  std::string memory_events_path = "/sys/fs/cgroup/memory.events";
  int output_fd = 1;           // rank stdout goes here, prefixed
  int error_fd = 2;            // rank stderr and the agent's own lines go here
  std::string what = "ranks";  // how members are named in the status line
  // Called on every status tick with (members up, elapsed); the caller prints it.
  std::function<void(int up, int total)> on_status;
  // Processes the caller owns beside the gang (loader workers): their exits are handed to
  // on_other_exit (which returns true if it took the pid) instead of being treated as
  // orphans, and they are not stopped with the gang's leftovers.
  std::function<bool(pid_t pid, int wait_status)> on_other_exit;
  std::function<std::vector<pid_t>()> keep_pids;
  // Called about every tick_interval while the gang runs (deferred worker respawns).
  std::function<void()> on_tick;
  std::chrono::milliseconds tick_interval{200};
  // Called about every tick_interval while no member has failed, with each running
  // member's rank and pid: a failure it returns stops the gang as a member's exit would
  // (a stalled rank, agent/run/stall_monitor.h).
  std::function<std::optional<RankFailure>(const std::vector<std::pair<int, pid_t>>& ranks)>
      check_health;
  // Called on each member's failure before it is reported: a member that is itself an agent
  // fills in the rank that failed under it, with that rank's exit code and cause, and
  // returns true; false when it has no rank's failure to report (it was stopped).
  std::function<bool(RankFailure& failure)> refine_failure;
  // Called with the attempt's first failure as soon as it is recorded, before the other
  // members are stopped (the gang of nodes tells its coordinator at once).
  std::function<void(const RankFailure& failure)> on_failure;
  // Called once when the gang stops its members because the attempt failed (a member's
  // failure, check_health's), just before the first SIGTERM, with the pids of the members it
  // signals; never for an interruption. (NodeAgent writes them where the ranks' shim looks:
  // a Python rank so stopped ends once its exit handlers have run, without the interpreter's
  // finalization.)
  std::function<void(const std::vector<pid_t>& stopped)> before_failure_stop;
  // Called once, with the signal, when the first termination signal reaches the gang, just
  // before its members are stopped (node 0's agent closes the gang's coordinator then: it is
  // going away, and the other nodes must see it go rather than a verdict it makes meanwhile).
  std::function<void(int signal)> on_interrupt;
  // Called with each complete line a member writes on stderr (prefix_output members), as it
  // is read, with the member's pid: the caller watches for what a line announces (a Python
  // traceback: the rank is failing by itself, agent/run/gang_stop_check.h).
  std::function<void(pid_t pid, const std::string& line)> on_stderr_line;
  // A member's failure that is a collective error or timeout (what a rank's peers see when it
  // dies) while another member is dying by itself (it printed a Python traceback at most
  // recent_traceback before, or is past its user code): the others are stopped only once no
  // member is dying so, or after dying_wait, so that the dying member's own failure is weighed
  // (PickRootCause) rather than counted as stopped. agent/run/gang_stop_check.h does the same
  // when the stop comes from the gang of nodes.
  std::chrono::milliseconds dying_wait = kDyingWait;
  std::chrono::milliseconds recent_traceback = kRecentTraceback;
  Clock* clock = RealClock::Get();  // deadlines and intervals; must outlive Run()
  // A failed attempt's Run() returns once nothing of it can run user code again (every
  // member and every process of their groups has entered the kernel's exit, or is gone),
  // without waiting for the kernel to release their memory and files: the caller's next
  // attempt starts while they are torn down, and whoever waits next reaps them
  // (GangResult::teardown_pending). Only for a caller whose next attempt needs nothing the
  // old processes still hold (a fresh rendezvous port; no GPU, whose memory a dying CUDA
  // context frees last).
  bool overlap_exit = false;
};

enum class GangOutcome { kSucceeded, kFailed, kInterrupted };

struct GangResult {
  GangOutcome outcome = GangOutcome::kSucceeded;
  // The failure that caused the attempt's end (PickRootCause: the earliest, a collective
  // error yielding on a tie), with its rank's last lines and the peers that failed after it
  // by themselves as its consequences.
  std::optional<RankFailure> failure;
  int interrupt_signal = 0;
  // overlap_exit ended the attempt while its processes were still being torn down: the
  // caller reaps them (a next Gang does, or AwaitLeftovers).
  bool teardown_pending = false;
  int ExitCode() const;  // 0, the failing member's shell code, or 128 + signal
};

class Gang {
 public:
  Gang(ProcessSpawner* spawner, SignalWatcher* signals, GangOptions options);
  GangResult Run(std::vector<GangMember> members);

 private:
  ProcessSpawner* spawner_;
  SignalWatcher* signals_;
  GangOptions options_;
};

// Marks the calling process as a child subreaper, so orphaned descendants are re-parented
// to it and can be reaped. Idempotent.
Status BecomeSubreaper();

// Pids whose parent is this process (read from /proc), excluding `known`.
std::vector<pid_t> OrphanedChildren(const std::vector<pid_t>& known);

// True when every process of the gang is past its user code (ProcessIsExiting): the
// `members` (each the leader of its own process group), their groups, every descendant
// of theirs or of this process, `known` aside.
bool GangIsExiting(const std::vector<pid_t>& members, const std::vector<pid_t>& known);

// Stops and reaps every process of `groups` and every child of this process except
// keep_pids(): SIGTERM, then SIGKILL once `grace` has passed on `clock`. Exits of other
// processes go to on_other_exit; termination signals drained meanwhile are requeued.
void AwaitLeftovers(const std::vector<pid_t>& groups, SignalWatcher* signals, Clock* clock,
                    std::chrono::milliseconds grace,
                    const std::function<std::vector<pid_t>()>& keep_pids,
                    const std::function<bool(pid_t, int)>& on_other_exit);

}  // namespace spawnpoint::agent
