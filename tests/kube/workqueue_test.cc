#include "operator/kube/workqueue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <set>
#include <thread>

#include "tests/kube/fake_clock.h"
#include "tests/support/test_process.h"

namespace spawnpoint::kube {
namespace {

using spawnpoint::testing::WaitUntil;
using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::FakeClock;

TEST(WorkQueueTest, RepeatedAddsWhileQueuedCollapse) {
  SimulatedClock clock;
  WorkQueue q(&clock);
  q.Add("ns/a");
  q.Add("ns/a");
  q.Add("ns/b");
  q.Add("ns/a");
  EXPECT_EQ(q.Len(), 2u);
  EXPECT_EQ(q.Get(), "ns/a");
  EXPECT_EQ(q.Get(), "ns/b");
  EXPECT_EQ(q.Stats().adds, 2);
}

TEST(WorkQueueTest, AddWhileProcessingRequeuesAfterDone) {
  SimulatedClock clock;
  WorkQueue q(&clock);
  q.Add("k");
  ASSERT_EQ(q.Get(), "k");
  q.Add("k");  // dirty, but not handed to a second worker
  q.Add("k");
  EXPECT_EQ(q.Len(), 0u);
  EXPECT_EQ(q.Stats().processing, 1u);
  q.Done("k");
  EXPECT_EQ(q.Len(), 1u);
  ASSERT_EQ(q.Get(), "k");
  q.Done("k");
  EXPECT_EQ(q.Len(), 0u);
}

TEST(WorkQueueTest, NoKeyIsEverProcessedByTwoWorkersAtOnce) {
  SimulatedClock clock;
  WorkQueue q(&clock);
  constexpr int kKeys = 8, kWorkers = 4, kProducers = 3, kAddsPerProducer = 3000;
  std::mutex mu;
  std::set<std::string> in_flight;
  std::atomic<int> overlaps{0};
  std::atomic<int64_t> seq{0};
  std::vector<int64_t> last_add(kKeys, -1), last_start(kKeys, -1);
  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&] {
      for (;;) {
        auto item = q.Get();
        if (!item) return;
        int k = std::stoi(*item);
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!in_flight.insert(*item).second) ++overlaps;
          last_start[k] = seq++;
        }
        std::this_thread::yield();  // widen the window for a second worker
        {
          std::lock_guard<std::mutex> lock(mu);
          in_flight.erase(*item);
        }
        q.Done(*item);
      }
    });
  }
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      std::mt19937 rng(p);
      for (int i = 0; i < kAddsPerProducer; ++i) {
        int k = static_cast<int>(rng() % kKeys);
        {
          std::lock_guard<std::mutex> lock(mu);
          last_add[k] = seq++;
        }
        q.Add(std::to_string(k));
      }
    });
  }
  for (auto& t : producers) t.join();
  q.ShutDownWithDrain();
  for (auto& t : workers) t.join();
  EXPECT_EQ(overlaps.load(), 0);
  // Every key was processed after its last add (nothing lost by collapsing).
  for (int k = 0; k < kKeys; ++k) EXPECT_GT(last_start[k], last_add[k]) << "key " << k;
}

TEST(WorkQueueTest, AddAfterOnSimulatedClock) {
  SimulatedClock clock;
  WorkQueue q(&clock);
  q.AddAfter("k", seconds(1));
  EXPECT_EQ(q.Len(), 0u);
  EXPECT_EQ(q.Stats().delayed, 1u);
  clock.Advance(seconds(1));
  ASSERT_TRUE(WaitUntil([&] { return q.Len() == 1; }, seconds(10)));
  EXPECT_EQ(q.Stats().delayed, 0u);
  q.AddAfter("now", Clock::Duration::zero());
  EXPECT_EQ(q.Len(), 2u);
}

TEST(WorkQueueTest, AddAfterIsExactAndKeepsTheEarlierTime) {
  FakeClock clock;
  WorkQueue q(&clock);
  q.AddAfter("k", seconds(5));
  q.AddAfter("k", seconds(1));   // earlier: wins
  q.AddAfter("k", seconds(10));  // later: ignored
  q.AddAfter("j", seconds(2));
  EXPECT_EQ(q.Stats().delayed, 2u);
  // The delay thread goes to sleep until the earliest deadline.
  ASSERT_TRUE(clock.BlockUntilNextDeadlineIn(seconds(1)));
  clock.Advance(milliseconds(999));
  ASSERT_TRUE(clock.BlockUntilWaiters(1));
  EXPECT_EQ(q.Len(), 0u);
  clock.Advance(milliseconds(1));
  ASSERT_TRUE(WaitUntil([&] { return q.Len() == 1; }, seconds(10)));
  EXPECT_EQ(q.Get(), "k");
  q.Done("k");
  ASSERT_TRUE(clock.BlockUntilNextDeadlineIn(seconds(1)));  // j, at 2 s
  clock.Advance(seconds(1));
  ASSERT_TRUE(WaitUntil([&] { return q.Len() == 1; }, seconds(10)));
  EXPECT_EQ(q.Get(), "j");
  // The superseded 5 s and 10 s entries for k do not fire.
  clock.Advance(seconds(20));
  ASSERT_TRUE(clock.BlockUntilWaiters(1));  // idle again (no deadline)
  EXPECT_EQ(q.Len(), 0u);
}

