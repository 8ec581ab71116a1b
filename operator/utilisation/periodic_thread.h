// A thread that runs a tick every interval until stopped: the loop of the operator's pollers
// of the agents (UtilisationPoller, GangWatcher). It sleeps on a Clock (kube/timing.h's
// WaitUntil), so a simulated clock drives it in tests. Stop() wakes it at once and joins it;
// a tick in progress runs to its end, and a long one checks Stopping() to end early.
// Thread-safe.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "common/clock.h"

namespace spawnpoint::op {

class PeriodicThread {
 public:
  PeriodicThread() = default;
  ~PeriodicThread();  // Stop()
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

  // Calls `tick` every `interval` on `clock`, the first time one interval from now (a tick
  // that overruns the next is followed by a whole interval); nothing if interval <= 0, if it
  // runs already, or once stopped.
  void Start(Clock* clock, Clock::Duration interval, std::function<void()> tick);
  void Stop();
  // Stop() was called (a tick in progress should end).
  bool Stopping() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace spawnpoint::op
