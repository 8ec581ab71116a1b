#include "operator/common/log.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>

#include "operator/common/wall_clock.h"

namespace spawnpoint::op {
namespace {

std::mutex& SinkMutex() {
  static std::mutex mu;
  return mu;
}
LogSink& Sink() {
  static LogSink sink;
  return sink;
}
std::atomic<int>& MinLevel() {
  static std::atomic<int> level{static_cast<int>(LogLevel::kInfo)};
  return level;
}

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

}  // namespace

void SetLogSink(LogSink sink) {
  std::lock_guard<std::mutex> lock(SinkMutex());
  Sink() = std::move(sink);
}

void SetLogLevel(LogLevel level) { MinLevel() = static_cast<int>(level); }

bool ParseLogLevel(const std::string& text, LogLevel* level) {
  if (text == "debug") {
    *level = LogLevel::kDebug;
  } else if (text == "info") {
    *level = LogLevel::kInfo;
  } else if (text == "warning" || text == "warn") {
    *level = LogLevel::kWarning;
  } else if (text == "error") {
    *level = LogLevel::kError;
  } else {
    return false;
  }
  return true;
}

std::string LogfmtValue(std::string_view value) {
  bool bare = !value.empty();
  for (char c : value) {
    if (c <= ' ' || c == '"' || c == '=' || c == '\\' || static_cast<unsigned char>(c) >= 0x7f) {
      bare = false;
      break;
    }
  }
  if (bare) return std::string(value);
  std::string out = "\"";
  for (char c : value) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        out += c;
    }
  }
  return out + "\"";
}

Logger Logger::With(LogFields more) const {
  LogFields all = context_;
  for (auto& f : more) all.push_back(std::move(f));
  return Logger(std::move(all));
}

void Logger::Log(LogLevel level, std::string_view message, const LogFields& fields) const {
  if (static_cast<int>(level) < MinLevel().load()) return;
  std::string line = "ts=" + FormatTime(std::chrono::system_clock::now(), /*millis=*/true) +
                     " level=" + LevelName(level) + " msg=" + LogfmtValue(message);
  for (const auto& f : context_) line += " " + f.key + "=" + LogfmtValue(f.value);
  for (const auto& f : fields) line += " " + f.key + "=" + LogfmtValue(f.value);
  std::lock_guard<std::mutex> lock(SinkMutex());
  if (Sink()) {
    Sink()(line);
    return;
  }
  line += "\n";
  (void)!write(2, line.data(), line.size());
}

}  // namespace spawnpoint::op
