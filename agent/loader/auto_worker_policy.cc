#include "agent/loader/auto_worker_policy.h"

#include <algorithm>

namespace spawnpoint::loader {

AutoWorkerPolicy::AutoWorkerPolicy(int initial, int cap, int prefetch_factor,
                                   Clock::Duration window)
    : cap_(cap), prefetch_factor_(prefetch_factor), window_(window), active_(initial) {
  if (enabled()) skip_ = active_ * prefetch_factor_;
}

int AutoWorkerPolicy::OnBatch(Clock::TimePoint now) {
  if (!enabled() || settled_) return active_;
  if (skip_ > 0) {
    if (--skip_ == 0) {
      window_start_ = now;
      window_count_ = 0;
    }
    return active_;
  }
  ++window_count_;
  const auto elapsed = now - window_start_;
  if (elapsed < window_ || window_count_ < 4) return active_;
  const double rate = window_count_ / std::chrono::duration<double>(elapsed).count();
  if (best_rate_ > 0 && rate < best_rate_ * 1.05) {
    active_ = std::max(1, active_ - 1);
    settled_ = true;
    return active_;
  }
  best_rate_ = rate;
  if (active_ >= cap_) {
    settled_ = true;
    return active_;
  }
  ++active_;
  skip_ = active_ * prefetch_factor_;
  return active_;
}

}  // namespace spawnpoint::loader
