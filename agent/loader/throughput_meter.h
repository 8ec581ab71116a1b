// What the trainer consumed and how long it waited: batches and samples per second over a
// recent window, and the data-stall fraction since the first epoch began. Time comes in as
// arguments. Not thread-safe: the owner serialises calls (Stats() readers take its lock).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <utility>

#include "common/clock.h"

namespace spawnpoint::loader {

struct LoaderStats;

class ThroughputMeter {
 public:
  // `created`: when the loader began (first_batch_seconds counts from it).
  explicit ThroughputMeter(Clock::TimePoint created,
                           Clock::Duration rate_window = std::chrono::seconds(5));

  // The first epoch begins (later calls change nothing): the stall fraction counts from here.
  void Started(Clock::TimePoint now);
  // The trainer was blocked for `d` asking for a batch.
  void Waited(Clock::Duration d);
  // The trainer got a batch of `samples` at `now`.
  void Consumed(Clock::TimePoint now, int64_t samples);
  // Sets batches, samples, wait_seconds, stall_fraction, first_batch_seconds and the rates.
  void Fill(LoaderStats& s, Clock::TimePoint now) const;

 private:
  // Constant after construction.
  const Clock::TimePoint created_;
  const Clock::Duration rate_window_;

  int64_t batches_ = 0;
  int64_t samples_ = 0;
  Clock::Duration waited_{0};
  std::optional<Clock::TimePoint> started_;
  std::optional<Clock::Duration> first_batch_;
  std::deque<std::pair<Clock::TimePoint, int64_t>> recent_;  // (when, samples) in the window
};

}  // namespace spawnpoint::loader
