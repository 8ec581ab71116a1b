// Warm standby ranks (issue 36) on real processes: `spawnpoint-agent run` of
// tests/data/standby/train.py (Debian's python3 with torch, gloo), whose failing rank dies by
// SIGKILL on attempt 0 once the test opens its gate, which it does when the agent has said
// that every standby is ready. A usable standby becomes the rank (the same pid), in the new
// attempt's environment (its restart count and rendezvous port), and the script's top-level
// side effects, its own modules' included, happen once per attempt; a standby that exited,
// whose script changed, whose import failed or that initialised CUDA is not used, and a
// fresh process starts, said once.
#include <signal.h>

#include <regex>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/support/test_process.h"

namespace spawnpoint::testing {
namespace {

using ::testing::HasSubstr;

constexpr std::chrono::milliseconds kTimeout{240'000};

// Its standbys import at normal priority: on a machine busy with other tests' processes an
// idle-priority standby might not be ready within the test's time.
std::string Job(int ranks, int failing_rank, const std::string& gate,
                const std::string& standby = "", const std::string& priority = "normal") {
  return "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: standby}\n"
         "spec:\n  procsPerNode: " +
         std::to_string(ranks) +
         "\n  loader: {workersPerRank: 0}\n"
         "  restartPolicy: {maxRestarts: 1, backoffSeconds: 0" +
         standby +
         "}\n"
         "  template:\n    spec:\n      containers:\n      - name: trainer\n        image: x\n"
         "        command: [/usr/bin/python3, \"" STANDBY_DATA "/train.py\", \"" +
         gate + "\", '" + std::to_string(failing_rank) +
         "']\n"
         "        env: [{name: SPAWNPOINT_STANDBY_PRIORITY, value: " +
         priority + "}]\n";
}

// The pids the agent says each rank's standby has, once `ranks` are ready.
std::map<int, int> ReadyStandbys(const std::string& err) {
  std::map<int, int> out;
  std::regex ready(R"(rank (\d+)'s standby \(pid (\d+)\) is ready for a restart)");
  for (std::sregex_iterator it(err.begin(), err.end(), ready), end; it != end; ++it) {
    out[std::stoi((*it)[1])] = std::stoi((*it)[2]);
  }
  return out;
}

// Each attempt's pids and ports from the rank's own lines: {attempt, pid, port}.
std::vector<std::tuple<int, int, int>> Starts(const std::string& out) {
  std::vector<std::tuple<int, int, int>> starts;
  std::regex line(R"(top-level side effect pid=(\d+) attempt=(\d+) port=(\d+))");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it) {
    starts.emplace_back(std::stoi((*it)[2]), std::stoi((*it)[1]), std::stoi((*it)[3]));
  }
  return starts;
}

class StandbyTest : public ::testing::Test {
 protected:
  // Runs the job until every standby is ready, calls `before_gate`, opens the gate, and
  // waits for the agent's exit code.
  int Run(int ranks, const std::function<void(const std::map<int, int>&)>& before_gate = {}) {
    const std::string gate = dir_.File("gate");
    WriteFile(dir_.File("job.yaml"), Job(ranks, ranks - 1, gate));
    TestProcess agent({AGENT_BIN, "run", "-f", dir_.File("job.yaml"), "--master-port", "0",
                       "--status-file", dir_.File("status.json"), "--status-interval", "1"},
                      {}, dir_.path());
    EXPECT_TRUE(WaitUntil(
        [&] {
          return static_cast<int>(ReadyStandbys(agent.Stderr()).size()) == ranks ||
                 !agent.Running();
        },
        kTimeout))
        << agent.Stderr();
    standbys_ = ReadyStandbys(agent.Stderr());
    // What they cost is in the status document while they wait (one written once they are).
    EXPECT_TRUE(WaitUntil(
        [&] {
          status_ = nlohmann::json::parse(ReadFile(dir_.File("status.json")), nullptr, false);
          if (!status_.is_object() || !status_["standbys"].is_array() ||
              static_cast<int>(status_["standbys"].size()) != ranks) {
            return false;
          }
          for (const auto& s : status_["standbys"]) {
            if (!s.value("ready", false)) return false;
          }
          return true;
        },
        kTimeout))
        << status_.dump();
    if (before_gate) before_gate(standbys_);
    WriteFile(gate, "");
    const int code = agent.Wait(kTimeout);
    out_ = agent.Stdout();
    err_ = agent.Stderr();
    return code;
  }

