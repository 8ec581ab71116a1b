// When StandbyRanks prepares a standby (issue 36), on a simulated clock: not while the
// running attempt's rank is still starting (its imports would compete with the rank's), but
// once that rank has written its modules file (at its first step), or kPrepareAfter after
// Expect() for a rank that never does. The standbys are real processes (/bin/sleep in the
// rank's place), killed by Stop() and reaped here.
#include <sys/wait.h>

#include <gtest/gtest.h>

#include "agent/run/standby_rank.h"
#include "common/clock.h"
#include "tests/support/test_process.h"

namespace spawnpoint::agent {
namespace {

// Records each spawn and runs a sleeper in the standby's place.
class SleeperSpawner : public ProcessSpawner {
 public:
  StatusOr<pid_t> Spawn(const SpawnOptions& options) override {
    SpawnOptions child = options;
    child.argv = {"/bin/sleep", "300"};
    StatusOr<pid_t> pid = real_->Spawn(child);
    if (pid.ok()) pids.push_back(*pid);
    return pid;
  }
  std::vector<pid_t> pids;

 private:
  std::unique_ptr<ProcessSpawner> real_ = MakeVforkSpawner();
};

SpawnOptions PythonRank(int rank) {
  SpawnOptions o;
  o.argv = {"/usr/bin/python3", "train.py"};
  o.env = {"SPAWNPOINT_SHIM=1", "RANK=" + std::to_string(rank), "PATH=/usr/bin:/bin"};
  return o;
}

class StandbyRanksTest : public ::testing::Test {
 protected:
  void TearDown() override {
    standbys_.Stop();
    for (pid_t pid : spawner_.pids) ::waitpid(pid, nullptr, 0);
  }

  SimulatedClock clock_;
  SleeperSpawner spawner_;
  spawnpoint::testing::TempDir dir_;
  std::vector<std::string> said_;
  StandbyRanks standbys_{&spawner_, &clock_, dir_.path(),
                         [this](const std::string& line) { said_.push_back(line); }};
};

TEST_F(StandbyRanksTest, PreparedOnceTheRankHasWrittenItsModules) {
  standbys_.Expect({{0, PythonRank(0)}, {1, PythonRank(1)}});
  standbys_.Tick();
  clock_.Advance(StandbyRanks::kPrepareAfter - std::chrono::seconds(1));
  standbys_.Tick();
  EXPECT_TRUE(spawner_.pids.empty()) << "the running ranks are still starting";
  spawnpoint::testing::WriteFile(standbys_.ModulesFile(1), "torch\n");  // rank 1's first step
  standbys_.Tick();
  ASSERT_EQ(spawner_.pids.size(), 1u);
  EXPECT_EQ(standbys_.Pids(), std::vector<pid_t>{spawner_.pids[0]});
  standbys_.Tick();
  EXPECT_EQ(spawner_.pids.size(), 1u) << "one standby per rank";
}

TEST_F(StandbyRanksTest, AModulesFileOfAnEarlierAttemptIsNotAFirstStep) {
  spawnpoint::testing::WriteFile(standbys_.ModulesFile(0), "torch\n");  // the last attempt's
  standbys_.Expect({{0, PythonRank(0)}});
  standbys_.Tick();
  EXPECT_TRUE(spawner_.pids.empty());
}

TEST_F(StandbyRanksTest, PreparedAfterAMinuteForARankThatNeverSteps) {
  standbys_.Expect({{0, PythonRank(0)}});
  clock_.Advance(StandbyRanks::kPrepareAfter);
  standbys_.Tick();
  EXPECT_EQ(spawner_.pids.size(), 1u);
}

TEST_F(StandbyRanksTest, NoStandbyForARankThatIsNotPython) {
  SpawnOptions native = PythonRank(0);
  native.argv = {"/opt/trainer"};
  standbys_.Expect({{0, native}});
  clock_.Advance(StandbyRanks::kPrepareAfter);
  standbys_.Tick();
  EXPECT_TRUE(spawner_.pids.empty());
}

}  // namespace
}  // namespace spawnpoint::agent
