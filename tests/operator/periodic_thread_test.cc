// PeriodicThread: ticks once per interval of its clock (a simulated one here: no real waits
// decide anything), none before the first interval, none after Stop(), which ends its wait
// at once.
#include "operator/utilisation/periodic_thread.h"

#include <atomic>
#include <chrono>
#include <functional>

#include <gtest/gtest.h>

#include "tests/support/test_process.h"

namespace spawnpoint::op {
namespace {

using std::chrono::seconds;

// Polls `pred` for up to 30 real seconds (a generous margin for a loaded machine).
bool Eventually(const std::function<bool()>& pred) {
  return spawnpoint::testing::WaitUntil(pred, std::chrono::milliseconds(30'000));
}

TEST(PeriodicThreadTest, TicksOncePerIntervalOfItsClockUntilStopped) {
  SimulatedClock clock;
  std::atomic<int> ticks{0};
  PeriodicThread thread;
  thread.Start(&clock, seconds(10), [&] { ticks++; });
  clock.Advance(seconds(9));
  clock.Advance(seconds(1));
  ASSERT_TRUE(Eventually([&] { return ticks == 1; }));
  clock.Advance(seconds(10));
  ASSERT_TRUE(Eventually([&] { return ticks == 2; }));
  EXPECT_FALSE(thread.Stopping());
  thread.Stop();  // its wait for the third interval ends at once: no time moves
  EXPECT_TRUE(thread.Stopping());
  clock.Advance(seconds(60));
  EXPECT_EQ(ticks, 2);
  thread.Start(&clock, seconds(10), [&] { ticks++; });  // stopped for good
  clock.Advance(seconds(60));
  EXPECT_EQ(ticks, 2);
}

TEST(PeriodicThreadTest, NoIntervalNoThread) {
  SimulatedClock clock;
  std::atomic<int> ticks{0};
  PeriodicThread thread;
  thread.Start(&clock, seconds(0), [&] { ticks++; });
  clock.Advance(seconds(60));
  thread.Stop();
  EXPECT_EQ(ticks, 0);
}

}  // namespace
}  // namespace spawnpoint::op
