#include "agent/run/report.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "agent/run/exit_codes.h"

namespace spawnpoint::agent {

void Say(const std::string& line) {
  std::string s = "[spawnpoint] " + line + "\n";
  (void)!write(2, s.data(), s.size());
}

int ExitCodeFor(const Status& status) {
  return status.code() == StatusCode::kInvalidArgument ? kExitBadInput : kExitJobFailed;
}

int Fail(const Status& status) {
  Say("error: " + status.message());
  return ExitCodeFor(status);
}

std::string FormatElapsed(Clock::Duration elapsed) {
  auto s = std::chrono::duration_cast<std::chrono::seconds>(elapsed).count();
  char buf[32];
  snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
           static_cast<long long>((s / 60) % 60), static_cast<long long>(s % 60));
  return buf;
}

Status WriteStatusFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.close();
    if (!out) {
      const std::string why = strerror(errno);
      unlink(tmp.c_str());
      return Unavailable("cannot write the status file " + tmp + ": " + why);
    }
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = strerror(errno);
    unlink(tmp.c_str());
    return Unavailable("cannot write the status file " + path + ": " + why);
  }
  return Status::Ok();
}

namespace {

bool ShouldWriteTerminationLog(const AgentOptions& o) {
  if (o.termination_log.empty()) return false;
  if (o.termination_log_explicit) return true;
  struct stat st {};
  return stat(o.termination_log.c_str(), &st) == 0;  // the kubelet creates it in pods
}

}  // namespace

void WriteTerminationLog(const AgentOptions& o, const nlohmann::json& message) {
  if (!ShouldWriteTerminationLog(o)) return;
  constexpr size_t kLimit = 4000;  // Kubernetes keeps 4096 bytes
  std::string text = message.dump();
  if (text.size() > kLimit && message.contains("message") && message["message"].is_string()) {
    nlohmann::json shorter = message;
    const std::string m = message["message"].get<std::string>();
    const size_t excess = text.size() - kLimit + 3;  // and "..."
    // Escapes may make the dump longer than the text: cut until it fits.
    for (size_t keep = m.size() > excess ? m.size() - excess : 0;; keep = keep * 3 / 4) {
      shorter["message"] = m.substr(0, keep) + "...";
      text = shorter.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      if (text.size() <= kLimit || keep == 0) break;
    }
  }
  if (text.size() > kLimit) text = text.substr(0, kLimit);
  std::ofstream out(o.termination_log, std::ios::trunc);
  out << text << "\n";
  if (!out) Say("warning: cannot write the termination log " + o.termination_log);
}

}  // namespace spawnpoint::agent
