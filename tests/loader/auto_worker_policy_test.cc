// The auto-worker knee search on synthetic time: each test plays a consumer whose batch rate
// is a function of the active workers, so the outcome is exact and independent of load.
#include "agent/loader/auto_worker_policy.h"

#include <functional>
#include <vector>

#include <gtest/gtest.h>

namespace spawnpoint::loader {
namespace {

using std::chrono::milliseconds;

struct Played {
  int active = 0;
  bool settled = false;
  int batches = 0;           // consumed until settled (or the bound)
  std::vector<int> changes;  // the batch numbers (1-based) after which `active` changed
};

// Consumes up to `max_batches` batches at `rate(active)` batches per second.
Played Play(AutoWorkerPolicy& p, const std::function<double(int)>& rate, int max_batches = 10000) {
  Played r;
  Clock::TimePoint now{};
  int active = p.active();
  while (r.batches < max_batches && !p.settled()) {
    now += std::chrono::duration_cast<Clock::Duration>(
        std::chrono::duration<double>(1.0 / rate(active)));
    ++r.batches;
    const int next = p.OnBatch(now);
    if (next != active) r.changes.push_back(r.batches);
    active = next;
  }
  r.active = p.active();
  r.settled = p.settled();
  return r;
}

TEST(AutoWorkerPolicy, TrainerBoundSettlesAtOneWorker) {
  AutoWorkerPolicy p(1, 8, 2, milliseconds(300));
  Played r = Play(p, [](int) { return 100.0; });  // the trainer's step sets the pace
  EXPECT_TRUE(r.settled);
  EXPECT_EQ(r.active, 1);
  EXPECT_EQ(r.changes.size(), 2u);  // tried 2, stepped back
}

TEST(AutoWorkerPolicy, WorkerBoundScalesToTheCap) {
  AutoWorkerPolicy p(1, 5, 2, milliseconds(300));
  Played r = Play(p, [](int w) { return 50.0 * w; });
  EXPECT_TRUE(r.settled);
  EXPECT_EQ(r.active, 5);
  EXPECT_EQ(r.changes.size(), 4u);  // 1 -> 2 -> 3 -> 4 -> 5, never beyond
}

TEST(AutoWorkerPolicy, SettlesAtTheKnee) {
  AutoWorkerPolicy p(1, 8, 2, milliseconds(300));
  Played r = Play(p, [](int w) { return 40.0 * std::min(w, 3); });
  EXPECT_TRUE(r.settled);
  EXPECT_EQ(r.active, 3);
}

TEST(AutoWorkerPolicy, AGainBelowFivePercentDoesNotPay) {
  AutoWorkerPolicy p(1, 8, 2, milliseconds(300));
  // 2 workers buy 20 %, 3 buy 4 % more: the knee is 2.
  Played r = Play(p, [](int w) { return w == 1 ? 100.0 : w == 2 ? 120.0 : 124.8; });
  EXPECT_TRUE(r.settled);
  EXPECT_EQ(r.active, 2);
}

TEST(AutoWorkerPolicy, StepsBackWhenMoreWorkersAreSlower) {
  AutoWorkerPolicy p(1, 8, 2, milliseconds(300));
  Played r = Play(p, [](int w) { return w <= 3 ? 40.0 * w : 60.0; });
  EXPECT_EQ(r.active, 3);
}

TEST(AutoWorkerPolicy, CapReachedSettlesWithoutTryingMore) {
  AutoWorkerPolicy one(1, 1, 2, milliseconds(300));
  Played r = Play(one, [](int w) { return 100.0 * w; });
  EXPECT_TRUE(r.settled);
  EXPECT_EQ(r.active, 1);
  EXPECT_TRUE(r.changes.empty());

  AutoWorkerPolicy two(1, 2, 2, milliseconds(300));
  r = Play(two, [](int w) { return 100.0 * w; });
  EXPECT_TRUE(r.settled);
  EXPECT_EQ(r.active, 2);
}

TEST(AutoWorkerPolicy, AWindowNeedsFourBatchesHoweverLongItLasts) {
  // Batches 10 s apart fill any window in time; still 4 of them must be measured after the
  // 2 prefetched ones are skipped, so the first change follows batch 2 + 4.
  AutoWorkerPolicy p(1, 8, 2, milliseconds(300));
  Played r = Play(
      p, [](int w) { return 0.1 * w; }, 6);
  ASSERT_EQ(r.changes.size(), 1u);
  EXPECT_EQ(r.changes[0], 6);
  EXPECT_EQ(r.active, 2);
}

TEST(AutoWorkerPolicy, AWindowLastsAtLeastTheWindow) {
  // 100 batches per second and a 1 s window: 100 measured batches, after 2 skipped.
  AutoWorkerPolicy p(1, 8, 2, std::chrono::seconds(1));
  Played r = Play(
      p, [](int w) { return 100.0 * w; }, 102);
  ASSERT_EQ(r.changes.size(), 1u);
  EXPECT_EQ(r.changes[0], 102);
}

TEST(AutoWorkerPolicy, SkipsThePrefetchedBatchesAfterEachChange) {
  // prefetch_factor 3: 1 x 3 batches skipped at the start, 2 x 3 after going to 2 workers,
  // each followed by a 4-batch window (the window length is 0).
  AutoWorkerPolicy p(1, 8, 3, Clock::Duration(0));
  Played r = Play(
      p, [](int w) { return 10.0 * w; }, 17);
  EXPECT_EQ(r.changes, (std::vector<int>{3 + 4, 3 + 4 + 6 + 4}));
  EXPECT_EQ(r.active, 3);
}

TEST(AutoWorkerPolicy, TheSkippedBatchesDoNotCount) {
  // The prefetched batches arrive at once; if they counted, 2 workers would look far faster.
  AutoWorkerPolicy p(1, 8, 2, milliseconds(300));
  Clock::TimePoint now{};
  auto step = [&](milliseconds d) { return p.OnBatch(now += d); };
  step(milliseconds(10));
  step(milliseconds(10));                               // skipped; the window starts here
  for (int i = 0; i < 30; ++i) step(milliseconds(10));  // 100 per second with 1 worker
  ASSERT_EQ(p.active(), 2);
  for (int i = 0; i < 4; ++i) step(milliseconds(0));    // 2 x 2 prefetched: skipped
  for (int i = 0; i < 30; ++i) step(milliseconds(10));  // still 100 per second
  EXPECT_TRUE(p.settled());
  EXPECT_EQ(p.active(), 1);
}

TEST(AutoWorkerPolicy, DisabledKeepsTheInitialCount) {
  AutoWorkerPolicy p(3, 0, 2, milliseconds(300));
  EXPECT_FALSE(p.enabled());
  Played r = Play(
      p, [](int w) { return 100.0 * w; }, 1000);
  EXPECT_FALSE(r.settled);
  EXPECT_EQ(r.active, 3);
  EXPECT_TRUE(r.changes.empty());
}

}  // namespace
}  // namespace spawnpoint::loader
