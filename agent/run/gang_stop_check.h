// GangStopCheck decides, at each of the Gang's health ticks, whether this node's ranks are
// to be stopped because the gang's coordinator said so (another node's rank failed).
//
// A stop can reach this node just as one of its own ranks is dying by itself (killed from
// outside, crashed): its peers on the other nodes saw its connections close before this
// agent could reap it, and their collective errors reached the coordinator first. Stopping
// then would report this node as merely "stopped" and the job's cause would be the peers'
// collective error. So while a rank of ours is already exiting (or a zombie not yet
// reaped), or is a Python rank that printed an uncaught exception's traceback shortly before
// the stop (CPython prints it, then finalizes: atexit handlers, torch's teardown, the loader
// pool's shutdown, while its closed connections already fail its peers), the stop waits, at
// most `dying_wait`, for the Gang to reap it: its failure then goes to the coordinator with
// its own cause, within the coordinator's settling window. A traceback that was handled
// (printed by the trainer, which goes on) only delays the stop by that wait.
// Not thread-safe: one owner (the Gang's loop), one per attempt.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "agent/supervisor/failure_cause.h"
#include "common/clock.h"

namespace spawnpoint::agent {

class GangStopCheck {
 public:
  // The waits a Gang of one node uses too (agent/supervisor/failure_cause.h): at most
  // kDyingWait for a dying rank, shorter than the coordinator's settling window
  // (CoordinatorOptions::settle, 1 s); a traceback at most kRecentTraceback before the stop
  // marks its rank as failing by itself (agent/python/spawnpoint_rank/_exit.py holds the
  // longest part of a finalization we add).
  static constexpr std::chrono::milliseconds kDyingWait = agent::kDyingWait;
  static constexpr std::chrono::milliseconds kRecentTraceback = agent::kRecentTraceback;

  // `stop_seen`: whether the coordinator has told this attempt to stop; `is_exiting`:
  // whether a process is past its user code (agent/supervisor/process_table.h).
  GangStopCheck(Clock* clock, std::function<bool()> stop_seen,
                std::function<bool(pid_t)> is_exiting,
                std::chrono::milliseconds dying_wait = kDyingWait);

  enum class Verdict {
    kRun,            // no stop: the other health checks go on
    kAwaitTheDying,  // a stop, but a rank of ours is dying by itself: nothing else now
    kStop,           // the ranks still running are to be stopped now
  };
  // `running`: the ranks still running, {rank, pid}.
  Verdict Check(const std::vector<std::pair<int, pid_t>>& running);

  // The rank with `pid` began a Python traceback on its stderr now (StartsPythonTraceback,
  // agent/supervisor/failure_cause.h).
  void NoteTraceback(pid_t pid);

 private:
  Clock* const clock_;
  const std::function<bool()> stop_seen_;
  const std::function<bool(pid_t)> is_exiting_;
  const std::chrono::milliseconds dying_wait_;
  std::optional<Clock::TimePoint> stop_seen_at_;
  std::unordered_map<pid_t, Clock::TimePoint> last_traceback_;  // per rank: bounded
};

}  // namespace spawnpoint::agent
