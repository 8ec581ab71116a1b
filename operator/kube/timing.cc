#include "operator/kube/timing.h"

#include <algorithm>
#include <random>

namespace spawnpoint::kube {

TokenBucket::TokenBucket(double qps, int burst, Clock* clock)
    : qps_(qps), burst_(std::max(1, burst)), clock_(clock), tokens_(burst_), last_(clock->Now()) {}

void TokenBucket::RefillLocked(Clock::TimePoint now) {
  if (now <= last_) return;
  double elapsed = std::chrono::duration<double>(now - last_).count();
  tokens_ = std::min(burst_, tokens_ + elapsed * qps_);
  last_ = now;
}

Clock::TimePoint TokenBucket::Reserve() {
  auto now = clock_->Now();
  if (qps_ <= 0) return now;
  std::lock_guard<std::mutex> lock(mu_);
  RefillLocked(now);
  tokens_ -= 1;
  if (tokens_ >= 0) return now;
  // A debt of d tokens is repaid after d / qps seconds.
  auto wait = std::chrono::duration<double>(-tokens_ / qps_);
  return now + std::chrono::duration_cast<Clock::Duration>(wait);
}

void TokenBucket::Wait() {
  auto at = Reserve();
  if (at > clock_->Now()) clock_->SleepUntil(at);
}

bool TokenBucket::TryAccept() {
  if (qps_ <= 0) return true;
  std::lock_guard<std::mutex> lock(mu_);
  RefillLocked(clock_->Now());
  if (tokens_ < 1) return false;
  tokens_ -= 1;
  return true;
}

Backoff::Backoff(BackoffPolicy policy, Clock* clock, std::function<double()> uniform01)
    : policy_(policy), clock_(clock), uniform01_(std::move(uniform01)) {
  if (!uniform01_) {
    auto rng = std::make_shared<std::mt19937_64>(std::random_device{}());
    uniform01_ = [rng] { return std::uniform_real_distribution<double>(0.0, 1.0)(*rng); };
  }
}

Clock::Duration Backoff::Next() {
  auto now = clock_->Now();
  if (!started_ || now - last_ > policy_.reset_after) {
    current_ = policy_.initial;
    started_ = true;
  } else {
    auto grown = std::chrono::duration<double>(current_) * policy_.factor;
    current_ = grown >= std::chrono::duration<double>(policy_.max)
                   ? policy_.max
                   : std::chrono::duration_cast<Clock::Duration>(grown);
  }
  last_ = now;
  double scale = 1.0 + policy_.jitter * (uniform01_() - 0.5);
  auto d =
      std::chrono::duration_cast<Clock::Duration>(std::chrono::duration<double>(current_) * scale);
  return std::min(d, policy_.max);
}

void Backoff::Reset() { started_ = false; }

}  // namespace spawnpoint::kube
