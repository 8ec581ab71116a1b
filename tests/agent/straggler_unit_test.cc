// Straggler judgement (api/straggler.h) and StragglerWatch on simulated ranks: own work per
// step is the duration minus the wait for peers; a rank is named once its ratio has held for
// a whole window, cleared below the halfway ratio, ordinary pauses name nobody, and twice the
// work per step is reported in the straggler tests' band of 2 under any load.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <random>

#include "agent/run/straggler_watch.h"
#include "api/straggler.h"
#include "tests/agent/sim_rank.h"
#include "tests/support/straggler_band.h"

namespace spawnpoint::agent {
namespace {

constexpr int kWindow = api::kStragglerWindowSteps;

TEST(StragglerJudgementTest, TheSlowestAgainstTheMedianOfTheOthers) {
  auto j = api::JudgeSlowest({0.1, 0.2});
  ASSERT_TRUE(j);
  EXPECT_EQ(j->index, 1u);
  EXPECT_DOUBLE_EQ(j->ratio, 2.0);
  EXPECT_DOUBLE_EQ(j->peers_busy_seconds, 0.1);
  // Of four, the others' median is not dragged up by the slowest itself.
  j = api::JudgeSlowest({0.1, 0.12, 0.3, 0.08});
  ASSERT_TRUE(j);
  EXPECT_EQ(j->index, 2u);
  EXPECT_DOUBLE_EQ(j->ratio, 3.0);
  EXPECT_FALSE(api::JudgeSlowest({0.1}));
  EXPECT_FALSE(api::JudgeSlowest({}));
  EXPECT_FALSE(api::JudgeSlowest({0.0, 0.0}));  // nothing measurable
}

TEST(StragglerJudgementTest, ThresholdHysteresisAndAMinimumExcess) {
  api::StragglerJudgement j{
      .index = 0, .ratio = 1.3, .busy_seconds = 0.13, .peers_busy_seconds = 0.1};
  EXPECT_FALSE(api::IsStraggler(j, 1.5, /*named=*/false));
  EXPECT_TRUE(api::IsStraggler(j, 1.5, /*named=*/true));  // stays down to 1.25
  j.ratio = 1.2;
  EXPECT_FALSE(api::IsStraggler(j, 1.5, true));
  // Microsecond steps: 4x, but 300 us of difference is noise.
  api::StragglerJudgement tiny{
      .index = 0, .ratio = 4, .busy_seconds = 0.0004, .peers_busy_seconds = 0.0001};
  EXPECT_FALSE(api::IsStraggler(tiny, 1.5, false));
}

// Two ranks in step: rank 1 works 200 ms per step, rank 0 100 ms and then waits 100 ms for
// it, so both steps last 200 ms.
void SynchronousStep(SimRank& fast, SimRank& slow, int64_t fast_work, int64_t slow_work) {
  const int64_t step = std::max(fast_work, slow_work) + 2 * kMs;  // + the allreduce itself
  fast.Step(step, step - fast_work);
  slow.Step(step, step - slow_work);
}

TEST(StragglerWatchTest, NamedOnceTheRatioHeldForAWholeWindowThenClearedWhenItCatchesUp) {
  StragglerWatch watch(1.5);
  SimRank a{.rank = 0}, b{.rank = 1};
  int named_at = -1;
  for (int i = 1; i <= 3 * kWindow; ++i) {
    SynchronousStep(a, b, 100 * kMs, 200 * kMs);
    const auto v = watch.Check({a.Progress(), b.Progress()});
    if (v.straggler && named_at < 0) {
      named_at = i;
      EXPECT_TRUE(v.changed);
      EXPECT_EQ(v.straggler->rank, 1);
      EXPECT_NEAR(v.straggler->judgement.ratio, 2.0, 0.01);
      EXPECT_NEAR(v.straggler->judgement.busy_seconds, 0.2, 0.001);
      EXPECT_NEAR(v.straggler->judgement.peers_busy_seconds, 0.1, 0.001);
    } else if (named_at > 0) {
      EXPECT_TRUE(v.straggler) << i;
      EXPECT_FALSE(v.changed) << i;
    }
  }
  // A full window (step 20) makes it a candidate; it is named a window later.
  EXPECT_EQ(named_at, 2 * kWindow);
  EXPECT_NEAR(watch.Ratio(), 2.0, 0.01);

  bool cleared = false;
  for (int i = 0; i < kWindow && !cleared; ++i) {
    SynchronousStep(a, b, 100 * kMs, 100 * kMs);
    const auto v = watch.Check({a.Progress(), b.Progress()});
    if (!v.straggler) {
      EXPECT_TRUE(v.changed);
      cleared = true;
    }
  }
  EXPECT_TRUE(cleared);
}

TEST(StragglerWatchTest, ASlowSpellShorterThanAWindowNamesNobody) {
  StragglerWatch watch(1.5);
  SimRank a{.rank = 0}, b{.rank = 1};
  for (int i = 0; i < 2 * kWindow; ++i) SynchronousStep(a, b, 100 * kMs, 100 * kMs);
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < kWindow - 2; ++i) {  // slow for most of a window...
      SynchronousStep(a, b, 100 * kMs, 300 * kMs);
      EXPECT_FALSE(watch.Check({a.Progress(), b.Progress()}).straggler);
    }
    for (int i = 0; i < kWindow; ++i) {  // ...then back
      SynchronousStep(a, b, 100 * kMs, 100 * kMs);
      EXPECT_FALSE(watch.Check({a.Progress(), b.Progress()}).straggler);
    }
  }
}

