// HangClock on given times and readings: a worker's time waiting for a CPU does not count
// toward its timeout, up to the ceiling; without readings it is the plain wall-clock timeout.
// And ReadProcessTimes / ParseRunDelay on this process.
#include "agent/loader/hang_clock.h"

#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace spawnpoint::loader {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr milliseconds kTimeout = seconds(8);  // looks every second
const Clock::TimePoint kSince = Clock::TimePoint(seconds(1000));

// Looks at every NextLook up to `until` with the reading `wait(t)`; returns the first time
// the clock is Overdue, or nullopt.
template <typename F>
std::optional<Clock::TimePoint> FirstOverdue(HangClock& clock, Clock::TimePoint until, F wait,
                                             pid_t pid = 7, bool started_since = false) {
  for (Clock::TimePoint t = clock.NextLook(kTimeout); t <= until; t = clock.NextLook(kTimeout)) {
    clock.Look(t, pid, wait(t), started_since);
    if (clock.Overdue(t, kTimeout)) return t;
  }
  return std::nullopt;
}

TEST(HangClock, WithoutReadingsItIsTheWallClockTimeout) {
  HangClock clock;
  clock.Restart(kSince);
  auto overdue = FirstOverdue(clock, kSince + seconds(100),
                              [](Clock::TimePoint) { return std::optional<Clock::Duration>(); });
  ASSERT_TRUE(overdue.has_value());
  EXPECT_EQ(*overdue, kSince + kTimeout);
  EXPECT_EQ(clock.Credit(), Clock::Duration{0});
  EXPECT_EQ(clock.Note(*overdue, kTimeout), "");
}

TEST(HangClock, AWorkerThatNeverWaitsForACpuIsOverdueAtTheTimeout) {
  HangClock clock;
  clock.Restart(kSince);
  auto overdue = FirstOverdue(clock, kSince + seconds(100), [](Clock::TimePoint) {
    return std::optional(Clock::Duration(seconds(3)));
  });
  ASSERT_TRUE(overdue.has_value());
  EXPECT_EQ(*overdue, kSince + kTimeout);
}

// Starved 3/4 of the time from the first look on (the first second is the baseline): the
// uncredited time reaches 8 s at 1 + 7 x 4 = 29 s, not at 8 s.
TEST(HangClock, TimeWaitingForACpuIsNotCounted) {
  HangClock clock;
  clock.Restart(kSince);
  auto starved = [](Clock::TimePoint t) {
    return std::optional<Clock::Duration>(seconds(50) + (t - kSince) * 3 / 4);
  };
  for (Clock::TimePoint t = clock.NextLook(kTimeout); t <= kSince + seconds(28);
       t = clock.NextLook(kTimeout)) {
    clock.Look(t, 7, starved(t), false);
    EXPECT_FALSE(clock.Overdue(t, kTimeout)) << "at " << (t - kSince).count() << " ns";
  }
  EXPECT_FALSE(clock.Overdue(kSince + seconds(10), kTimeout));
  auto overdue = FirstOverdue(clock, kSince + seconds(100), starved);
  ASSERT_TRUE(overdue.has_value());
  // Looks come closer as the limit nears, but never closer than 1/64 of the timeout.
  EXPECT_GE(*overdue, kSince + seconds(29));
  EXPECT_LE(*overdue, kSince + seconds(29) + kTimeout / 64);
  EXPECT_GE(clock.Unstarved(*overdue), kTimeout);
  EXPECT_GE(clock.Credit(), seconds(21));
  EXPECT_THAT(clock.Note(*overdue, kTimeout),
              AllOf(HasSubstr(" (not counting 21."), HasSubstr(" s it waited for a CPU)")));
  EXPECT_THAT(clock.Note(*overdue, kTimeout), Not(HasSubstr("limit")));
}

// A worker that gets no CPU at all is killed at 10 timeouts of wall time, not before.
TEST(HangClock, TheCeilingEndsTheCreditHoweverStarved) {
  HangClock clock;
  clock.Restart(kSince);
  auto overdue = FirstOverdue(clock, kSince + seconds(1000), [](Clock::TimePoint t) {
    return std::optional<Clock::Duration>(t - kSince);
  });
  ASSERT_TRUE(overdue.has_value());
  EXPECT_EQ(*overdue, kSince + HangClock::kCeilingTimeouts * kTimeout);
  EXPECT_FALSE(clock.Overdue(*overdue - milliseconds(1), kTimeout));
  EXPECT_TRUE(clock.AtCeiling(*overdue, kTimeout));
  EXPECT_THAT(clock.Note(*overdue, kTimeout), HasSubstr("at the limit of 10 timeouts"));
}

// Threads summed can wait longer than the wall time: never more credit than that.
TEST(HangClock, CreditNeverExceedsTheWallTime) {
  HangClock clock;
  clock.Restart(kSince);
  clock.Look(kSince + seconds(1), 7, seconds(0), false);
  clock.Look(kSince + seconds(9), 7, seconds(40), false);
  EXPECT_EQ(clock.Credit(), seconds(9));
  EXPECT_EQ(clock.Unstarved(kSince + seconds(9)), Clock::Duration{0});
}

