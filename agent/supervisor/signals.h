// SignalWatcher turns the signals the agent supervises with (SIGCHLD, SIGTERM, SIGINT,
// SIGHUP) into a readable descriptor, so the supervision loop is one poll() with no
// handlers and no races. Create it in main() before any thread starts: the signals are
// blocked in the creating thread and every thread created after it. Not thread-safe.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "common/status.h"

namespace spawnpoint::agent {

class SignalWatcher {
 public:
  static StatusOr<std::unique_ptr<SignalWatcher>> Create();
  ~SignalWatcher();
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

  int fd() const { return fd_; }
  // The signals delivered since the last call (SIGCHLD included), without blocking.
  std::vector<int> Drain();
  // Waits up to `timeout` for a terminating signal (SIGTERM, SIGINT, SIGHUP); returns it,
  // or 0 when the time passed. Other signals are left for the next Drain() caller.
  int WaitForTermination(std::chrono::milliseconds timeout);
  // Puts a signal back, so the next Drain() returns it again.
  void Requeue(int sig) { pending_.push_back(sig); }

 private:
  explicit SignalWatcher(int fd) : fd_(fd) {}
  int fd_;
  std::vector<int> pending_;
};

bool IsTerminationSignal(int sig);

}  // namespace spawnpoint::agent
