// Structured logs in logfmt, one line per event:
//   ts=2024-05-01T10:00:00.123Z level=info msg="created pods" job=ml/resnet reconcile=r12 n=2
// A Logger carries context fields (component, job, reconcile id) that every line repeats, so
// one job's story can be grepped out of many. Callers never pass credentials; values are
// quoted and escaped as logfmt requires. Thread-safe: lines are written whole, under a lock.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace spawnpoint::op {

enum class LogLevel { kDebug, kInfo, kWarning, kError };

struct LogField {
  std::string key;
  std::string value;
  LogField(std::string k, std::string v) : key(std::move(k)), value(std::move(v)) {}
  LogField(std::string k, const char* v) : key(std::move(k)), value(v) {}
  template <typename N, typename = std::enable_if_t<std::is_arithmetic_v<N>>>
  LogField(std::string k, N v) : key(std::move(k)), value(std::to_string(v)) {}
};
using LogFields = std::vector<LogField>;

// Where finished lines go (default: stderr). For tests.
using LogSink = std::function<void(const std::string& line)>;
void SetLogSink(LogSink sink);
void SetLogLevel(LogLevel level);
// "debug", "info", "warning"/"warn", "error"; false if unknown.
bool ParseLogLevel(const std::string& text, LogLevel* level);

class Logger {
 public:
  Logger() = default;
  explicit Logger(LogFields context) : context_(std::move(context)) {}
  // A logger whose lines also carry `more`.
  Logger With(LogFields more) const;

  void Log(LogLevel level, std::string_view message, const LogFields& fields = {}) const;
  void Debug(std::string_view m, const LogFields& f = {}) const { Log(LogLevel::kDebug, m, f); }
  void Info(std::string_view m, const LogFields& f = {}) const { Log(LogLevel::kInfo, m, f); }
  void Warning(std::string_view m, const LogFields& f = {}) const { Log(LogLevel::kWarning, m, f); }
  void Error(std::string_view m, const LogFields& f = {}) const { Log(LogLevel::kError, m, f); }

 private:
  LogFields context_;
};

// One logfmt value: bare when safe, else quoted with \" \\ \n escaped.
std::string LogfmtValue(std::string_view value);

}  // namespace spawnpoint::op
