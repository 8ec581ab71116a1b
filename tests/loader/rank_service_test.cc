// The agent's per-rank loader service (agent/loader/rank_service.h) with the Python rank side
// (spawnpoint_rank/_pool_iter.py) on real processes: a StandalonePool of Python workers and a
// RankPoolService run in this process, as the agent runs them, and python_rank.py beside this
// file is the rank: it iterates DataLoaders through the shim's hooks and checks each case
// against stock DataLoader in the same process. Skipped (ctest: Skipped) when /usr/bin/python3
// has no torch or numpy; a probe that crashes or hangs fails (tests/support/python_probe.h).
#include <atomic>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/loader/contract.h"
#include "agent/loader/pool_supervisor.h"
#include "agent/loader/rank_service.h"
#include "tests/support/python_probe.h"
#include "tests/support/test_process.h"

extern char** environ;

namespace spawnpoint::loader {
namespace {

using ::testing::HasSubstr;

constexpr char kPython[] = "/usr/bin/python3";
const std::string kSource = SPAWNPOINT_SOURCE_DIR;
const std::string kPythonPath = kSource + "/agent/python:" + kSource + "/tests/loader";
const std::string kRank = kSource + "/tests/loader/python_rank.py";
// Workers and the rank import torch (seconds each on a loaded machine): generous deadlines.
constexpr std::chrono::seconds kDeadline(300);

class RankServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static const auto missing =
        testing::MissingPythonModules(kPython, {"torch", "numpy"}, std::chrono::seconds(120));
    ASSERT_TRUE(missing.ok()) << missing.status().ToString();
    if (!missing->empty()) {
      GTEST_SKIP() << kPython << " has no " << ::testing::PrintToString(*missing)
                   << "; install python3-torch (scripts/install-deps.sh) to test the Python "
                   << "loader pool";
    }
    PoolSpec spec;
    spec.workers = 2;
    spec.dir = dir_.File("pool");
    spec.argv = {kPython, "-m", "spawnpoint_rank.worker"};
    for (char** e = environ; *e; ++e) {
      const std::string var = *e;
      if (var.rfind("PYTHONPATH=", 0) != 0 && var.rfind("SPAWNPOINT_", 0) != 0) {
        spec.env.push_back(var);
      }
    }
    spec.env.push_back("PYTHONPATH=" + kPythonPath);
    auto pool = StandalonePool::Start(spec);
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    pool_ = std::move(pool).value();
    RankServiceOptions options{
        .dir = pool_->dir(), .pool_workers = 2, .log = [this](const std::string& line) {
          std::lock_guard<std::mutex> lock(log_mu_);
          log_ += line + "\n";
        }};
    if (GrowsTo() > 0) {
      options.max_workers = GrowsTo();
      // The agent grows a pool on the thread that spawned it (LoaderPools::Tick); here the
      // service's thread does, which outlives every worker it adds (it is joined after the
      // pool has been stopped and reaped).
      options.grow = [this](int workers) {
        ++grow_calls_;
        return pool_->pool().Grow(workers);
      };
    }
    auto service = RankPoolService::Start(std::move(options));
    ASSERT_TRUE(service.ok()) << service.status().ToString();
    service_ = std::move(service).value();
  }

  // Runs python_rank.py CASE as a rank of this pool; its exit code (stderr in the failure).
  int RunRank(const std::string& test_case) {
    testing::TestProcess rank({kPython, kRank, test_case, "--out", dir_.File("out")},
                              {{"PYTHONPATH", kPythonPath},
                               {"SPAWNPOINT_SHIM", "1"},
                               {"SPAWNPOINT_LOADER_SERVICE", ServiceSocketPath(pool_->dir())}});
    const int code = rank.Wait(kDeadline);
    stdout_ = rank.Stdout();
    stderr_ = rank.Stderr();
    return code;
  }

  std::string Report() {
    std::lock_guard<std::mutex> lock(log_mu_);
    return "rank stdout:\n" + stdout_ + "\nrank stderr:\n" + stderr_ + "\nservice:\n" + log_;
  }

  // Workers the pool may grow to; 0: it never grows.
  virtual int GrowsTo() const { return 0; }

  testing::TempDir dir_;
  std::unique_ptr<StandalonePool> pool_;
  std::unique_ptr<RankPoolService> service_;
  std::atomic<int> grow_calls_{0};
  std::string stdout_, stderr_;
  std::mutex log_mu_;
  std::string log_;
};

TEST_F(RankServiceTest, BatchesEqualStockDataLoaderOverEpochsAndAlternatingLoaders) {
  ASSERT_EQ(RunRank("equivalence"), 0) << Report();
  EXPECT_THAT(stdout_, HasSubstr("identical")) << Report();
  // The pool served what the rank iterated: train, validation, train again...
  EXPECT_GE(service_->sessions(), 3);
}

