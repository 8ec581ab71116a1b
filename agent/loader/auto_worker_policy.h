// The knee search behind "auto" loader workers: given when each batch was consumed, it says
// how many workers should be active. Pure (time comes in as an argument) and not thread-safe:
// one owner calls it, in the order the batches are consumed.
//
// The algorithm: after each change, skip the batches that were already prefetched (they say
// nothing about the new count); then measure the consumption rate over a window of at least
// `window` and 4 batches; add one worker while that buys at least 5 %; when it stops paying,
// step back to the last count that did and settle (the knee); settle at the cap as well.
#pragma once

#include "common/clock.h"

namespace spawnpoint::loader {

class AutoWorkerPolicy {
 public:
  // cap <= 0 disables the search: active() stays `initial` and settled() stays false.
  AutoWorkerPolicy(int initial, int cap, int prefetch_factor, Clock::Duration window);

  // Called once per consumed batch; returns the number of active workers from now on.
  int OnBatch(Clock::TimePoint now);

  bool enabled() const { return cap_ > 0; }
  bool settled() const { return settled_; }
  int active() const { return active_; }

 private:
  // Constant after construction.
  const int cap_;
  const int prefetch_factor_;
  const Clock::Duration window_;

  // The search.
  int active_;
  bool settled_ = false;
  int skip_ = 0;  // batches still to ignore since the last change
  int window_count_ = 0;
  Clock::TimePoint window_start_{};
  double best_rate_ = 0;  // batches per second with the last count that paid
};

}  // namespace spawnpoint::loader
