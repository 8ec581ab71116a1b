#include "agent/run/report.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "agent/run/exit_codes.h"
#include "common/text.h"

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

std::string FitTerminationMessage(const nlohmann::json& message, size_t limit) {
  auto dump = [](const nlohmann::json& j) {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  std::string text = dump(message);
  if (text.size() <= limit || !message.is_object()) return text;
  nlohmann::json j = message;
  // What gives way, in order: the oldest lines of the tail, the stack's last frames, the
  // peers, the message's end. Each string is cut to what the excess leaves of it, then by a
  // quarter more while escapes keep the dump too long.
  auto shrink = [&](const char* field, bool keep_end) {
    if (!j.contains(field) || !j[field].is_string()) return;
    const std::string value = ValidUtf8(j[field].get<std::string>());
    size_t excess = text.size() - limit;
    for (size_t keep = value.size() > excess + 4 ? value.size() - excess - 4 : 0;;
         keep = keep * 3 / 4) {
      j[field] = keep_end ? KeepEnd(value, keep + 4, "...\n") : KeepStart(value, keep + 3, "...");
      text = dump(j);
      if (text.size() <= limit || keep == 0) break;
    }
    if (text.size() > limit) j.erase(field);
    text = dump(j);
  };
  shrink("logTail", /*keep_end=*/true);
  if (text.size() > limit) shrink("stack", /*keep_end=*/false);
  while (text.size() > limit && j.contains("consequences") && j["consequences"].is_array() &&
         !j["consequences"].empty()) {
    j["consequences"].erase(j["consequences"].size() - 1);
    if (j["consequences"].empty()) j.erase("consequences");
    text = dump(j);
  }
  if (text.size() > limit) shrink("line", /*keep_end=*/false);
  if (text.size() > limit) shrink("message", /*keep_end=*/false);
  if (text.size() > limit) text = dump({{"reason", j.value("reason", "Unknown")}});
  return text;
}

void WriteTerminationLog(const AgentOptions& o, const nlohmann::json& message) {
  if (!ShouldWriteTerminationLog(o)) return;
  const std::string text = FitTerminationMessage(message, kTerminationMessageLimit);
  std::ofstream out(o.termination_log, std::ios::trunc);
  out << text << "\n";
  if (!out) Say("warning: cannot write the termination log " + o.termination_log);
}

}  // namespace spawnpoint::agent
