// Wall-clock time for the timestamps the API stores (startTime, lastTransitionTime,
// lastFailure.time), derived from the injected Clock: wall = the wall time at construction +
// the Clock's time elapsed since. On a SimulatedClock, Advance() moves both, so deadlines,
// TTLs and backoffs that compare stored timestamps with "now" are unit-tested on simulated
// time. Thread-safe (immutable after construction).
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "common/clock.h"

namespace spawnpoint::op {

using WallTime = std::chrono::system_clock::time_point;

class WallClock {
 public:
  // `start` is the wall time at construction (default: the system clock's now).
  explicit WallClock(Clock* clock, std::optional<WallTime> start = std::nullopt);
  WallTime Now() const;
  Clock* clock() const { return clock_; }

 private:
  Clock* const clock_;
  const Clock::TimePoint base_;
  const WallTime wall_base_;
};

// RFC 3339 in UTC: "2024-05-01T10:00:00Z" (metav1.Time), or with milliseconds
// "2024-05-01T10:00:00.123Z" when `millis`.
std::string FormatTime(WallTime t, bool millis = false);
// Accepts "Z" or a numeric offset and an optional fraction; nullopt if malformed.
std::optional<WallTime> ParseTime(const std::string& text);
// "1m30s", "2.5s", "45ms": for messages.
std::string FormatDuration(Clock::Duration d);

}  // namespace spawnpoint::op
