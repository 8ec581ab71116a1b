// Supervision on real processes: `spawnpoint-agent run` with spawnpoint-test-rank as the
// trainer, each test scripting one way a rank can fail.
#include <signal.h>

#include <filesystem>
#include <regex>
#include <set>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/test_process.h"

namespace spawnpoint::testing {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr milliseconds kTimeout{60'000};

struct JobShape {
  int nodes = 1;
  int ranks = 2;
  std::vector<std::string> args;
  int max_restarts = 0;
  int backoff_seconds = 0;
  std::string shm_size = "64Mi";
  std::string extra_spec;  // more YAML under spec:, indented two spaces
};

std::string Manifest(const JobShape& s) {
  std::ostringstream y;
  y << "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: test-job\n"
    << "spec:\n  nodes: " << s.nodes << "\n  procsPerNode: " << s.ranks << "\n"
    << "  shmSize: " << s.shm_size << "\n"
    << "  restartPolicy:\n    maxRestarts: " << s.max_restarts
    << "\n    backoffSeconds: " << s.backoff_seconds << "\n"
    << "  template:\n    spec:\n      containers:\n      - name: trainer\n"
    << "        image: test\n        command: [\"" << TEST_RANK_BIN << "\"]\n        args: [";
  for (size_t i = 0; i < s.args.size(); ++i) y << (i ? ", " : "") << "\"" << s.args[i] << "\"";
  y << "]\n" << s.extra_spec;
  return y.str();
}

class AgentRunTest : public ::testing::Test {
 protected:
  std::string WriteJob(const JobShape& s) {
    std::string path = dir_.File("job.yaml");
    WriteFile(path, Manifest(s));
    return path;
  }
  std::unique_ptr<TestProcess> StartAgent(const JobShape& s, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {AGENT_BIN,
                                     "run",
                                     "-f",
                                     WriteJob(s),
                                     "--master-port",
                                     "0",
                                     "--termination-log",
                                     dir_.File("termination-log"),
                                     "--grace-period",
                                     "5"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<TestProcess>(argv);
  }
  std::vector<pid_t> Pids(const std::string& prefix) {
    std::vector<pid_t> pids;
    for (auto& e : std::filesystem::directory_iterator(pid_dir())) {
      std::string name = e.path().filename().string();
      if (name.rfind(prefix, 0) == 0 && e.path().extension() == ".pid") {
        pids.push_back(std::stoi(ReadFile(e.path().string())));
      }
    }
    return pids;
  }
  void ExpectAllGone() {
    for (pid_t p : Pids("")) EXPECT_FALSE(ProcessExists(p)) << "pid " << p << " survived";
  }
  nlohmann::json TerminationLog() {
    return nlohmann::json::parse(ReadFile(dir_.File("termination-log")));
  }
  std::string pid_dir() {
    std::filesystem::create_directories(dir_.File("pids"));
    return dir_.File("pids");
  }

  TempDir dir_;
};

TEST_F(AgentRunTest, RanksRunWithTorchrunEnvironmentAndPrefixedOutput) {
  auto agent = StartAgent({.ranks = 2, .args = {"--print-env", "--run-ms", "50"}});
  ASSERT_EQ(agent->Wait(kTimeout), 0) << agent->Stderr();
  std::string out = agent->Stdout();
  EXPECT_THAT(out, HasSubstr("[rank 0] env RANK=0"));
  EXPECT_THAT(out, HasSubstr("[rank 1] env RANK=1"));
  EXPECT_THAT(out, HasSubstr("[rank 1] env LOCAL_RANK=1"));
  EXPECT_THAT(out, HasSubstr("[rank 0] env WORLD_SIZE=2"));
  EXPECT_THAT(out, HasSubstr("[rank 0] env TORCHELASTIC_RESTART_COUNT=0"));
  EXPECT_THAT(out, HasSubstr("[rank 1] rank 1 done"));
  EXPECT_THAT(agent->Stderr(), HasSubstr("2/2 ranks up"));
  EXPECT_THAT(agent->Stderr(), HasSubstr("all ranks succeeded"));
}

// The agent exits 1 for a failed job (agent/run/exit_codes.h); the rank's own code, signal
// and cause are in the termination log and on the agent's last line.
TEST_F(AgentRunTest, RankKilledBySigkillStopsTheOthersAndReports137) {
  auto agent = StartAgent({.ranks = 2,
                           .args = {"--pid-dir", pid_dir(), "--fail-rank", "1", "--signal", "9",
                                    "--after-ms", "100", "--run-ms", "-1"}});
  EXPECT_EQ(agent->Wait(kTimeout), 1) << agent->Stderr();
  EXPECT_THAT(agent->Stderr(), HasSubstr("rank 1 (local rank 1, node 0"));
  EXPECT_THAT(agent->Stderr(), HasSubstr("exit code 137 (SIGKILL), reason Killed"));
  auto log = TerminationLog();
  EXPECT_EQ(log["rank"], 1);
  EXPECT_EQ(log["exitCode"], 137);
  EXPECT_EQ(log["reason"], "Killed");
  EXPECT_EQ(log["signal"], "SIGKILL");
  EXPECT_EQ(Pids("rank-").size(), 2u);
  ExpectAllGone();
}

TEST_F(AgentRunTest, RankExitThreeIsAUserErrorAndNotRestarted) {
  auto agent = StartAgent({.ranks = 2,
                           .args = {"--fail-rank", "0", "--exit-code", "3", "--run-ms", "-1"},
                           .max_restarts = 3});
  EXPECT_EQ(agent->Wait(kTimeout), 1) << agent->Stderr();
  EXPECT_THAT(agent->Stderr(), HasSubstr("reason UserError: user error: exited with code 3"));
  EXPECT_THAT(agent->Stderr(), HasSubstr("exit code 3 is not retryable"));
  EXPECT_THAT(agent->Stderr(), Not(HasSubstr("restart 1 of")));
  EXPECT_EQ(TerminationLog()["reason"], "UserError");
  EXPECT_EQ(TerminationLog()["exitCode"], 3);
}

TEST_F(AgentRunTest, RankIgnoringSigtermIsKilledAfterTheGracePeriod) {
  auto agent =
      StartAgent({.ranks = 2,
                  .args = {"--pid-dir", pid_dir(), "--ignore-sigterm", "0", "--fail-rank", "1",
                           "--exit-code", "1", "--after-ms", "200", "--run-ms", "-1"}},
                 {"--grace-period", "1"});
  EXPECT_EQ(agent->Wait(kTimeout), 1) << agent->Stderr();
  EXPECT_THAT(agent->Stderr(), HasSubstr("grace period over: SIGKILL to 1 ranks"));
  ExpectAllGone();
}

TEST_F(AgentRunTest, AgentSigtermStopsEveryProcessOfTheJob) {
  auto agent = StartAgent(
      {.ranks = 2, .args = {"--pid-dir", pid_dir(), "--grandchild", "0", "--run-ms", "-1"}});
  ASSERT_TRUE(WaitUntil([&] { return Pids("").size() == 3; }, kTimeout)) << agent->Stderr();
  kill(agent->pid(), SIGTERM);
  EXPECT_EQ(agent->Wait(kTimeout), 128 + SIGTERM) << agent->Stderr();
  EXPECT_THAT(agent->Stderr(), HasSubstr("received SIGTERM, stopping 2 ranks"));
  ExpectAllGone();
}

TEST_F(AgentRunTest, GrandchildThatOutlivesItsRankIsReaped) {
  auto agent = StartAgent(
      {.ranks = 2, .args = {"--pid-dir", pid_dir(), "--grandchild", "1", "--run-ms", "100"}});
  EXPECT_EQ(agent->Wait(kTimeout), 0) << agent->Stderr();
  ASSERT_EQ(Pids("grandchild-").size(), 1u);
  ExpectAllGone();
}

TEST_F(AgentRunTest, FailingOnceWithRetryableCodeRestartsTheGang) {
  std::filesystem::create_directories(dir_.File("markers"));
  auto agent = StartAgent({.ranks = 2,
                           .args = {"--fail-once", dir_.File("markers"), "--fail-rank", "1",
                                    "--signal", "9", "--run-ms", "200"},
                           .max_restarts = 2});
  EXPECT_EQ(agent->Wait(kTimeout), 0) << agent->Stderr();
  EXPECT_THAT(agent->Stderr(), HasSubstr("restart 1 of 2"));
  EXPECT_THAT(agent->Stderr(), Not(HasSubstr("restart 2 of 2")));
  EXPECT_THAT(agent->Stderr(), HasSubstr("all ranks succeeded, restarts 1"));
  EXPECT_THAT(agent->Stdout(), HasSubstr("[rank 0] rank 0 started restart=1"));
  EXPECT_THAT(agent->Stdout(), HasSubstr("[rank 1] rank 1 started restart=1"));
}

// A local job's restart does not wait for the kernel to tear the failed attempt down
// (NodeAgent's overlap_teardown_): the next attempt meets on a port of its own.
TEST_F(AgentRunTest, ARestartMeetsOnAFreshRendezvousPort) {
  std::filesystem::create_directories(dir_.File("markers"));
  auto agent = StartAgent(
      {.ranks = 2,
       .args = {"--fail-once", dir_.File("markers"), "--fail-rank", "1", "--signal", "9",
                "--after-ms", "100", "--run-ms", "300", "--print-env", "--pid-dir", pid_dir()},
       .max_restarts = 1});
  ASSERT_EQ(agent->Wait(kTimeout), 0) << agent->Stderr();
  std::vector<std::string> ports;
  std::regex port_line(R"(\[rank 0\] env MASTER_PORT=(\d+))");
  const std::string out = agent->Stdout();
  for (std::sregex_iterator it(out.begin(), out.end(), port_line), end; it != end; ++it) {
    ports.push_back((*it)[1]);
  }
  ASSERT_EQ(ports.size(), 2u) << out;
  EXPECT_NE(ports[0], ports[1]);
  EXPECT_THAT(agent->Stderr(), HasSubstr("attempt 2 meets on port " + ports[1]));
  ExpectAllGone();
}

// The overlap is with the kernel's teardown only: a survivor's SIGTERM handler is user
// code, and the next attempt starts after it has ended.
TEST_F(AgentRunTest, TheNextAttemptStartsAfterASurvivorsSigtermHandlerEnds) {
  std::filesystem::create_directories(dir_.File("markers"));
  auto agent =
      StartAgent({.ranks = 2,
                  .args = {"--fail-once", dir_.File("markers"), "--fail-rank", "1", "--signal", "9",
                           "--after-ms", "100", "--run-ms", "300", "--slow-sigterm", "0",
                           "--sigterm-ms", "400", "--pid-dir", pid_dir()},
                  .max_restarts = 1});
  ASSERT_EQ(agent->Wait(kTimeout), 0) << agent->Stderr();
  const long long handler_end = std::stoll(ReadFile(pid_dir() + "/stopped-0"));
  std::regex started(R"(rank \d started restart=1 pid=\d+ at_ns=(\d+))");
  const std::string out = agent->Stdout();
  int restarted = 0;
  for (std::sregex_iterator it(out.begin(), out.end(), started), end; it != end; ++it) {
    ++restarted;
    EXPECT_GT(std::stoll((*it)[1]), handler_end) << out;
  }
  EXPECT_EQ(restarted, 2) << out;
}

// A daemon the failed attempt left behind (its own session) is stopped before the next
// attempt runs, as it was when every restart waited for the old processes to exit.
TEST_F(AgentRunTest, AFailedAttemptsDaemonIsGoneBeforeTheNextAttemptRuns) {
  std::filesystem::create_directories(dir_.File("markers"));
  auto agent =
      StartAgent({.ranks = 2,
                  .args = {"--fail-once", dir_.File("markers"), "--fail-rank", "1", "--signal", "9",
                           "--after-ms", "100", "--run-ms", "300", "--grandchild", "0", "--pid-dir",
                           pid_dir(), "--check-gone", pid_dir()},
                  .max_restarts = 1});
  ASSERT_EQ(agent->Wait(kTimeout), 0) << agent->Stderr();
  EXPECT_THAT(agent->Stdout(), HasSubstr("[rank 0] rank 0 started restart=1"));
  EXPECT_THAT(agent->Stdout(), Not(HasSubstr("stale process")));
  ExpectAllGone();
}

TEST_F(AgentRunTest, RestartsStopAtMaxRestarts) {
  auto agent = StartAgent({.ranks = 1, .args = {"--signal", "9"}, .max_restarts = 1});
  EXPECT_EQ(agent->Wait(kTimeout), 1) << agent->Stderr();
  EXPECT_THAT(agent->Stderr(), HasSubstr("restart 1 of 1"));
  EXPECT_THAT(agent->Stderr(), HasSubstr("maxRestarts (1) reached"));
  EXPECT_EQ(TerminationLog()["restarts"], 1);
  EXPECT_EQ(TerminationLog()["exitCode"], 137);
}

TEST_F(AgentRunTest, OomKillIsRecognisedFromTheCgroupCounter) {
  WriteFile(dir_.File("memory.events"), "oom 0\noom_kill 4\n");
  auto agent = StartAgent({.ranks = 2,
                           .args = {"--fail-rank", "0", "--bump-oom", dir_.File("memory.events"),
                                    "--signal", "9", "--run-ms", "-1"}},
                          {"--cgroup-memory-events", dir_.File("memory.events")});
  EXPECT_EQ(agent->Wait(kTimeout), 1) << agent->Stderr();
  EXPECT_THAT(agent->Stderr(), HasSubstr("reason OOMKilled"));
  EXPECT_EQ(TerminationLog()["reason"], "OOMKilled");
}

TEST_F(AgentRunTest, SigbusIsReportedAsSharedMemoryExhaustionWithTheFix) {
  auto agent = StartAgent({.ranks = 1, .args = {"--signal", "7"}});
  EXPECT_EQ(agent->Wait(kTimeout), 1) << agent->Stderr();
  EXPECT_EQ(TerminationLog()["exitCode"], 128 + SIGBUS);
  EXPECT_THAT(agent->Stderr(), HasSubstr("reason ShmExhausted"));
  EXPECT_THAT(agent->Stderr(), HasSubstr("raise spec.shmSize"));
}

TEST_F(AgentRunTest, TooLittleSharedMemoryFailsBeforeAnythingStarts) {
  // Far more than any /dev/shm here has: 2 ranks x 64 workers x 100 batches in flight.
  auto agent =
      StartAgent({.ranks = 2,
                  .args = {"--pid-dir", pid_dir()},
                  .shm_size = "900Ti",
                  .extra_spec = "  loader:\n    workersPerRank: 64\n    prefetchFactor: 100\n"});
  EXPECT_EQ(agent->Wait(kTimeout), 1);
  EXPECT_THAT(agent->Stderr(), HasSubstr("/dev/shm has"));
  EXPECT_THAT(agent->Stderr(), HasSubstr("Fix: set spec.shmSize"));
  EXPECT_EQ(CountLines(agent->Stderr(), ""), 1) << agent->Stderr();
  EXPECT_TRUE(Pids("").empty());
}

TEST_F(AgentRunTest, MissingCommandFailsBeforeAnythingStarts) {
  JobShape s{.ranks = 2};
  WriteFile(dir_.File("job.yaml"),
            std::regex_replace(Manifest(s), std::regex(TEST_RANK_BIN), "/nonexistent/trainer"));
  TestProcess agent({AGENT_BIN, "run", "-f", dir_.File("job.yaml")});
  EXPECT_EQ(agent.Wait(kTimeout), 2);
  EXPECT_THAT(agent.Stderr(), HasSubstr("/nonexistent/trainer: no such file"));
}

TEST_F(AgentRunTest, TwoLocalNodesRunFourRanksAndReportTheFailingRank) {
  auto agent = StartAgent({.nodes = 2,
                           .ranks = 2,
                           .args = {"--pid-dir", pid_dir(), "--print-env", "--fail-rank", "3",
                                    "--exit-code", "5", "--after-ms", "300", "--run-ms", "-1"}});
  EXPECT_EQ(agent->Wait(kTimeout), 1) << agent->Stderr();
  std::string out = agent->Stdout();
  for (int r = 0; r < 4; ++r) {
    EXPECT_THAT(out, HasSubstr("[rank " + std::to_string(r) + "] env RANK=" + std::to_string(r)));
    EXPECT_THAT(out, HasSubstr("[rank " + std::to_string(r) + "] env WORLD_SIZE=4"));
  }
  EXPECT_THAT(out, HasSubstr("[rank 3] env GROUP_RANK=1"));
  EXPECT_THAT(out, HasSubstr("[rank 2] env LOCAL_RANK=0"));
  EXPECT_THAT(agent->Stderr(), HasSubstr("running 2 nodes locally"));
  EXPECT_THAT(agent->Stderr(), HasSubstr("failed: rank 3 (local rank 1, node 1"));
  EXPECT_EQ(TerminationLog()["rank"], 3);
  EXPECT_EQ(TerminationLog()["exitCode"], 5) << "the node agent's exit 1 is not the rank's code";
  EXPECT_THAT(agent->Stderr(), Not(HasSubstr("rank -1"))) << "a node agent reports its rank";
  EXPECT_THAT(agent->Stderr(), Not(HasSubstr("exit code 1,")));
  EXPECT_EQ(Pids("rank-").size(), 4u);
  ExpectAllGone();
}

// The exit-code table (agent/run/exit_codes.h, docs/running.md "Exit codes"): the agent's own bad
// input exits 2 and starts nothing; a rank's exit 2 (an argparse error) is a failed job,
// exit 1, with the rank's code and cause in the termination log and on the last line.
TEST_F(AgentRunTest, AMissingManifestFileIsBadInput) {
  for (const char* command : {"run", "plan"}) {
    TestProcess agent({AGENT_BIN, command, "-f", dir_.File("no-such-job.yaml")});
    EXPECT_EQ(agent.Wait(kTimeout), 2) << command << ": " << agent.Stderr();
    EXPECT_THAT(agent.Stderr(), HasSubstr("no-such-job.yaml: No such file or directory"));
    EXPECT_EQ(CountLines(agent.Stderr(), ""), 1) << agent.Stderr();
  }
}

TEST_F(AgentRunTest, ABadFlagIsBadInput) {
  TestProcess agent({AGENT_BIN, "run", "-f", WriteJob({.ranks = 1}), "--grace-period", "soon",
                     "--pid-dir", pid_dir()});
  EXPECT_EQ(agent.Wait(kTimeout), 2) << agent.Stderr();
  EXPECT_THAT(agent.Stderr(), HasSubstr("--grace-period"));
  TestProcess unknown({AGENT_BIN, "run", "-f", WriteJob({.ranks = 1}), "--no-such-flag"});
  EXPECT_EQ(unknown.Wait(kTimeout), 2) << unknown.Stderr();
  EXPECT_THAT(unknown.Stderr(), HasSubstr("unknown flag \"--no-such-flag\""));
  EXPECT_TRUE(std::filesystem::is_empty(pid_dir())) << "a rank ran";
}

TEST_F(AgentRunTest, ARankThatExitsTwoIsAFailedJobNotBadInput) {
  auto agent =
      StartAgent({.ranks = 2, .args = {"--fail-rank", "1", "--exit-code", "2", "--run-ms", "-1"}});
  const int code = agent->Wait(kTimeout);
  EXPECT_NE(code, 2) << agent->Stderr();
  EXPECT_EQ(code, 1) << agent->Stderr();
  auto log = TerminationLog();
  EXPECT_EQ(log["rank"], 1);
  EXPECT_EQ(log["exitCode"], 2);
  EXPECT_EQ(log["reason"], "UserError");
  EXPECT_EQ(log["message"], "user error: exited with code 2");
  EXPECT_FALSE(log.contains("signal"));
  // The last line says the same.
  std::string err = agent->Stderr();
  while (!err.empty() && err.back() == '\n') err.pop_back();
  EXPECT_THAT(err.substr(err.rfind('\n') + 1), HasSubstr("failed: rank 1 (local rank 1, node 0"));
  EXPECT_THAT(err.substr(err.rfind('\n') + 1),
              HasSubstr("exit code 2, reason UserError: user error: exited with code 2"));
}

}  // namespace
}  // namespace spawnpoint::testing
