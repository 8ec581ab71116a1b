// A failed attempt's survivors (issue 36's restart time): a Python rank the agent stops with
// SIGTERM because a peer failed ends once its exit handlers have run, by SIGTERM's default
// action, without the interpreter's finalization, even when its own SIGTERM handler lets it
// run on (Lightning's does). Its atexit handlers ran, logging was shut down (a record buffered
// in a MemoryHandler reached its file) and stdout was flushed; no module global was finalized.
// The next attempt's ranks, which end by themselves, and the ranks of a job the user stops
// (SIGTERM to the agent) finalize as before. tests/data/failed_stop/train.py, Debian's
// python3 (no torch needed).
#include <signal.h>

#include <regex>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/support/test_process.h"

namespace spawnpoint::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr std::chrono::milliseconds kTimeout{120'000};

std::string Job(const std::string& dir, int failing_rank) {
  return "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: stop}\n"
         "spec:\n  procsPerNode: 2\n  loader: {workersPerRank: 0}\n"
         "  restartPolicy: {maxRestarts: 1, backoffSeconds: 0, standby: false}\n"
         "  template:\n    spec:\n      containers:\n      - name: trainer\n        image: x\n"
         "        command: [/usr/bin/python3, \"" FAILED_STOP_DATA "/train.py\", \"" +
         dir + "\", '" + std::to_string(failing_rank) + "']\n";
}

// The pid rank `rank` printed in attempt `attempt` ("[rank R] started pid=P attempt=A").
std::string StartedPid(const std::string& out, int rank, int attempt) {
  std::smatch m;
  const std::regex line("\\[rank " + std::to_string(rank) +
                        "\\] started pid=(\\d+) attempt=" + std::to_string(attempt));
  return std::regex_search(out, m, line) ? m[1].str() : "";
}

class FailedStopTest : public ::testing::Test {
 protected:
  std::unique_ptr<TestProcess> Start(int failing_rank) {
    WriteFile(dir_.File("job.yaml"), Job(dir_.path(), failing_rank));
    auto agent = std::make_unique<TestProcess>(
        std::vector<std::string>{AGENT_BIN, "run", "-f", dir_.File("job.yaml"), "--master-port",
                                 "0", "--metrics-addr", "off"},
        std::map<std::string, std::string>{}, dir_.path());
    EXPECT_TRUE(WaitUntil(
        [&] {
          return (FileExists(dir_.File("ready-0")) && FileExists(dir_.File("ready-1"))) ||
                 !agent->Running();
        },
        kTimeout))
        << agent->Stderr();
    return agent;
  }

  static bool FileExists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

  TempDir dir_;
};

TEST_F(FailedStopTest, ASurvivorEndsAfterItsExitHandlersWithoutFinalizing) {
  auto agent = Start(/*failing_rank=*/1);
  WriteFile(dir_.File("go"), "");
  ASSERT_EQ(agent->Wait(kTimeout), 0) << agent->Stderr() << agent->Stdout();
  const std::string out = agent->Stdout(), err = agent->Stderr();
  const std::string survivor = StartedPid(out, 0, 0);
  ASSERT_FALSE(survivor.empty()) << out;
  EXPECT_THAT(out, HasSubstr("atexit ran pid=" + survivor)) << "stdout flushed after atexit";
  EXPECT_THAT(ReadFile(dir_.File("log-" + survivor)),
              HasSubstr("logged before exit pid=" + survivor))
      << "logging shut down";
  EXPECT_THAT(out, Not(HasSubstr("finalized pid=" + survivor))) << out;
  // The restarted ranks end by themselves: finalized as ever.
  for (int rank : {0, 1}) {
    const std::string pid = StartedPid(out, rank, 1);
    ASSERT_FALSE(pid.empty()) << out;
    EXPECT_THAT(out, HasSubstr("finalized pid=" + pid)) << out;
  }
  EXPECT_EQ(CountLines(err, "without the interpreter's finalization"), 1) << err;
}

TEST_F(FailedStopTest, RanksOfAJobTheUserStopsFinalizeAsBefore) {
  auto agent = Start(/*failing_rank=*/-1);
  ASSERT_EQ(::kill(agent->pid(), SIGTERM), 0);
  agent->Wait(kTimeout);
  const std::string out = agent->Stdout();
  for (int rank : {0, 1}) {
    const std::string pid = StartedPid(out, rank, 0);
    ASSERT_FALSE(pid.empty()) << out;
    EXPECT_THAT(out, HasSubstr("atexit ran pid=" + pid)) << out;
    EXPECT_THAT(out, HasSubstr("finalized pid=" + pid)) << out;
  }
}

}  // namespace
}  // namespace spawnpoint::testing
