// ThroughputMeter on synthetic time: rates over the window it covers, the stall fraction,
// and the time to the first batch.
#include "agent/loader/throughput_meter.h"

#include <gtest/gtest.h>

#include "agent/loader/loader.h"

namespace spawnpoint::loader {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(ThroughputMeter, NothingConsumedYet) {
  const Clock::TimePoint t0{};
  ThroughputMeter m(t0);
  LoaderStats s;
  m.Fill(s, t0 + seconds(1));
  EXPECT_EQ(s.batches, 0);
  EXPECT_EQ(s.batches_per_second, 0);
  EXPECT_EQ(s.first_batch_seconds, -1);
  EXPECT_EQ(s.stall_fraction, 0);
}

TEST(ThroughputMeter, RatesOverTheSpanTheWindowCovers) {
  const Clock::TimePoint t0{};
  ThroughputMeter m(t0, seconds(5));
  m.Started(t0);
  // A batch of 8 every 100 ms for 10 s: only the last 5 s count.
  Clock::TimePoint t = t0;
  for (int i = 0; i < 100; ++i) m.Consumed(t += milliseconds(100), 8);
  LoaderStats s;
  m.Fill(s, t);
  EXPECT_EQ(s.batches, 100);
  EXPECT_EQ(s.samples, 800);
  EXPECT_NEAR(s.batches_per_second, 51 / 5.0, 1e-9);  // 51 batches in [t - 5 s, t]
  EXPECT_NEAR(s.samples_per_second, 8 * 51 / 5.0, 1e-9);
  EXPECT_NEAR(s.first_batch_seconds, 0.1, 1e-9);
}

TEST(ThroughputMeter, AYoungLoaderIsNotUnderReported) {
  const Clock::TimePoint t0{};
  ThroughputMeter m(t0, seconds(5));
  m.Consumed(t0 + seconds(1), 4);
  m.Consumed(t0 + seconds(2), 4);
  LoaderStats s;
  m.Fill(s, t0 + seconds(2));
  EXPECT_NEAR(s.batches_per_second, 2.0, 1e-9);  // over the 1 s covered, not the 5 s window
}

TEST(ThroughputMeter, StallFractionIsTheWaitOverTheWallTimeSinceTheStart) {
  const Clock::TimePoint t0{};
  ThroughputMeter m(t0 - seconds(3));  // created earlier: not counted
  m.Started(t0);
  m.Started(t0 + seconds(1));  // only the first start counts
  m.Waited(milliseconds(500));
  m.Waited(milliseconds(500));
  LoaderStats s;
  m.Fill(s, t0 + seconds(4));
  EXPECT_NEAR(s.wait_seconds, 1.0, 1e-9);
  EXPECT_NEAR(s.stall_fraction, 0.25, 1e-9);
  m.Waited(seconds(10));
  m.Fill(s, t0 + seconds(4));
  EXPECT_EQ(s.stall_fraction, 1.0);  // capped
}

}  // namespace
}  // namespace spawnpoint::loader