TEST(WorkQueueTest, RateLimitedBackoffIsPerItemExponential) {
  FakeClock clock;
  WorkQueue q(&clock);
  std::vector<int64_t> delays_ms;
  for (int i = 0; i < 5; ++i) {
    q.AddRateLimited("k");
    ASSERT_TRUE(clock.BlockUntilDeadline());
    auto d = clock.NextDeadline() - clock.Now();
    delays_ms.push_back(std::chrono::duration_cast<milliseconds>(d).count());
    clock.Advance(d);
    ASSERT_TRUE(WaitUntil([&] { return q.Len() == 1; }, seconds(10)));
    ASSERT_EQ(q.Get(), "k");
    q.Done("k");
  }
  EXPECT_EQ(delays_ms, (std::vector<int64_t>{5, 10, 20, 40, 80}));
  EXPECT_EQ(q.NumRequeues("k"), 5);
  EXPECT_EQ(q.NumRequeues("other"), 0);
  EXPECT_EQ(q.Stats().retries, 5);
  q.Forget("k");
  EXPECT_EQ(q.NumRequeues("k"), 0);
}

TEST(WorkQueueTest, ItemBackoffCapsAt1000Seconds) {
  ItemExponentialRateLimiter rl;
  Clock::Duration last{};
  for (int i = 0; i < 40; ++i) last = rl.When("x");
  EXPECT_EQ(last, seconds(1000));
  EXPECT_EQ(rl.When("y"), milliseconds(5));
  EXPECT_EQ(rl.NumRequeues("x"), 40);
}

TEST(WorkQueueTest, ShutDownDrainsQueuedItemsThenStops) {
  SimulatedClock clock;
  WorkQueue q(&clock);
  q.Add("a");
  q.Add("b");
  q.ShutDown();
  q.Add("c");  // ignored
  EXPECT_TRUE(q.ShuttingDown());
  EXPECT_EQ(q.Get(), "a");
  EXPECT_EQ(q.Get(), "b");
  EXPECT_EQ(q.Get(), std::nullopt);
}

TEST(WorkQueueTest, ShutDownWakesBlockedWorkers) {
  SimulatedClock clock;
  WorkQueue q(&clock);
  std::atomic<int> exited{0};
  std::vector<std::thread> workers;
  for (int i = 0; i < 3; ++i) {
    workers.emplace_back([&] {
      EXPECT_EQ(q.Get(), std::nullopt);
      ++exited;
    });
  }
  q.ShutDown();
  for (auto& t : workers) t.join();
  EXPECT_EQ(exited.load(), 3);
}

TEST(WorkQueueTest, ShutDownWithDrainWaitsForInFlightWork) {
  SimulatedClock clock;
  WorkQueue q(&clock);
  q.Add("a");
  q.Add("b");
  ASSERT_EQ(q.Get(), "a");
  std::atomic<bool> drained{false};
  std::thread drainer([&] {
    q.ShutDownWithDrain();
    drained = true;
  });
  ASSERT_TRUE(WaitUntil([&] { return q.ShuttingDown(); }, seconds(10)));
  q.Add("a");               // ignored: shutting down
  ASSERT_EQ(q.Get(), "b");  // still handed out while draining
  q.Done("b");
  EXPECT_FALSE(drained);  // "a" is still being processed
  q.Done("a");
  drainer.join();
  EXPECT_TRUE(drained);
  EXPECT_EQ(q.Get(), std::nullopt);
}

TEST(WorkQueueTest, MetricsHooks) {
  struct Recorder : WorkQueueMetrics {
    void OnAdd(const std::string&) override { ++adds; }
    void OnDepth(size_t d) override { depth = d; }
    void OnRetry(const std::string&) override { ++retries; }
    void OnQueueLatency(Clock::Duration w) override { waited = w; }
    void OnWorkDuration(Clock::Duration w) override { worked = w; }
    int adds = 0, retries = 0;
    size_t depth = 0;
    Clock::Duration waited{}, worked{};
  };
  SimulatedClock clock;
  auto rec = std::make_shared<Recorder>();
  WorkQueue q(&clock, {.name = "tj", .metrics = rec});
  q.Add("a");
  q.Add("b");
  EXPECT_EQ(rec->depth, 2u);
  clock.Advance(seconds(3));
  ASSERT_EQ(q.Get(), "a");
  EXPECT_EQ(rec->waited, seconds(3));
  EXPECT_EQ(rec->depth, 1u);
  clock.Advance(seconds(2));
  q.Done("a");
  EXPECT_EQ(rec->worked, seconds(2));
  q.AddRateLimited("a");
  EXPECT_EQ(rec->retries, 1);
  EXPECT_EQ(rec->adds, 2);
}

}  // namespace
}  // namespace spawnpoint::kube
