// When a loader worker that owes an answer is hung: HangClock times the wait without the
// time the worker's process spent runnable but waiting for a CPU, so a worker starved of CPU
// on a loaded machine is not killed as hung. ReadProcessTimes reads that time from /proc.
// HangClock is pure (times and readings are given to it) and not thread-safe: its owner
// (PoolClient, under its lock) serialises the calls. ReadProcessTimes is thread-safe.
//
// The rule, for a wait that began at `since`, with timeout T > 0:
//  - the worker is hung once it has owed the answer for T of time it did not spend waiting
//    for a CPU (its CPU wait is summed over its threads and counted at most once per second
//    of wall time);
//  - or, however starved it was, once it has owed it for kCeilingTimeouts x T of wall time.
//    A worker blocked for good (a deadlock, a stopped process) is not runnable and earns no
//    credit, so it is killed at T as before; the ceiling bounds the one credit can shield: a
//    worker spinning without end on a saturated machine.
//  - The CPU wait is read at looks: the first T/8 after `since`, unless the owner looks
//    sooner (PoolClient does at Start for a running worker), then every T/8 or sooner (never
//    closer than T/64) when the uncredited time or the ceiling could reach its limit. A
//    process's first reading is the baseline, not credited, unless it started after `since`.
//    A reading that cannot be made credits nothing: with no readings this is the plain
//    wall-clock timeout, a kill exactly at T.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "common/clock.h"

namespace spawnpoint::loader {

// What the pool client reads about a worker's process.
struct ProcessTimes {
  Clock::Duration age{0};  // since the process started
  // Runnable but waiting on a run queue, summed over its live threads since each started
  // (schedstat's run_delay); nullopt when it cannot be read (a kernel without schedstats).
  std::optional<Clock::Duration> cpu_wait;
};

// /proc/PID/stat (age) and /proc/PID/task/*/schedstat (CPU wait: a thread that exited drops
// out of the sum). Not /proc/PID/schedstat: that is the main thread's alone, and a Python
// worker does its start-up imports in another thread. nullopt: no such process.
std::optional<ProcessTimes> ReadProcessTimes(pid_t pid);
using ProcessTimesReader = std::function<std::optional<ProcessTimes>(pid_t)>;

// The run_delay (second field, in ns) of a schedstat line "<on-cpu ns> <run_delay ns>
// <timeslices>"; nullopt if it is not one.
std::optional<Clock::Duration> ParseRunDelay(std::string_view schedstat);

class HangClock {
 public:
  // How many timeouts of wall time a wait may last however starved the worker is. 10: a
  // worker given a tenth of the CPU time it could use still has its whole timeout, which
  // covers a machine ten times oversubscribed; a worker spinning for good on such a machine
  // keeps its batches for at most 10 timeouts (20 min at the default 120 s).
  static constexpr int kCeilingTimeouts = 10;

  // Begins timing a wait at `since`, with no credit and no reading.
  void Restart(Clock::TimePoint since);
  // A look at `now`: `pid`'s CPU wait (nullopt: unreadable, nothing credited). Its growth
  // since the previous reading of the same pid is credited; of a pid first seen, all of it
  // if the process started after `since` (`started_since`), else none (the baseline).
  void Look(Clock::TimePoint now, pid_t pid, std::optional<Clock::Duration> cpu_wait,
            bool started_since);

  Clock::TimePoint since() const { return since_; }
  Clock::Duration Elapsed(Clock::TimePoint now) const { return now - since_; }
  // The CPU wait credited so far (at most the wall time up to the last look).
  Clock::Duration Credit() const;
  // Elapsed less the credit: the time that counts toward the timeout.
  Clock::Duration Unstarved(Clock::TimePoint now) const { return Elapsed(now) - Credit(); }
  bool AtCeiling(Clock::TimePoint now, std::chrono::milliseconds timeout) const;
  // Hung by the rule above (as of the last look's credit).
  bool Overdue(Clock::TimePoint now, std::chrono::milliseconds timeout) const;
  // When the next look is due.
  Clock::TimePoint NextLook(std::chrono::milliseconds timeout) const;
  // "" without credit, else " (not counting 41.5 s it waited for a CPU)", and "; at the
  // limit of 10 timeouts however starved" when the ceiling decided.
  std::string Note(Clock::TimePoint now, std::chrono::milliseconds timeout) const;

 private:
  Clock::TimePoint since_{};
  std::optional<Clock::TimePoint> last_look_;
  pid_t pid_ = 0;
  std::optional<Clock::Duration> last_wait_;  // pid_'s last reading
  Clock::Duration credit_{0};
};

}  // namespace spawnpoint::loader