// A process that started after the wait did: all its CPU wait is in the wait. One that was
// there before: only what it waited from its first reading on. A reading that drops (a
// thread exited) credits nothing and is the new baseline.
TEST(HangClock, APidFirstSeenIsABaselineUnlessItStartedSinceTheWaitDid) {
  HangClock successor;
  successor.Restart(kSince);
  successor.Look(kSince + seconds(1), 9, seconds(1), /*started_since=*/true);
  EXPECT_EQ(successor.Credit(), seconds(1));

  HangClock older;
  older.Restart(kSince);
  older.Look(kSince + seconds(1), 9, seconds(100), /*started_since=*/false);
  EXPECT_EQ(older.Credit(), Clock::Duration{0});
  older.Look(kSince + seconds(2), 9, seconds(101), false);
  EXPECT_EQ(older.Credit(), seconds(1));
  older.Look(kSince + seconds(3), 9, seconds(50), false);  // a thread gone
  EXPECT_EQ(older.Credit(), seconds(1));
  older.Look(kSince + seconds(4), 9, seconds(51), false);
  EXPECT_EQ(older.Credit(), seconds(2));
  older.Look(kSince + seconds(5), 10, seconds(80), false);  // another process: a baseline
  EXPECT_EQ(older.Credit(), seconds(2));
  older.Look(kSince + seconds(6), 10, std::nullopt, false);  // unreadable: nothing
  older.Look(kSince + seconds(7), 10, seconds(81), false);
  EXPECT_EQ(older.Credit(), seconds(3));

  older.Restart(kSince + seconds(10));
  EXPECT_EQ(older.Credit(), Clock::Duration{0});
  EXPECT_EQ(older.NextLook(kTimeout), kSince + seconds(11));
}

// Looks come every eighth of the timeout, sooner when the uncredited time or the ceiling
// could reach its limit before that.
TEST(HangClock, NextLookIsNoLaterThanTheUncreditedTimeCouldReachTheTimeout) {
  HangClock clock;
  clock.Restart(kSince);
  EXPECT_EQ(clock.NextLook(kTimeout), kSince + seconds(1));
  clock.Look(kSince + seconds(1), 7, seconds(0), false);
  EXPECT_EQ(clock.NextLook(kTimeout), kSince + seconds(2));
  clock.Look(kSince + milliseconds(7500), 7, seconds(0), false);
  EXPECT_EQ(clock.NextLook(kTimeout), kSince + kTimeout);
  clock.Look(kSince + milliseconds(75500), 7, seconds(74), false);  // uncredited 1.5 s
  EXPECT_EQ(clock.NextLook(kTimeout), kSince + milliseconds(76500));
  clock.Look(kSince + milliseconds(79500), 7, seconds(78), false);
  EXPECT_EQ(clock.NextLook(kTimeout), kSince + seconds(80));  // the ceiling
  // Without credit the look is at the timeout exactly, however close the last one was.
  clock.Restart(kSince);
  clock.Look(kSince + seconds(1), 7, seconds(0), false);
  clock.Look(kSince + milliseconds(7950), 7, seconds(0), false);
  EXPECT_EQ(clock.NextLook(kTimeout), kSince + kTimeout);
  // With credit, never closer than 1/64 of the timeout; and every 1/64 once overdue (a
  // worker spared while still starting).
  clock.Look(kSince + milliseconds(7950), 7, milliseconds(50), false);  // uncredited 7.9 s
  EXPECT_EQ(clock.NextLook(kTimeout), kSince + milliseconds(8075));
  clock.Look(kSince + seconds(9), 7, milliseconds(50), false);
  EXPECT_EQ(clock.NextLook(kTimeout), kSince + milliseconds(9125));
}

TEST(ParseRunDelay, TheSecondFieldInNanoseconds) {
  EXPECT_EQ(ParseRunDelay("797764 1234567 12\n"), std::chrono::nanoseconds(1234567));
  EXPECT_EQ(ParseRunDelay(""), std::nullopt);
  EXPECT_EQ(ParseRunDelay("12 x 3"), std::nullopt);
}

TEST(ReadProcessTimes, ThisProcessIsReadAndANonexistentOneIsNot) {
  std::ifstream in("/proc/self/schedstat");
  const std::string main_thread((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  auto times = ReadProcessTimes(getpid());
  ASSERT_TRUE(times.has_value());
  EXPECT_GE(times->age, Clock::Duration{0});
  if (auto main_wait = ParseRunDelay(main_thread)) {  // a kernel with schedstats
    ASSERT_TRUE(times->cpu_wait.has_value());
    EXPECT_GE(*times->cpu_wait, *main_wait);  // all threads, read after the main one's
  }
  EXPECT_FALSE(ReadProcessTimes(0).has_value());
  EXPECT_FALSE(ReadProcessTimes(-1).has_value());
}

}  // namespace
}  // namespace spawnpoint::loader
