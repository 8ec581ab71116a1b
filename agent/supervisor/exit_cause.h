// Classifies how a supervised process ended, so the user (and the operator, through the
// termination message) learns why a rank died rather than just that it did. Pure
// functions apart from ReadOomKillCount, which reads one file; all thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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
  // From the rank's last lines (agent/supervisor/failure_cause.h), for an exit or a crash:
  kGpuOutOfMemory,      // CUDA/HIP "out of memory"
  kCollectiveTimeout,   // an NCCL/gloo watchdog or timeout
  kCollectiveError,     // an NCCL/gloo error: usually a peer went away
  kLoaderWorkerKilled,  // "DataLoader worker (pid N) is killed by signal"
  kImportError,         // a module or shared library that would not load
  kPortInUse,           // EADDRINUSE: a port the rank would listen on is held by another process
  // The agents of a gang (--gang) gave up, no rank's failure and no signal:
  kGangStartTimeout,  // the gang's nodes did not all reach its barrier in time
  kNodeLost,          // the gang's coordinator went away and did not come back in time
};
inline constexpr ExitReason kLastExitReason = ExitReason::kNodeLost;  // for loops over them

const char* ExitReasonName(ExitReason reason);  // "OOMKilled", "ShmExhausted", "UserError", ...
// The reason named `name` (ExitReasonName's spelling); nullopt for any other text.
std::optional<ExitReason> ExitReasonFromName(const std::string& name);
// A collective's timeout or error: usually the consequence of a peer's failure, not a cause.
bool IsCollectiveReason(ExitReason reason);

struct ExitCause {
  ExitReason reason = ExitReason::kSucceeded;
  std::string message;    // one line, says what to do where we know
  std::string line;       // the rank's own line the reason was read from, "" if none
  std::string exception;  // the Python exception type of that line ("RuntimeError"), if any
};

// `oom_kills_before/after`: the cgroup's oom_kill count when the gang started and now.
ExitCause ClassifyExit(const ExitStatus& status, std::optional<int64_t> oom_kills_before,
                       std::optional<int64_t> oom_kills_after);

// Reads the oom_kill counter from a cgroup v2 memory.events file; nullopt if unreadable.
std::optional<int64_t> ReadOomKillCount(const std::string& memory_events_path);

std::string SignalName(int signal);  // "SIGKILL", or "signal 42"

// Wall-clock milliseconds since the epoch as RFC 3339 in UTC ("2024-05-01T10:00:00.123Z"),
// and back (nullopt if malformed; only the "Z" form this writes).
std::string FormatEpochMillis(int64_t ms);
std::optional<int64_t> ParseEpochMillis(const std::string& text);

// A peer's failure in the same attempt that the first failure explains (a collective error
// after a rank was killed): recorded beside the cause, never as the reason.
struct PeerFailure {
  int rank = -1;
  int node_rank = 0;
  int exit_code = 0;
  std::string reason;  // ExitReasonName
  std::string line;    // its quoted line, if any
  nlohmann::json ToJson() const;
};

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
  // The rank's last lines (stderr's, or stdout's when stderr was empty), valid UTF-8, at
  // most kMaxLogTailBytes; "" when the agent did not read its output.
  std::string log_tail;
  std::string log_stream;                 // "stderr" or "stdout"
  int64_t failed_at_ms = 0;               // wall time the agent saw it fail; 0 if unknown
  std::vector<PeerFailure> consequences;  // peers that failed because of it
  std::string Line() const;
  // The termination log's object: rank, exitCode, reason, message, and when known signal,
  // line, exception, logTail, failedAt, consequences, stack, retryable.
  nlohmann::json ToJson() const;
  // ToJson's inverse, as another agent wrote it (a node agent's termination log, the gang
  // channel); fields it lacks keep their defaults (reason UserError). The pid is not kept.
  static RankFailure FromJson(const nlohmann::json& j);
};

// What ToJson keeps of a rank's last lines: a few lines, leaving room in the 4 KiB that
// Kubernetes keeps of a termination message for the rest.
inline constexpr size_t kMaxLogTailBytes = 2048;
inline constexpr size_t kMaxLogTailLines = 30;

}  // namespace spawnpoint::agent
