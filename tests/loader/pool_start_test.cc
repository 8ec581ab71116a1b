// PoolSpec::start_concurrency on real processes: the pool's workers do their start-up work
// in turns, each handing the next its turn by closing a descriptor (contract.h). The
// workers here are small shell scripts that log what they see and do, so the turns are
// observed without torch and without timing: a worker whose turn has not come cannot log.
#include <signal.h>

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/loader/contract.h"
#include "agent/loader/pool_supervisor.h"
#include "tests/support/test_process.h"

extern char** environ;

namespace spawnpoint::loader {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr std::chrono::seconds kDeadline(30);

// A worker that waits for its turn (reads the turn descriptor to end of file), logs
// "<id> begin turn=<fd> started=<fd>", waits for the file go-<id> in its directory, logs
// "<id> done", closes its started descriptor and stays up.
constexpr char kWorkerScript[] = R"(
log="$POOL_TEST_DIR/log"
if [ -n "$SPAWNPOINT_LOADER_TURN_FD" ]; then cat <&4 >/dev/null; fi
echo "$SPAWNPOINT_LOADER_WORKER_ID begin turn=$SPAWNPOINT_LOADER_TURN_FD started=$SPAWNPOINT_LOADER_STARTED_FD" >> "$log"
while [ ! -e "$POOL_TEST_DIR/go-$SPAWNPOINT_LOADER_WORKER_ID" ]; do sleep 0.01; done
echo "$SPAWNPOINT_LOADER_WORKER_ID done" >> "$log"
if [ -n "$SPAWNPOINT_LOADER_STARTED_FD" ]; then exec 5>&-; fi
exec sleep 600
)";

class PoolStartTest : public ::testing::Test {
 protected:
  void Start(int workers, int concurrency) {
    PoolSpec spec;
    spec.workers = workers;
    spec.start_concurrency = concurrency;
    spec.dir = dir_.File("pool");
    spec.argv = {"/bin/sh", "-c", kWorkerScript};
    for (char** e = environ; *e; ++e) spec.env.push_back(*e);
    spec.env.push_back("POOL_TEST_DIR=" + dir_.path());
    auto pool = StandalonePool::Start(spec, std::chrono::milliseconds(200));
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    pool_ = std::move(pool).value();
  }

  std::vector<std::string> Log() const {
    std::vector<std::string> lines;
    std::string text = testing::ReadFile(dir_.File("log"));
    for (size_t at = 0; at < text.size();) {
      const size_t end = text.find('\n', at);
      lines.push_back(text.substr(at, end - at));
      at = end == std::string::npos ? text.size() : end + 1;
    }
    return lines;
  }
  bool Logged(const std::string& line) const {
    for (const std::string& l : Log()) {
      if (l == line) return true;
    }
    return false;
  }
  void Go(int worker) { testing::WriteFile(dir_.File("go-" + std::to_string(worker)), ""); }

  testing::TempDir dir_;
  std::unique_ptr<StandalonePool> pool_;
};

TEST_F(PoolStartTest, EachWorkerBeginsWhenThePreviousOneHasStarted) {
  Start(3, 1);
  ASSERT_TRUE(testing::WaitUntil([&] { return Logged("0 begin turn= started=5"); }, kDeadline))
      << testing::ReadFile(dir_.File("log"));
  Go(0);
  ASSERT_TRUE(testing::WaitUntil([&] { return Logged("1 begin turn=4 started=5"); }, kDeadline));
  Go(1);
  ASSERT_TRUE(testing::WaitUntil([&] { return Logged("2 begin turn=4 started="); }, kDeadline));
  Go(2);
  ASSERT_TRUE(testing::WaitUntil([&] { return Logged("2 done"); }, kDeadline));
  // Worker w began only once worker w - 1 was done.
  EXPECT_THAT(Log(), ElementsAre("0 begin turn= started=5", "0 done", "1 begin turn=4 started=5",
                                 "1 done", "2 begin turn=4 started=", "2 done"));
}

TEST_F(PoolStartTest, TwoAtATimeAndAWorkerThatDiesHandsOnItsTurn) {
  Start(4, 2);
  ASSERT_TRUE(testing::WaitUntil(
      [&] { return Logged("0 begin turn= started=5") && Logged("1 begin turn= started=5"); },
      kDeadline))
      << testing::ReadFile(dir_.File("log"));
  // Worker 1 dies before it is done: worker 3, which waits for it, begins all the same.
  const pid_t one = pool_->Pids().at(1);
  ASSERT_EQ(kill(one, SIGKILL), 0);
  ASSERT_TRUE(testing::WaitUntil([&] { return Logged("3 begin turn=4 started="); }, kDeadline))
      << testing::ReadFile(dir_.File("log"));
  // Worker 2 still waits for worker 0; the respawned worker 1 waits for no one.
  ASSERT_TRUE(testing::WaitUntil([&] { return Logged("1 begin turn= started="); }, kDeadline))
      << testing::ReadFile(dir_.File("log"));
  EXPECT_FALSE(Logged("2 begin turn=4 started="));
  Go(0);
  ASSERT_TRUE(testing::WaitUntil([&] { return Logged("2 begin turn=4 started="); }, kDeadline));
}

TEST_F(PoolStartTest, WithoutAConcurrencyEveryWorkerBeginsAtOnce) {
  Start(2, 0);
  EXPECT_TRUE(testing::WaitUntil(
      [&] { return Logged("0 begin turn= started=") && Logged("1 begin turn= started="); },
      kDeadline))
      << testing::ReadFile(dir_.File("log"));
}

}  // namespace
}  // namespace spawnpoint::loader
