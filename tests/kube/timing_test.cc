#include "operator/kube/timing.h"

#include <gtest/gtest.h>

#include <thread>

#include "tests/kube/fake_clock.h"

namespace spawnpoint::kube {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(TokenBucketTest, BurstThenSteadyRate) {
  SimulatedClock clock;
  TokenBucket bucket(5, 3, &clock);  // 5 qps, burst 3
  auto t0 = clock.Now();
  EXPECT_EQ(bucket.Reserve(), t0);
  EXPECT_EQ(bucket.Reserve(), t0);
  EXPECT_EQ(bucket.Reserve(), t0);
  // Each further token is owed 200 ms after the previous one.
  EXPECT_EQ(bucket.Reserve(), t0 + milliseconds(200));
  EXPECT_EQ(bucket.Reserve(), t0 + milliseconds(400));
  EXPECT_FALSE(bucket.TryAccept());
  // After a quiet second the debt (2 tokens) is repaid and 3 more have accrued; the bucket
  // is capped at the burst.
  clock.Advance(seconds(10));
  EXPECT_TRUE(bucket.TryAccept());
  EXPECT_TRUE(bucket.TryAccept());
  EXPECT_TRUE(bucket.TryAccept());
  EXPECT_FALSE(bucket.TryAccept());
  clock.Advance(milliseconds(200));
  EXPECT_TRUE(bucket.TryAccept());
}

TEST(TokenBucketTest, WaitSleepsOnTheClock) {
  testing::FakeClock clock;
  TokenBucket bucket(10, 1, &clock);
  bucket.Wait();  // the burst token: no sleep
  std::thread t([&] { bucket.Wait(); });
  ASSERT_TRUE(clock.BlockUntilWaiters(1));
  EXPECT_EQ(clock.NextDeadline() - clock.Now(), milliseconds(100));
  clock.Advance(milliseconds(100));
  t.join();
}

TEST(TokenBucketTest, ZeroQpsIsUnlimited) {
  SimulatedClock clock;
  TokenBucket bucket(0, 1, &clock);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(bucket.Reserve(), clock.Now());
}

TEST(BackoffTest, DoublesToTheCapAndResetsAfterHealthyPeriod) {
  SimulatedClock clock;
  Backoff b(BackoffPolicy{}, &clock, [] { return 0.5; });  // 0.5: no jitter
  std::vector<int64_t> ms;
  for (int i = 0; i < 8; ++i) {
    ms.push_back(std::chrono::duration_cast<milliseconds>(b.Next()).count());
    clock.Advance(seconds(1));
  }
  EXPECT_EQ(ms, (std::vector<int64_t>{800, 1600, 3200, 6400, 12800, 25600, 30000, 30000}));
  // Two healthy minutes without a failure: start over.
  clock.Advance(std::chrono::minutes(2) + seconds(1));
  EXPECT_EQ(b.Next(), milliseconds(800));
  EXPECT_EQ(b.Next(), milliseconds(1600));
  b.Reset();
  EXPECT_EQ(b.Next(), milliseconds(800));
}

TEST(BackoffTest, JitterStaysWithinBoundsAndUnderTheCap) {
  SimulatedClock clock;
  double r = 0;
  Backoff b(BackoffPolicy{}, &clock, [&] { return r; });
  r = 0.0;
  EXPECT_EQ(b.Next(), milliseconds(640));  // 800 × 0.8
  r = 0.999999;
  auto d = b.Next();  // 1600 × ~1.2
  EXPECT_GT(d, milliseconds(1900));
  EXPECT_LT(d, milliseconds(1921));
  for (int i = 0; i < 10; ++i) EXPECT_LE(b.Next(), seconds(30));
}

TEST(WaitUntilTest, WakesOnPredicateOrClockDeadline) {
  SimulatedClock sim;
  std::mutex mu;
  std::condition_variable cv;
  bool flag = false;
  std::unique_lock<std::mutex> lock(mu);
  std::thread t([&] {
    std::lock_guard<std::mutex> l(mu);
    flag = true;
    cv.notify_all();
  });
  EXPECT_TRUE(WaitUntil(&sim, cv, lock, Clock::TimePoint::max(), [&] { return flag; }));
  t.join();
  flag = false;
  // With the deadline already reached the wait returns false at once.
  EXPECT_FALSE(WaitUntil(&sim, cv, lock, sim.Now(), [&] { return flag; }));
  // On the real clock, a plain timed wait.
  EXPECT_FALSE(WaitUntil(RealClock::Get(), cv, lock, RealClock::Get()->Now() + milliseconds(5),
                         [&] { return flag; }));
}

TEST(FakeClockTest, ReportsWaitersUntilTheirDeadlinePasses) {
  testing::FakeClock clock;
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> woke{false};
  std::thread t([&] {
    std::unique_lock<std::mutex> lock(mu);
    WaitUntil(&clock, cv, lock, clock.Now() + seconds(5), [] { return false; });
    woke = true;
  });
  ASSERT_TRUE(clock.BlockUntilWaiters(1));
  EXPECT_EQ(clock.NextDeadline() - clock.Now(), seconds(5));
  clock.Advance(seconds(4));
  EXPECT_EQ(clock.PendingWaiters(), 1u);
  clock.Advance(seconds(1));
  t.join();
  EXPECT_TRUE(woke);
  EXPECT_EQ(clock.PendingWaiters(), 0u);
}

}  // namespace
}  // namespace spawnpoint::kube
