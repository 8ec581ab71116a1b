#include "agent/supervisor/exit_cause.h"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/text.h"

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
    case ExitReason::kGpuOutOfMemory:
      return "GpuOutOfMemory";
    case ExitReason::kCollectiveTimeout:
      return "CollectiveTimeout";
    case ExitReason::kCollectiveError:
      return "CollectiveError";
    case ExitReason::kLoaderWorkerKilled:
      return "LoaderWorkerKilled";
    case ExitReason::kImportError:
      return "ImportError";
    case ExitReason::kPortInUse:
      return "PortInUse";
    case ExitReason::kGangStartTimeout:
      return "GangStartTimeout";
    case ExitReason::kNodeLost:
      return "NodeLost";
  }
  return "Unknown";
}

std::optional<ExitReason> ExitReasonFromName(const std::string& name) {
  for (int r = static_cast<int>(ExitReason::kSucceeded); r <= static_cast<int>(kLastExitReason);
       ++r) {
    if (name == ExitReasonName(static_cast<ExitReason>(r))) return static_cast<ExitReason>(r);
  }
  return std::nullopt;
}

bool IsCollectiveReason(ExitReason reason) {
  return reason == ExitReason::kCollectiveTimeout || reason == ExitReason::kCollectiveError;
}

std::string FormatEpochMillis(int64_t ms) {
  const time_t secs = static_cast<time_t>(ms / 1000);
  struct tm tm {};
  gmtime_r(&secs, &tm);
  char buf[64];  // room for any int the fields could hold, so no truncation is possible
  snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
           tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
           static_cast<int>(ms % 1000));
  return buf;
}

std::optional<int64_t> ParseEpochMillis(const std::string& text) {
  struct tm tm {};
  int millis = 0;
  char z = 0;
  if (sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d.%3d%c", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
             &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &millis, &z) != 8 ||
      z != 'Z') {
    return std::nullopt;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return static_cast<int64_t>(timegm(&tm)) * 1000 + millis;
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

RankFailure RankFailure::FromJson(const nlohmann::json& j) {
  RankFailure f;
  f.cause.reason = ExitReason::kUserError;
  if (!j.is_object()) return f;
  f.rank = j.value("rank", -1);
  f.local_rank = j.value("localRank", -1);
  f.node_rank = j.value("nodeRank", 0);
  if (j.contains("exitCode") && j["exitCode"].is_number_integer()) {
    const int code = j["exitCode"].get<int>();
    const bool signalled = j.contains("signal") && code > 128;
    f.status.signal = signalled ? code - 128 : 0;
    f.status.exit_code = signalled ? 0 : code;
  }
  if (auto reason = ExitReasonFromName(j.value("reason", ""))) f.cause.reason = *reason;
  f.cause.message = j.value("message", "");
  f.cause.line = j.value("line", "");
  f.cause.exception = j.value("exception", "");
  if (j.contains("retryable") && j["retryable"].is_boolean()) f.retryable = j["retryable"];
  f.stack = j.value("stack", "");
  f.log_tail = j.value("logTail", "");
  f.log_stream = j.value("logStream", "");
  // When it failed, as that node's agent saw it: the order across nodes (PickRootCause).
  if (auto at = ParseEpochMillis(j.value("failedAt", ""))) f.failed_at_ms = *at;
  if (j.contains("consequences") && j["consequences"].is_array()) {
    for (const auto& c : j["consequences"]) {
      if (!c.is_object()) continue;
      f.consequences.push_back(PeerFailure{c.value("rank", -1), c.value("nodeRank", 0),
                                           c.value("exitCode", 0), c.value("reason", ""),
                                           c.value("line", "")});
    }
  }
  return f;
}

std::string RankFailure::Line() const {
  std::ostringstream out;
  out << "rank " << rank << " (local rank " << local_rank << ", node " << node_rank;
  if (pid != 0) out << ", pid " << pid;  // unknown when another agent reported it
  out << ") failed: exit code " << status.ShellCode();
  if (status.signal != 0) out << " (" << SignalName(status.signal) << ")";
  out << ", reason " << ExitReasonName(cause.reason) << ": " << cause.message;
  return out.str();
}

nlohmann::json PeerFailure::ToJson() const {
  nlohmann::json j = {
      {"rank", rank}, {"nodeRank", node_rank}, {"exitCode", exit_code}, {"reason", reason}};
  if (!line.empty()) j["line"] = line;
  return j;
}

nlohmann::json RankFailure::ToJson() const {
  nlohmann::json j = {{"rank", rank},
                      {"localRank", local_rank},
                      {"nodeRank", node_rank},
                      {"exitCode", status.ShellCode()},
                      {"reason", ExitReasonName(cause.reason)},
                      {"message", ValidUtf8(cause.message)}};
  if (status.signal != 0) j["signal"] = SignalName(status.signal);
  if (!cause.line.empty()) j["line"] = ValidUtf8(cause.line);
  if (!cause.exception.empty()) j["exception"] = ValidUtf8(cause.exception);
  if (!log_tail.empty()) {
    j["logTail"] = KeepEnd(ValidUtf8(log_tail), kMaxLogTailBytes, "...\n");
    j["logStream"] = log_stream;
  }
  if (failed_at_ms > 0) j["failedAt"] = FormatEpochMillis(failed_at_ms);
  if (!consequences.empty()) {
    nlohmann::json peers = nlohmann::json::array();
    for (const PeerFailure& p : consequences) peers.push_back(p.ToJson());
    j["consequences"] = peers;
  }
  if (!stack.empty()) j["stack"] = ValidUtf8(stack);
  if (retryable) j["retryable"] = *retryable;
  return j;
}

}  // namespace spawnpoint::agent