TEST_F(RankServiceTest, KeptBatchIsNeverOverwrittenAndAnExhaustedRingCopies) {
  ASSERT_EQ(RunRank("kept"), 0) << Report();
  EXPECT_EQ(testing::CountLines(stderr_, "batches are copied out of the ring"), 1) << Report();
}

TEST_F(RankServiceTest, DatasetExceptionReachesTheTrainerAndIterationGoesOn) {
  ASSERT_EQ(RunRank("error"), 0) << Report();
}

TEST_F(RankServiceTest, KilledWorkerIsReplacedAndEverySampleArrivesOnceInOrder) {
  ASSERT_EQ(RunRank("kill"), 0) << Report();
  EXPECT_GE(service_->Stats().restarts_died, 1) << Report();
}

TEST_F(RankServiceTest, WorkerHungPastTheTimeoutIsReplaced) {
  ASSERT_EQ(RunRank("hang"), 0) << Report();
  // The one worker that hung at sample 7, and no other (a starting worker is not hung).
  EXPECT_EQ(service_->Stats().restarts_hung, 1) << Report();
}

TEST_F(RankServiceTest, CrashLoopFailsTheIterationWithTheWorkersExitAndStderr) {
  ASSERT_EQ(RunRank("crash"), 0) << Report();
}

TEST_F(RankServiceTest, NonPersistentWorkersGetTheDatasetEachEpochAndEqualStock) {
  ASSERT_EQ(RunRank("nonpersistent"), 0) << Report();
  EXPECT_GE(service_->sessions(), 2);  // one iterator, so one session, per epoch
}

class GrowingRankServiceTest : public RankServiceTest {
 protected:
  int GrowsTo() const override { return 3; }
};

TEST_F(GrowingRankServiceTest, ADataLoaderAskingForMoreWorkersGrowsThePoolAndEqualsStock) {
  ASSERT_EQ(RunRank("grow"), 0) << Report();
  EXPECT_EQ(grow_calls_.load(), 1) << Report();  // the second epoch finds 3 workers
  EXPECT_EQ(pool_->pool().Size(), 3);
  EXPECT_THAT(Report(), HasSubstr("asks for 3 workers, the pool has 2: it grows to 3"));
  EXPECT_EQ(service_->Stats().pool_workers, 3);
}

TEST_F(GrowingRankServiceTest, ADataLoaderAskingForMoreThanThePoolMayGrowToFallsBack) {
  ASSERT_EQ(RunRank("fallback4"), 0) << Report();
  EXPECT_EQ(grow_calls_.load(), 0) << Report();
  EXPECT_THAT(stderr_, HasSubstr("asks for 4 workers; the agent's pool for this rank has 2 and "
                                 "may grow to 3"))
      << Report();
}

TEST_F(RankServiceTest, WhatThePoolCannotServeFallsBackSayingWhy) {
  ASSERT_EQ(RunRank("fallback"), 0) << Report();
  EXPECT_THAT(stderr_, HasSubstr("IterableDataset")) << Report();
  EXPECT_THAT(stderr_, HasSubstr("asks for 3 workers")) << Report();
}

// Leaving an epoch after its first batch drops the rest of its window: batches already
// built and sent to the rank give their slots back with the Drop, so after 30 such epochs
// the ring is as free as before (no batch needs copying, nothing waits for a slot).
TEST_F(RankServiceTest, EpochsLeftEarlyGiveTheirSlotsBack) {
  ASSERT_EQ(RunRank("early_break"), 0) << Report();
  EXPECT_THAT(stdout_, HasSubstr("30 epochs left early")) << Report();
  EXPECT_EQ(testing::CountLines(stderr_, "batches are copied out of the ring"), 0) << Report();
}

// Open carries the first window (but batch 0, which the rank built itself, and whose size
// sizes the ring): the service submits it as soon as the ring exists, so the first Task does
// not wait for a round trip to the rank.
TEST_F(RankServiceTest, TheFirstWindowTravelsWithOpen) {
  ASSERT_EQ(RunRank("open_window"), 0) << Report();
  EXPECT_THAT(stdout_, HasSubstr("the first 4 batches went with Open")) << Report();
}

TEST_F(RankServiceTest, StatisticsCountWhatTheRankConsumed) {
  ASSERT_EQ(RunRank("pids"), 0) << Report();
  // The rank reports what it consumed with each request; stats.json follows within a second.
  ASSERT_TRUE(
      testing::WaitUntil([&] { return service_->Stats().batches >= 3; }, std::chrono::seconds(10)))
      << service_->Stats().ToJson().dump();
  EXPECT_TRUE(testing::WaitUntil(
      [&] {
        auto j = nlohmann::json::parse(testing::ReadFile(StatsPath(pool_->dir())), nullptr, false);
        return !j.is_discarded() && j.value("batches", 0) >= 3;
      },
      std::chrono::seconds(10)));
}

}  // namespace
}  // namespace spawnpoint::loader