  TempDir dir_;
  std::map<int, int> standbys_;
  nlohmann::json status_;
  std::string out_, err_;
};

TEST_F(StandbyTest, TheStandbyBecomesTheRankInTheNewAttemptsEnvironment) {
  ASSERT_EQ(Run(2), 0) << err_ << out_;
  ASSERT_EQ(standbys_.size(), 2u) << err_;
  auto starts = Starts(out_);
  ASSERT_EQ(starts.size(), 4u) << out_;  // 2 ranks x 2 attempts
  std::set<int> first_pids, second_pids, first_ports, second_ports;
  for (const auto& [attempt, pid, port] : starts) {
    (attempt == 0 ? first_pids : second_pids).insert(pid);
    (attempt == 0 ? first_ports : second_ports).insert(port);
  }
  EXPECT_EQ(second_pids, (std::set<int>{standbys_[0], standbys_[1]})) << out_;
  EXPECT_EQ(first_ports.size(), 1u);
  EXPECT_EQ(second_ports.size(), 1u);
  EXPECT_NE(*first_ports.begin(), *second_ports.begin()) << "the new attempt's port";
  for (int rank : {0, 1}) {
    EXPECT_THAT(err_,
                HasSubstr("rank " + std::to_string(rank) + " starts in its warm standby (pid " +
                          std::to_string(standbys_[rank]) + ")"));
  }
  // Side effects at the top, its own module's too: once per attempt and rank.
  EXPECT_EQ(CountLines(out_, "side module imported"), 4) << out_;
  EXPECT_EQ(CountLines(out_, "done pid="), 2) << out_;
  for (const auto& s : status_["standbys"]) {
    EXPECT_GT(s["memoryBytes"].get<int64_t>(), 10 << 20) << status_.dump();  // torch imported
  }
  std::printf("standby pids %d, %d became ranks 0 and 1 of attempt 1\n", standbys_[0],
              standbys_[1]);
}

TEST_F(StandbyTest, AStandbyThatExitedIsNotUsed) {
  ASSERT_EQ(Run(1, [](const std::map<int, int>& standbys) { kill(standbys.at(0), SIGKILL); }), 0)
      << err_;
  EXPECT_THAT(err_, HasSubstr("rank 0's standby is not used (it exited): a fresh process starts"));
  auto starts = Starts(out_);
  ASSERT_EQ(starts.size(), 2u) << out_;
  EXPECT_NE(std::get<1>(starts[1]), standbys_[0]);
}

TEST_F(StandbyTest, AStandbyWhoseScriptChangedIsNotUsed) {
  // The test edits a copy of the script, which the job runs.
  const std::string script = dir_.File("train.py");
  WriteFile(script, ReadFile(STANDBY_DATA "/train.py"));
  WriteFile(dir_.File("side_module.py"), ReadFile(STANDBY_DATA "/side_module.py"));
  const std::string gate = dir_.File("gate");
  WriteFile(dir_.File("job.yaml"),
            "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: standby}\n"
            "spec:\n  procsPerNode: 1\n  loader: {workersPerRank: 0}\n"
            "  restartPolicy: {maxRestarts: 1, backoffSeconds: 0}\n"
            "  template:\n    spec:\n      containers:\n      - name: trainer\n        image: x\n"
            "        command: [/usr/bin/python3, train.py, \"" +
                gate +
                "\", '0']\n"
                "        env: [{name: SPAWNPOINT_STANDBY_PRIORITY, value: normal}]\n");
  TestProcess agent({AGENT_BIN, "run", "-f", dir_.File("job.yaml"), "--master-port", "0"}, {},
                    dir_.path());
  ASSERT_TRUE(WaitUntil([&] { return ReadyStandbys(agent.Stderr()).size() == 1; }, kTimeout))
      << agent.Stderr();
  WriteFile(script, ReadFile(script) + "\n# edited between attempts\n");
  WriteFile(gate, "");
  ASSERT_EQ(agent.Wait(kTimeout), 0) << agent.Stderr();
  EXPECT_THAT(agent.Stderr(), HasSubstr("rank 0's standby is not used (the script "));
  EXPECT_THAT(agent.Stderr(), HasSubstr("train.py changed): a fresh process starts"));
}

TEST_F(StandbyTest, AStandbyWhoseImportFailedIsNotUsed) {
  // The rank's is import 1, the standby's import 2: it fails there, and the fresh process's
  // (3) succeeds. A rank that met the same error would fail in its own words.
  WriteFile(dir_.File("fail-import-2"), "");
  ASSERT_EQ(Run(1), 0) << err_ << out_;
  EXPECT_THAT(err_, HasSubstr("rank 0's standby is not used (the script's import of side_module: "
                              "RuntimeError: side_module: import 2 fails, as the test asked)"));
  EXPECT_EQ(Starts(out_).size(), 2u) << out_;
}

TEST_F(StandbyTest, AStandbyWithAGpuContextIsNeverUsed) {
  WriteFile(dir_.File("fake-cuda"), "");  // its module "initialises CUDA" in every process
  ASSERT_EQ(Run(1), 0) << err_ << out_;
  EXPECT_THAT(err_, HasSubstr("rank 0's standby is not used (it initialised a GPU (torch.cuda) "
                              "while importing): a fresh process starts"));
  auto starts = Starts(out_);
  ASSERT_EQ(starts.size(), 2u) << out_;
  EXPECT_NE(std::get<1>(starts[1]), standbys_[0]);
}

TEST_F(StandbyTest, ThePodsMemoryLimitTurnsThemOff) {
  // A pod near its memory limit (a fake cgroup: 90 of 100 MiB used): once a standby is
  // ready the agent gives them up for the job, and the restart starts a fresh process.
  TempDir cgroup;
  WriteFile(cgroup.File("memory.events"), "oom_kill 0\n");
  WriteFile(cgroup.File("memory.max"), std::to_string(100 << 20) + "\n");
  WriteFile(cgroup.File("memory.current"), std::to_string(90 << 20) + "\n");
  WriteFile(dir_.File("job.yaml"), Job(1, 0, dir_.File("gate")));
  TestProcess agent({AGENT_BIN, "run", "-f", dir_.File("job.yaml"), "--master-port", "0",
                     "--cgroup-memory-events", cgroup.File("memory.events")},
                    {}, dir_.path());
  ASSERT_TRUE(WaitUntil(
      [&] { return agent.Stderr().find("standby ranks are off") != std::string::npos; }, kTimeout))
      << agent.Stderr();
  WriteFile(dir_.File("gate"), "");
  ASSERT_EQ(agent.Wait(kTimeout), 0) << agent.Stderr();
  EXPECT_THAT(agent.Stderr(), HasSubstr("with them the pod uses 90 MiB of its 100 MiB memory "
                                        "limit (more than 80%); restarts start fresh processes"));
  EXPECT_EQ(CountLines(agent.Stderr(), "starts in its warm standby"), 0) << agent.Stderr();
  EXPECT_EQ(Starts(agent.Stdout()).size(), 2u) << agent.Stdout();
}

TEST_F(StandbyTest, AnUnknownPriorityIsRefusedByNameAndTheRestartStartsFresh) {
  WriteFile(dir_.File("job.yaml"), Job(1, 0, dir_.File("gate"), "", "high"));
  TestProcess agent({AGENT_BIN, "run", "-f", dir_.File("job.yaml"), "--master-port", "0"}, {},
                    dir_.path());
  ASSERT_TRUE(WaitUntil(
      [&] {
        return agent.Stderr().find("no standby for rank 0") != std::string::npos ||
               !agent.Running();
      },
      kTimeout))
      << agent.Stderr();
  WriteFile(dir_.File("gate"), "");
  ASSERT_EQ(agent.Wait(kTimeout), 0) << agent.Stderr();
  EXPECT_THAT(agent.Stderr(),
              HasSubstr("no standby for rank 0: the environment's SPAWNPOINT_STANDBY_PRIORITY is "
                        "\"high\"; allowed: idle (the default), normal"));
  EXPECT_EQ(CountLines(agent.Stderr(), "starts in its warm standby"), 0) << agent.Stderr();
  EXPECT_EQ(Starts(agent.Stdout()).size(), 2u) << agent.Stdout();
}

TEST_F(StandbyTest, TheJobCanTurnThemOff) {
  WriteFile(dir_.File("gate"), "");  // the rank fails at once
  WriteFile(dir_.File("job.yaml"), Job(1, 0, dir_.File("gate"), ", standby: false"));
  TestProcess agent({AGENT_BIN, "run", "-f", dir_.File("job.yaml"), "--master-port", "0"}, {},
                    dir_.path());
  ASSERT_EQ(agent.Wait(kTimeout), 0) << agent.Stderr();
  EXPECT_THAT(agent.Stderr(), HasSubstr("restart 1 of 1 now"));
  EXPECT_EQ(CountLines(agent.Stderr(), "'s standby"), 0) << agent.Stderr();
  EXPECT_EQ(CountLines(agent.Stderr(), "warm standby"), 0) << agent.Stderr();
  EXPECT_EQ(Starts(agent.Stdout()).size(), 2u) << agent.Stdout();
}

}  // namespace
}  // namespace spawnpoint::testing
