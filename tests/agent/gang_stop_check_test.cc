// GangStopCheck on simulated time: the coordinator's stop stops the ranks at once, unless a
// rank of this node is already dying by itself; then its own failure is waited for, for at
// most the dying wait; so is a rank whose traceback came shortly before the stop. One case
// with a real zombie, through the /proc reading the agent uses.
#include "agent/run/gang_stop_check.h"

#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <set>

#include "agent/supervisor/process_table.h"

namespace spawnpoint::agent {
namespace {

using std::chrono::milliseconds;
constexpr auto kRun = GangStopCheck::Verdict::kRun;
constexpr auto kAwait = GangStopCheck::Verdict::kAwaitTheDying;
constexpr auto kStop = GangStopCheck::Verdict::kStop;

class GangStopCheckTest : public ::testing::Test {
 protected:
  GangStopCheck Make() {
    return GangStopCheck(
        &clock_, [this] { return stop_; }, [this](pid_t pid) { return dying_.count(pid) > 0; });
  }
  SimulatedClock clock_;
  bool stop_ = false;
  std::set<pid_t> dying_;
  const std::vector<std::pair<int, pid_t>> ranks_{{2, 1002}, {3, 1003}};
};

TEST_F(GangStopCheckTest, NoStopNoMatterHowLong) {
  GangStopCheck check = Make();
  EXPECT_EQ(check.Check(ranks_), kRun);
  clock_.Advance(std::chrono::hours(1));
  EXPECT_EQ(check.Check(ranks_), kRun);
}

TEST_F(GangStopCheckTest, TheCoordinatorsStopStopsHealthyRanksAtOnce) {
  GangStopCheck check = Make();
  stop_ = true;
  EXPECT_EQ(kStop, check.Check(ranks_));
  EXPECT_EQ(kStop, check.Check({}));  // nothing left to wait for
}

TEST_F(GangStopCheckTest, ARankAlreadyDyingByItselfIsWaitedForNotCalledStopped) {
  GangStopCheck check = Make();
  stop_ = true;
  dying_.insert(1003);
  EXPECT_EQ(check.Check(ranks_), kAwait);
  clock_.Advance(GangStopCheck::kDyingWait - milliseconds(1));
  EXPECT_EQ(check.Check(ranks_), kAwait) << "the Gang reaps it and reports its own failure";
  // Reaped (the Gang stops asking once it has a failure); had it not been, the others
  // stop now that it no longer runs.
  EXPECT_EQ(kStop, check.Check({{2, 1002}}));
}

TEST_F(GangStopCheckTest, ARankStuckInItsExitIsNotWaitedForPastTheDyingWait) {
  GangStopCheck check = Make();
  stop_ = true;
  dying_.insert(1002);
  EXPECT_EQ(check.Check(ranks_), kAwait);
  clock_.Advance(GangStopCheck::kDyingWait);
  EXPECT_EQ(kStop, check.Check(ranks_));
}

TEST_F(GangStopCheckTest, TheDyingWaitRunsFromTheStopNotFromTheAttemptsStart) {
  GangStopCheck check = Make();
  dying_.insert(1002);
  EXPECT_EQ(check.Check(ranks_), kRun);
  clock_.Advance(std::chrono::seconds(10));  // no stop yet: a dying rank is the Gang's to reap
  stop_ = true;
  EXPECT_EQ(check.Check(ranks_), kAwait);
  clock_.Advance(GangStopCheck::kDyingWait);
  EXPECT_EQ(kStop, check.Check(ranks_));
}

// A Python rank that printed an uncaught exception's traceback is finalizing, not yet exiting
// in the kernel's sense: a traceback shortly before the stop (or after it) holds the stop.
TEST_F(GangStopCheckTest, ATracebackShortlyBeforeTheStopIsWaitedForAsTheRanksOwnFailure) {
  GangStopCheck check = Make();
  check.NoteTraceback(1003);
  clock_.Advance(GangStopCheck::kRecentTraceback);
  stop_ = true;
  EXPECT_EQ(check.Check(ranks_), kAwait);
  clock_.Advance(GangStopCheck::kDyingWait - milliseconds(1));
  EXPECT_EQ(check.Check(ranks_), kAwait);
  clock_.Advance(milliseconds(1));
  EXPECT_EQ(kStop, check.Check(ranks_)) << "a rank that never exits is stopped all the same";
}

TEST_F(GangStopCheckTest, ATracebackAfterTheStopWasSeenHoldsItToo) {
  GangStopCheck check = Make();
  stop_ = true;
  dying_.insert(1003);
  EXPECT_EQ(check.Check(ranks_), kAwait);
  clock_.Advance(milliseconds(100));
  check.NoteTraceback(1002);  // while the stop waits for rank 3, rank 2 fails too
  EXPECT_EQ(check.Check({{2, 1002}}), kAwait) << "rank 3 is reaped; rank 2 is waited for";
  clock_.Advance(GangStopCheck::kDyingWait - milliseconds(100));
  EXPECT_EQ(kStop, check.Check({{2, 1002}})) << "the wait runs from the stop, once";
}

TEST_F(GangStopCheckTest, AnOldTracebackOrOneOfARankNoLongerRunningDoesNotHoldTheStop) {
  GangStopCheck check = Make();
  check.NoteTraceback(1002);  // handled long ago: the trainer went on
  clock_.Advance(GangStopCheck::kRecentTraceback + milliseconds(1));
  check.NoteTraceback(1009);  // a rank already reaped: its failure is the Gang's
  stop_ = true;
  EXPECT_EQ(kStop, check.Check(ranks_));
}

TEST_F(GangStopCheckTest, AnUnreapedZombieCountsAsDyingThroughProc) {
  char arg0[] = "true";
  char* argv[] = {arg0, nullptr};
  pid_t zombie = 0;
  ASSERT_EQ(posix_spawn(&zombie, "/bin/true", nullptr, nullptr, argv, environ), 0);
  siginfo_t info{};
  // Waits for its exit without reaping it: it stays a zombie until waitpid below.
  ASSERT_EQ(waitid(P_PID, zombie, &info, WEXITED | WNOWAIT), 0);
  pid_t self = getpid();
  GangStopCheck check(
      &clock_, [] { return true; }, [](pid_t pid) { return ProcessIsExiting(pid); });
  EXPECT_EQ(check.Check({{0, self}, {1, zombie}}), kAwait);
  EXPECT_EQ(kStop, check.Check({{0, self}})) << "this test's own process is not exiting";
  int status = 0;
  ASSERT_EQ(waitpid(zombie, &status, 0), zombie);
}

}  // namespace
}  // namespace spawnpoint::agent
