#include "agent/supervisor/exit_cause.h"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include <fstream>
#include <sstream>

namespace spawnpoint::agent {

ExitStatus ExitStatus::FromWaitStatus(int wait_status) {
  ExitStatus s;
  if (WIFSIGNALED(wait_status)) {
    s.signal = WTERMSIG(wait_status);
  } else if (WIFEXITED(wait_status)) {
    s.exit_code = WEXITSTATUS(wait_status);
  }
  return s;
}

const char* ExitReasonName(ExitReason reason) {
  switch (reason) {
    case ExitReason::kSucceeded:
      return "Succeeded";
    case ExitReason::kUserError:
      return "UserError";
    case ExitReason::kOomKilled:
      return "OOMKilled";
    case ExitReason::kShmExhausted:
      return "ShmExhausted";
    case ExitReason::kKilled:
      return "Killed";
    case ExitReason::kTerminated:
      return "Terminated";
    case ExitReason::kCrashed:
      return "Crashed";
    case ExitReason::kStalled:
      return "Stalled";
  }
  return "Unknown";
}

std::string SignalName(int signal) {
  const char* abbrev = sigabbrev_np(signal);
  if (abbrev != nullptr) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(signal);
}

ExitCause ClassifyExit(const ExitStatus& status, std::optional<int64_t> oom_kills_before,
                       std::optional<int64_t> oom_kills_after) {
  if (status.Success()) return {ExitReason::kSucceeded, "exited 0"};
  if (status.signal == 0) {
    return {ExitReason::kUserError,
            "user error: exited with code " + std::to_string(status.exit_code)};
  }
  const std::string sig = SignalName(status.signal);
  switch (status.signal) {
    case SIGKILL:
      if (oom_kills_before && oom_kills_after && *oom_kills_after > *oom_kills_before) {
        return {ExitReason::kOomKilled,
                "OOM-killed (SIGKILL with the cgroup's oom_kill count rising from " +
                    std::to_string(*oom_kills_before) + " to " + std::to_string(*oom_kills_after) +
                    "): raise the container's memory limit or lower the batch size"};
      }
      return {ExitReason::kKilled, "killed by SIGKILL"};
    case SIGBUS:
      return {ExitReason::kShmExhausted,
              "shared memory exhausted (SIGBUS): /dev/shm is too small for the data "
              "loader's batches; raise spec.shmSize"};
    case SIGTERM:
    case SIGINT:
    case SIGHUP:
      return {ExitReason::kTerminated, "terminated by " + sig};
    default:
      return {ExitReason::kCrashed, "crashed with " + sig + " (" + strsignal(status.signal) + ")"};
  }
}

std::optional<int64_t> ReadOomKillCount(const std::string& memory_events_path) {
  std::ifstream in(memory_events_path);
  if (!in) return std::nullopt;
  std::string key;
  int64_t value = 0;
  while (in >> key >> value) {
    if (key == "oom_kill") return value;
  }
  return std::nullopt;
}

std::string RankFailure::Line() const {
  std::ostringstream out;
  out << "rank " << rank << " (local rank " << local_rank << ", node " << node_rank << ", pid "
      << pid << ") failed: exit code " << status.ShellCode();
  if (status.signal != 0) out << " (" << SignalName(status.signal) << ")";
  out << ", reason " << ExitReasonName(cause.reason) << ": " << cause.message;
  return out.str();
}

nlohmann::json RankFailure::ToJson() const {
  nlohmann::json j = {{"rank", rank},
                      {"localRank", local_rank},
                      {"nodeRank", node_rank},
                      {"exitCode", status.ShellCode()},
                      {"reason", ExitReasonName(cause.reason)},
                      {"message", cause.message}};
  if (status.signal != 0) j["signal"] = SignalName(status.signal);
  if (!stack.empty()) j["stack"] = stack;
  if (retryable) j["retryable"] = *retryable;
  return j;
}

}  // namespace spawnpoint::agent
