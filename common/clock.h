// Time as an injected seam (Envoy's TimeSource idea): production code asks a Clock for
// "now" and sleeps through it, so backoff, grace periods and timeouts run on simulated
// time in unit tests. RealClock and SimulatedClock are thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace spawnpoint {

class Clock {
 public:
  using Duration = std::chrono::nanoseconds;
  using TimePoint = std::chrono::time_point<std::chrono::steady_clock, Duration>;
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
  // Blocks the caller until Now() >= deadline.
  virtual void SleepUntil(TimePoint deadline) = 0;
  void SleepFor(Duration d) { SleepUntil(Now() + d); }
};

class RealClock : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  void SleepUntil(TimePoint deadline) override;
  static RealClock* Get();
};

// Time moves only when Advance() is called; sleepers wake when their deadline passes.
class SimulatedClock : public Clock {
 public:
  TimePoint Now() const override;
  void SleepUntil(TimePoint deadline) override;
  void Advance(Duration d);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  TimePoint now_{Duration(1'000'000'000)};
};

}  // namespace spawnpoint
