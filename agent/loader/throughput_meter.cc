#include "agent/loader/throughput_meter.h"

#include <algorithm>

#include "agent/loader/loader.h"

namespace spawnpoint::loader {
namespace {

double Seconds(Clock::Duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

ThroughputMeter::ThroughputMeter(Clock::TimePoint created, Clock::Duration rate_window)
    : created_(created), rate_window_(rate_window) {}

void ThroughputMeter::Started(Clock::TimePoint now) {
  if (!started_) started_ = now;
}

void ThroughputMeter::Waited(Clock::Duration d) { waited_ += d; }

void ThroughputMeter::Consumed(Clock::TimePoint now, int64_t samples) {
  ++batches_;
  samples_ += samples;
  if (!first_batch_) first_batch_ = now - created_;
  recent_.emplace_back(now, samples);
  while (!recent_.empty() && now - recent_.front().first > rate_window_) recent_.pop_front();
}

void ThroughputMeter::Fill(LoaderStats& s, Clock::TimePoint now) const {
  s.batches = batches_;
  s.samples = samples_;
  s.wait_seconds = Seconds(waited_);
  if (started_) {
    const double wall = Seconds(now - *started_);
    s.stall_fraction = wall > 0 ? std::min(1.0, s.wait_seconds / wall) : 0;
  }
  s.first_batch_seconds = first_batch_ ? Seconds(*first_batch_) : -1;
  int64_t n = 0, k = 0;
  std::optional<Clock::TimePoint> oldest;
  for (const auto& [t, m] : recent_) {
    if (now - t > rate_window_) continue;
    n += m;
    ++k;
    if (!oldest) oldest = t;
  }
  if (k > 0) {
    // Over the span the window actually covers, so a young loader is not under-reported.
    const double span = std::max(Seconds(now - *oldest), 1e-3);
    s.batches_per_second = k / span;
    s.samples_per_second = n / span;
  }
}

}  // namespace spawnpoint::loader