TEST(StragglerWatchTest, WithoutMeasuredWaitsEqualStepsNameNobody) {
  StragglerWatch watch(1.5);
  SimRank a{.rank = 0}, b{.rank = 1};
  for (int i = 0; i < 5 * kWindow; ++i) {
    a.Step(200 * kMs);  // a trainer that marks no waits: both look alike
    b.Step(200 * kMs);
    EXPECT_FALSE(watch.Check({a.Progress(), b.Progress()}).straggler);
  }
  EXPECT_NEAR(watch.Ratio(), 1.0, 1e-9);
  // One rank alone cannot be compared.
  StragglerWatch alone(1.5);
  EXPECT_FALSE(alone.Check({a.Progress()}).straggler);
  EXPECT_EQ(alone.Ratio(), 0);
  const auto medians = BusyMedians({a.Progress(), SimRank{.rank = 7}.Progress()});
  ASSERT_EQ(medians.size(), 2u);
  EXPECT_NEAR(*medians[0].busy_seconds, 0.2, 1e-9);
  EXPECT_FALSE(medians[1].busy_seconds);  // no window yet
}

// What the straggler tests on real ranks rely on (tests/support/straggler_band.h), on a
// simulated clock: rank 1 does the same unit of work (50 ms of sleep, then compute) twice per
// step, rank 0 once and then waits for it. Load stretches every unit's compute by the load
// factor, and each unit's wake-up is late by up to 10 ms (drawn per rank and unit, so the
// ranks are not delayed alike); the step's own overhead (the optimizer step, the record) is
// not doubled. Whatever the load, the reported ratio stays in the band of 2 units to 1.
TEST(StragglerWatchTest, TwiceTheUnitsOfWorkIsReportedInTheBandOfTwoUnderAnyLoad) {
  std::mt19937 random(38);
  std::uniform_int_distribution<int64_t> late(0, 10 * kMs);
  for (const int64_t load : {1, 2, 4, 8, 16}) {
    StragglerWatch watch(1.5);
    SimRank a{.rank = 0}, b{.rank = 1};
    auto unit = [&] { return 50 * kMs + load * 1 * kMs + late(random); };
    std::optional<Straggler> named;
    for (int i = 0; i < 3 * kWindow; ++i) {
      const int64_t overhead = load * 1 * kMs;
      const int64_t fast = unit() + overhead;
      const int64_t slow = unit() + unit() + overhead;
      SynchronousStep(a, b, fast, slow);
      const auto v = watch.Check({a.Progress(), b.Progress()});
      if (v.straggler) named = v.straggler;
    }
    ASSERT_TRUE(named) << "load " << load;
    EXPECT_EQ(named->rank, 1);
    EXPECT_GE(named->judgement.ratio, spawnpoint::testing::StragglerBandLow(2)) << load;
    EXPECT_LE(named->judgement.ratio, spawnpoint::testing::StragglerBandHigh(2)) << load;
    EXPECT_GE(watch.Ratio(), spawnpoint::testing::StragglerBandLow(2)) << load;
    EXPECT_LE(watch.Ratio(), spawnpoint::testing::StragglerBandHigh(2)) << load;
  }
}

// Issue 13's "no false alarm" for stragglers: epoch boundaries and validation passes slow
// every rank alike, and a checkpoint written by rank 0 makes one of its steps long (rank 1
// waits for it); none of them names a straggler.
TEST(StragglerWatchTest, EpochBoundariesValidationAndCheckpointsNameNobody) {
  StragglerWatch watch(1.5);
  SimRank a{.rank = 0}, b{.rank = 1};
  for (int epoch = 0; epoch < 4; ++epoch) {
    for (int i = 0; i < 50; ++i) {
      if (i == 0) {
        SynchronousStep(a, b, 500 * kMs, 500 * kMs);  // the loader's next epoch
      } else if (i == 30) {
        SynchronousStep(a, b, 1'100 * kMs, 1'000 * kMs);  // validation: 10 steps' work
      } else if (i == 45) {
        SynchronousStep(a, b, 25 * kS, 100 * kMs);  // rank 0 writes a checkpoint
      } else {
        SynchronousStep(a, b, 100 * kMs, 105 * kMs);
      }
      EXPECT_FALSE(watch.Check({a.Progress(), b.Progress()}).straggler) << epoch << " " << i;
    }
  }
}

}  // namespace
}  // namespace spawnpoint::agent
