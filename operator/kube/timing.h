// Time-driven building blocks, all on an injected Clock so they run on simulated time in
// tests: a token-bucket rate limiter, a jittered exponential backoff, and a condition wait
// with a clock deadline. TokenBucket is thread-safe; Backoff is not (one owner).
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>

#include "common/clock.h"

namespace spawnpoint::kube {

// Client-side QPS/burst limit. Tokens refill at `qps` per second up to `burst`; each
// request takes one. A request may reserve a token that is not there yet: it is then
// told when to go, so concurrent callers are served in reservation order.
class TokenBucket {
 public:
  // qps <= 0 disables the limit.
  TokenBucket(double qps, int burst, Clock* clock);
  // Takes a token and returns the time at which the caller may proceed (Now() or later).
  Clock::TimePoint Reserve();
  // Reserve() and sleep on the clock until then.
  void Wait();
  // Takes a token only if one is available now.
  bool TryAccept();

 private:
  void RefillLocked(Clock::TimePoint now);

  const double qps_;
  const double burst_;
  Clock* const clock_;
  std::mutex mu_;
  double tokens_;
  Clock::TimePoint last_;
};

struct BackoffPolicy {
  Clock::Duration initial = std::chrono::milliseconds(800);
  Clock::Duration max = std::chrono::seconds(30);
  double factor = 2.0;
  // Each delay is scaled by a uniform factor in [1 - jitter/2, 1 + jitter/2), so that
  // clients that failed together do not retry together; the result never exceeds `max`.
  double jitter = 0.4;
  // A Next() more than this long after the previous one starts again from `initial`: the
  // failures are no longer consecutive.
  Clock::Duration reset_after = std::chrono::minutes(2);
};

class Backoff {
 public:
  // `uniform01` returns values in [0, 1); defaults to a seeded PRNG.
  Backoff(BackoffPolicy policy, Clock* clock, std::function<double()> uniform01 = nullptr);
  // The delay before the next attempt.
  Clock::Duration Next();
  // The next delay starts again from `initial`.
  void Reset();
  const BackoffPolicy& policy() const { return policy_; }

 private:
  BackoffPolicy policy_;
  Clock* clock_;
  std::function<double()> uniform01_;
  Clock::Duration current_{0};
  Clock::TimePoint last_{};
  bool started_ = false;
};

// Implemented by simulated clocks that want to know who is waiting on them (tests use it
// to advance time only once every thread has gone to sleep). WaitUntil reports each
// blocking wait with its deadline; the observer must not block or call back.
class ClockWaitObserver {
 public:
  virtual ~ClockWaitObserver() = default;
  virtual void WaitStarted(const void* waiter, Clock::TimePoint deadline) = 0;
  virtual void WaitEnded(const void* waiter) = 0;
};

// Waits on `cv` (whose mutex `lock` holds) until `pred()` holds or `clock` reaches
// `deadline`; returns pred(). On the real clock this is a plain timed wait; on any other
// clock (simulated time) it re-checks every few real milliseconds, because only the clock
// knows when its time moves.
template <typename Pred>
bool WaitUntil(Clock* clock, std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
               Clock::TimePoint deadline, Pred pred) {
  if (pred()) return true;
  if (dynamic_cast<RealClock*>(clock) != nullptr) {
    if (deadline == Clock::TimePoint::max()) {
      cv.wait(lock, pred);
      return true;
    }
    return cv.wait_until(lock, deadline, pred);
  }
  auto* observer = dynamic_cast<ClockWaitObserver*>(clock);
  if (observer != nullptr) observer->WaitStarted(&lock, deadline);
  bool ok = true;
  while (!pred()) {
    if (clock->Now() >= deadline) {
      ok = false;
      break;
    }
    cv.wait_for(lock, std::chrono::milliseconds(2));
  }
  if (observer != nullptr) observer->WaitEnded(&lock);
  return ok;
}

}  // namespace spawnpoint::kube
