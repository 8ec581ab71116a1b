// Classifies how a supervised process ended, so the user (and the operator, through the
// termination message) learns why a rank died rather than just that it did. Pure
// functions apart from ReadOomKillCount, which reads one file; all thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace spawnpoint::agent {

struct ExitStatus {
  int exit_code = 0;  // valid when signal == 0
  int signal = 0;     // the terminating signal, 0 if the process exited

  // The shell convention: the code itself, or 128 + signal.
  int ShellCode() const { return signal != 0 ? 128 + signal : exit_code; }
  bool Success() const { return signal == 0 && exit_code == 0; }
  static ExitStatus FromWaitStatus(int wait_status);
};

enum class ExitReason {
  kSucceeded,
  kUserError,     // exit 1-127 (or any exit without a signal)
  kOomKilled,     // SIGKILL and the cgroup's oom_kill counter moved
  kShmExhausted,  // SIGBUS: a shared-memory mapping could not be backed
  kKilled,        // SIGKILL from outside
  kTerminated,    // SIGTERM/SIGINT/SIGHUP
  kCrashed,       // SIGSEGV, SIGILL, SIGFPE, SIGABRT, ...
  kStalled,       // made no step for spec.stallPolicy's timeout: the agent stopped it
};

const char* ExitReasonName(ExitReason reason);  // "OOMKilled", "ShmExhausted", "UserError", ...

struct ExitCause {
  ExitReason reason = ExitReason::kSucceeded;
  std::string message;  // one line, says what to do where we know
};

// `oom_kills_before/after`: the cgroup's oom_kill count when the gang started and now.
ExitCause ClassifyExit(const ExitStatus& status, std::optional<int64_t> oom_kills_before,
                       std::optional<int64_t> oom_kills_after);

// Reads the oom_kill counter from a cgroup v2 memory.events file; nullopt if unreadable.
std::optional<int64_t> ReadOomKillCount(const std::string& memory_events_path);

std::string SignalName(int signal);  // "SIGKILL", or "signal 42"

// What a failed rank reports: to stderr as one line and to the termination log as JSON
// (the operator reads the latter from the pod's terminated state).
struct RankFailure {
  int rank = -1;
  int local_rank = -1;
  int node_rank = 0;
  ExitStatus status;
  ExitCause cause;
  int pid = 0;
  // Set when the agent judged the failure itself (a stalled rank: stallPolicy.action says
  // whether it restarts); otherwise the exit code decides.
  std::optional<bool> retryable;
  std::string stack;  // the stalled rank's stack (kStalled), for the termination log
  std::string Line() const;
  nlohmann::json ToJson() const;
};

}  // namespace spawnpoint::agent
