#include "common/clock.h"

#include <thread>

namespace spawnpoint {

void RealClock::SleepUntil(TimePoint deadline) { std::this_thread::sleep_until(deadline); }

RealClock* RealClock::Get() {
  static RealClock clock;
  return &clock;
}

Clock::TimePoint SimulatedClock::Now() const {
  std::lock_guard<std::mutex> lock(mu_);
  return now_;
}

void SimulatedClock::SleepUntil(TimePoint deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return now_ >= deadline; });
}

void SimulatedClock::Advance(Duration d) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    now_ += d;
  }
  cv_.notify_all();
}

}  // namespace spawnpoint
