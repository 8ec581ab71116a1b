#include "operator/common/wall_clock.h"

#include <cstdio>
#include <ctime>

namespace spawnpoint::op {

WallClock::WallClock(Clock* clock, std::optional<WallTime> start)
    : clock_(clock),
      base_(clock->Now()),
      wall_base_(start ? *start : std::chrono::system_clock::now()) {}

WallTime WallClock::Now() const {
  return wall_base_ + std::chrono::duration_cast<WallTime::duration>(clock_->Now() - base_);
}

std::string FormatTime(WallTime t, bool millis) {
  using namespace std::chrono;
  auto ms = duration_cast<milliseconds>(t.time_since_epoch()).count();
  if (ms < 0) ms = 0;
  time_t secs = static_cast<time_t>(ms / 1000);
  struct tm tm {};
  gmtime_r(&secs, &tm);
  char buf[64];
  if (millis) {
    snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
             static_cast<int>(ms % 1000));
  } else {
    strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  }
  return buf;
}

std::optional<WallTime> ParseTime(const std::string& text) {
  int y, mo, d, h, mi, s, used = 0;
  if (sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &s, &used) != 6) {
    return std::nullopt;
  }
  size_t i = static_cast<size_t>(used);
  double fraction = 0;
  if (i < text.size() && text[i] == '.') {
    size_t start = i++;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    if (i == start + 1) return std::nullopt;
    fraction = std::stod("0" + text.substr(start, i - start));
  }
  int offset_seconds = 0;
  if (i < text.size() && (text[i] == 'Z' || text[i] == 'z')) {
    ++i;
  } else if (i < text.size() && (text[i] == '+' || text[i] == '-')) {
    int oh = 0, om = 0;
    if (sscanf(text.c_str() + i + 1, "%2d:%2d", &oh, &om) != 2) return std::nullopt;
    offset_seconds = (text[i] == '+' ? 1 : -1) * (oh * 3600 + om * 60);
    i += 6;
  } else {
    return std::nullopt;
  }
  if (i != text.size()) return std::nullopt;
  struct tm tm {};
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = s;
  time_t secs = timegm(&tm) - offset_seconds;
  using namespace std::chrono;
  return WallTime(duration_cast<WallTime::duration>(seconds(secs) + duration<double>(fraction)));
}

std::string FormatDuration(Clock::Duration d) {
  using namespace std::chrono;
  auto ms = duration_cast<milliseconds>(d).count();
  if (ms < 0) ms = 0;
  char buf[48];
  if (ms < 1000) {
    snprintf(buf, sizeof buf, "%lldms", static_cast<long long>(ms));
  } else if (ms < 60'000) {
    if (ms % 1000 == 0) {
      snprintf(buf, sizeof buf, "%llds", static_cast<long long>(ms / 1000));
    } else {
      snprintf(buf, sizeof buf, "%.1fs", ms / 1000.0);
    }
  } else if (ms < 3'600'000) {
    snprintf(buf, sizeof buf, "%lldm%llds", static_cast<long long>(ms / 60'000),
             static_cast<long long>((ms / 1000) % 60));
  } else {
    snprintf(buf, sizeof buf, "%lldh%lldm", static_cast<long long>(ms / 3'600'000),
             static_cast<long long>((ms / 60'000) % 60));
  }
  return buf;
}

}  // namespace spawnpoint::op
