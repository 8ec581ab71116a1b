#include "operator/utilisation/periodic_thread.h"

#include "operator/kube/timing.h"

namespace spawnpoint::op {

PeriodicThread::~PeriodicThread() { Stop(); }

void PeriodicThread::Start(Clock* clock, Clock::Duration interval, std::function<void()> tick) {
  std::lock_guard<std::mutex> lock(mu_);
  if (interval <= Clock::Duration::zero() || thread_.joinable() || stop_) return;
  // Ticks are due on a schedule fixed here, each an interval after the last one due; a tick
  // that overran the next is followed by a whole interval.
  thread_ = std::thread(
      [this, clock, interval, tick = std::move(tick), next = clock->Now() + interval]() mutable {
        while (true) {
          {
            std::unique_lock<std::mutex> lock(mu_);
            kube::WaitUntil(clock, cv_, lock, next, [&] { return stop_; });
            if (stop_) return;
          }
          tick();
          next += interval;
          if (const Clock::TimePoint now = clock->Now(); next < now) next = now + interval;
        }
      });
}

void PeriodicThread::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

bool PeriodicThread::Stopping() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stop_;
}

}  // namespace spawnpoint::op
