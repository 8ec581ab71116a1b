// A simulated clock that knows who is waiting on it, so multi-threaded tests can advance
// time only once every thread has gone to sleep (no real sleeps as synchronisation).
// Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <vector>

#include "common/clock.h"
#include "operator/kube/timing.h"

namespace spawnpoint::kube::testing {

class FakeClock : public Clock, public ClockWaitObserver {
 public:
  TimePoint Now() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return now_;
  }

  void SleepUntil(TimePoint deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    int token;
    waiters_[&token] = deadline;
    changed_.notify_all();
    changed_.wait(lock, [&] { return now_ >= deadline; });
    waiters_.erase(&token);
  }

  void Advance(Duration d) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ += d;
    changed_.notify_all();
  }

  void WaitStarted(const void* waiter, TimePoint deadline) override {
    std::lock_guard<std::mutex> lock(mu_);
    waiters_[waiter] = deadline;
    changed_.notify_all();
  }

  void WaitEnded(const void* waiter) override {
    std::lock_guard<std::mutex> lock(mu_);
    waiters_.erase(waiter);
    changed_.notify_all();
  }

  // Waiters whose deadline is still ahead (those already due are about to wake).
  size_t PendingWaiters() const {
    std::lock_guard<std::mutex> lock(mu_);
    return PendingLocked();
  }

  // Blocks until at least `n` waiters are pending; false after `timeout` of real time.
  bool BlockUntilWaiters(size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, timeout, [&] { return PendingLocked() >= n; });
  }

  // The earliest pending deadline (TimePoint::max() if none).
  TimePoint NextDeadline() const {
    std::lock_guard<std::mutex> lock(mu_);
    return NextDeadlineLocked();
  }

  // Blocks until some waiter sleeps towards a finite deadline; false after `timeout`.
  bool BlockUntilDeadline(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, timeout,
                             [&] { return NextDeadlineLocked() != TimePoint::max(); });
  }

  // Blocks until the earliest pending deadline is exactly `d` from now.
  bool BlockUntilNextDeadlineIn(Duration d,
                                std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, timeout, [&] { return NextDeadlineLocked() - now_ == d; });
  }

 private:
  TimePoint NextDeadlineLocked() const {
    TimePoint next = TimePoint::max();
    for (const auto& [w, d] : waiters_) {
      if (d > now_ && d < next) next = d;
    }
    return next;
  }

  size_t PendingLocked() const {
    size_t n = 0;
    for (const auto& [w, d] : waiters_) n += d > now_ ? 1 : 0;
    return n;
  }

  mutable std::mutex mu_;
  std::condition_variable changed_;
  TimePoint now_{Duration(1'000'000'000)};
  std::map<const void*, TimePoint> waiters_;
};

// Never blocks: SleepUntil jumps the time forward and records the sleep. For code that
// sleeps on the calling thread only (the client's retries and rate limit).
class AutoAdvanceClock : public Clock {
 public:
  TimePoint Now() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return now_;
  }
  void SleepUntil(TimePoint deadline) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (deadline > now_) {
      sleeps_.push_back(deadline - now_);
      now_ = deadline;
    }
  }
  std::vector<Duration> Sleeps() const {
    std::lock_guard<std::mutex> lock(mu_);
    return sleeps_;
  }

 private:
  mutable std::mutex mu_;
  TimePoint now_{Duration(1'000'000'000)};
  std::vector<Duration> sleeps_;
};

}  // namespace spawnpoint::kube::testing
