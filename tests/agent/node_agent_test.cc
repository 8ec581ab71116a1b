// NodeAgent on its injected seams: a scripted spawner whose ranks are real, short-lived
// `/bin/sh -c` children, a SimulatedClock that moves only when the agent sleeps, and the
// process's SignalWatcher. Covers the restart schedule, fail-fast, bad input and a stop.
#include "agent/run/node_agent.h"

#include <signal.h>
#include <unistd.h>

#include <functional>
#include <mutex>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "agent/run/report.h"
#include "tests/support/test_process.h"

namespace spawnpoint::agent {
namespace {

using std::chrono::seconds;
using ::testing::HasSubstr;
using testing::ReadFile;
using testing::TempDir;

// Created before any thread (gtest starts none), as SignalWatcher requires; shared by all
// tests of this process. Each test drains what an earlier one left.
SignalWatcher* Signals() {
  static SignalWatcher* watcher = [] {
    auto w = SignalWatcher::Create();
    if (!w.ok()) abort();
    return std::move(w).value().release();
  }();
  return watcher;
}

// Simulated time that jumps to any deadline the agent sleeps until (its restart backoff),
// so backoffs of minutes take no real time. `on_sleep` runs before each jump.
class SteppingClock : public SimulatedClock {
 public:
  void SleepUntil(TimePoint deadline) override {
    if (on_sleep) on_sleep();
    const TimePoint now = Now();
    if (deadline > now) Advance(deadline - now);
  }
  std::function<void()> on_sleep;
};

// The seam NodeAgent starts ranks through. It records what the agent asked for and when
// (on the clock), then runs `/bin/sh -c <script(attempt, rank)>` in the rank's place with
// the real vfork spawner, so the gang supervises real processes.
class ScriptedSpawner : public ProcessSpawner {
 public:
  struct Call {
    int attempt = 0;
    int rank = 0;
    Clock::TimePoint at;
  };
  ScriptedSpawner(const Clock* clock, std::function<std::string(int attempt, int rank)> script)
      : clock_(clock), script_(std::move(script)), real_(MakeVforkSpawner()) {}

  StatusOr<pid_t> Spawn(const SpawnOptions& options) override {
    Call call{std::stoi(Env(options, "TORCHELASTIC_RESTART_COUNT")),
              std::stoi(Env(options, "RANK")), clock_->Now()};
    calls_.push_back(call);
    SpawnOptions child = options;
    child.argv = {"/bin/sh", "-c", script_(call.attempt, call.rank)};
    return real_->Spawn(child);
  }
  const std::vector<Call>& calls() const { return calls_; }

 private:
  static std::string Env(const SpawnOptions& o, const std::string& name) {
    for (const auto& kv : o.env) {
      if (kv.rfind(name + "=", 0) == 0) return kv.substr(name.size() + 1);
    }
    return "0";
  }
  const Clock* clock_;
  std::function<std::string(int, int)> script_;
  std::unique_ptr<ProcessSpawner> real_;
  std::vector<Call> calls_;
};

class NodeAgentTest : public ::testing::Test {
 protected:
  void SetUp() override { Signals()->Drain(); }

  api::TrainingJob Job(int max_restarts, int backoff_seconds,
                       const std::string& command = "/bin/true") {
    auto jobs = api::ParseTrainingJobs(
        "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: unit\n"
        "spec:\n  nodes: 1\n  procsPerNode: 2\n  shmSize: 1Mi\n"
        "  loader:\n    workersPerRank: 0\n"
        "  restartPolicy:\n    maxRestarts: " +
            std::to_string(max_restarts) +
            "\n    backoffSeconds: " + std::to_string(backoff_seconds) +
            "\n  template:\n    spec:\n      containers:\n      - name: trainer\n"
            "        image: test\n        command: [\"" +
            command + "\"]\n",
        "unit.yaml");
    EXPECT_TRUE(jobs.ok()) << jobs.status().message();
    return jobs->front();
  }
  AgentOptions Options() {
    AgentOptions o;
    o.command = AgentCommand::kRun;
    o.file = "unit.yaml";
    o.master_port = 0;
    o.gpu_backend = "none";
    o.shm_path = dir_.path();
    o.memory_events = dir_.File("no-memory.events");
    o.metrics_addr = "off";
    o.status_file = dir_.File("status.json");
    o.termination_log = dir_.File("termination-log");
    o.termination_log_explicit = true;
    return o;
  }
  NodeAgent::Seams Seams(ScriptedSpawner* spawner) {
    return {spawner, &clock_, Signals(),
            std::shared_ptr<devices::GpuBackend>(devices::NoGpuBackend())};
  }
  // Creates and runs the agent; its exit code, or what Create() failed with as an exit code.
  int RunAgent(const api::TrainingJob& job, ScriptedSpawner* spawner) {
    auto agent = NodeAgent::Create(Options(), job, Seams(spawner));
    if (!agent.ok()) return ExitCodeFor(agent.status());
    return (*agent)->Run();
  }
  nlohmann::json File(const std::string& name) {
    return nlohmann::json::parse(ReadFile(dir_.File(name)), nullptr, false);
  }
  // When each attempt started, relative to the first.
  std::vector<seconds> AttemptStarts(const ScriptedSpawner& spawner) {
    std::vector<seconds> starts;
    for (const auto& c : spawner.calls()) {
      if (c.rank != 0) continue;
      starts.push_back(std::chrono::duration_cast<seconds>(c.at - spawner.calls().front().at));
    }
    return starts;
  }

  TempDir dir_;
  SteppingClock clock_;
};

TEST_F(NodeAgentTest, RestartsNowThenWithADoublingCappedBackoffUntilMaxRestarts) {
  ScriptedSpawner spawner(&clock_, [](int, int) { return "exit 137"; });
  EXPECT_EQ(RunAgent(Job(/*max_restarts=*/4, /*backoff_seconds=*/100), &spawner), 1);
  // Attempts 0..4, each failing at once: the first restart now, then waits of 100, 200,
  // 300 (capped) s while the failures keep coming quickly; then the budget is spent.
  EXPECT_EQ(AttemptStarts(spawner), (std::vector<seconds>{seconds(0), seconds(0), seconds(100),
                                                          seconds(300), seconds(600)}));
  ASSERT_EQ(spawner.calls().size(), 10u);
  EXPECT_EQ(spawner.calls().back().attempt, 4) << "TORCHELASTIC_RESTART_COUNT counts restarts";
  nlohmann::json status = File("status.json");
  EXPECT_EQ(status["phase"], "Failed");
  EXPECT_EQ(status["restarts"], 4);
  nlohmann::json log = File("termination-log");
  EXPECT_EQ(log["exitCode"], 137);
  EXPECT_EQ(log["restarts"], 4);
}

TEST_F(NodeAgentTest, ARetryableFailureThenSuccessEndsWithZero) {
  ScriptedSpawner spawner(&clock_,
                          [](int attempt, int) { return attempt == 0 ? "exit 143" : "exit 0"; });
  EXPECT_EQ(RunAgent(Job(3, 10), &spawner), 0);
  EXPECT_EQ(AttemptStarts(spawner), (std::vector<seconds>{seconds(0), seconds(0)}))
      << "the first failure restarts at once";
  nlohmann::json status = File("status.json");
  EXPECT_EQ(status["phase"], "Succeeded");
  EXPECT_EQ(status["restarts"], 1);
  EXPECT_EQ(status["loader"].size(), 2u) << "one loader entry per rank";
}

TEST_F(NodeAgentTest, NonRetryableExitCodesEndTheJobWithoutRestart) {
  ScriptedSpawner spawner(&clock_,
                          [](int, int rank) { return rank == 1 ? "exit 3" : "exec sleep 600"; });
  const Clock::TimePoint start = clock_.Now();
  EXPECT_EQ(RunAgent(Job(3, 10), &spawner), 1) << "a failed job; the rank's 3 is in the log";
  EXPECT_EQ(spawner.calls().size(), 2u) << "one attempt only";
  EXPECT_EQ(clock_.Now(), start) << "no backoff was waited";
  nlohmann::json log = File("termination-log");
  EXPECT_EQ(log["exitCode"], 3);
  EXPECT_EQ(log["rank"], 1);
  EXPECT_EQ(log["reason"], "UserError");
  EXPECT_EQ(File("status.json")["phase"], "Failed");
}

TEST_F(NodeAgentTest, BadInputExitsTwoAndStartsNothing) {
  ScriptedSpawner spawner(&clock_, [](int, int) { return "exit 0"; });
  EXPECT_EQ(RunAgent(Job(3, 10, "no-such-trainer-for-node-agent-test"), &spawner), 2);
  EXPECT_TRUE(spawner.calls().empty());
  auto agent = NodeAgent::Create(Options(), Job(3, 10, "no-such-trainer-for-node-agent-test"),
                                 Seams(&spawner));
  ASSERT_FALSE(agent.ok());
  EXPECT_THAT(agent.status().message(), HasSubstr("no-such-trainer-for-node-agent-test"));
}

TEST_F(NodeAgentTest, ASignalStopsTheRanksAndExits128PlusIt) {
  ScriptedSpawner spawner(&clock_, [](int, int) { return "exec sleep 600"; });
  auto agent = NodeAgent::Create(Options(), Job(3, 10), Seams(&spawner));
  ASSERT_TRUE(agent.ok()) << agent.status().message();
  kill(getpid(), SIGTERM);  // blocked: it waits in the SignalWatcher for the gang's loop
  EXPECT_EQ((*agent)->Run(), 128 + SIGTERM);
  EXPECT_EQ(spawner.calls().size(), 2u);
  nlohmann::json log = File("termination-log");
  EXPECT_EQ(log["reason"], "Terminated");
  EXPECT_EQ(log["exitCode"], 143);
  EXPECT_EQ(log["message"], "agent stopped by SIGTERM");
  EXPECT_EQ(File("status.json")["phase"], "Terminated");
}

TEST_F(NodeAgentTest, ASignalDuringTheBackoffEndsIt) {
  ScriptedSpawner spawner(&clock_, [](int, int) { return "exit 137"; });
  bool sent = false;
  clock_.on_sleep = [&] {  // the first backoff sleep: as if Ctrl-C came now
    if (!sent) kill(getpid(), SIGINT);
    sent = true;
  };
  EXPECT_EQ(RunAgent(Job(3, 100), &spawner), 128 + SIGINT);
  // The first restart waits for nothing; the second failure's backoff is where it stops.
  EXPECT_EQ(spawner.calls().size(), 4u) << "no attempt after the stop";
  EXPECT_EQ(File("status.json")["phase"], "Terminated");
  nlohmann::json log = File("termination-log");
  EXPECT_EQ(log["reason"], "Terminated");
  EXPECT_EQ(log["exitCode"], 128 + SIGINT);
  EXPECT_EQ(log["message"], "agent stopped by SIGINT during restart backoff");
}

// Kubernetes keeps 4096 bytes of a termination message; the operator parses it as JSON, and
// a cut one would leave it the agent's exit code 1 instead of the rank's code.
TEST(TerminationLogTest, ALongMessageIsShortenedAndStaysOneJsonObject) {
  TempDir dir;
  AgentOptions o;
  o.termination_log = dir.File("termination-log");
  o.termination_log_explicit = true;
  WriteTerminationLog(o, {{"rank", 3},
                          {"exitCode", 137},
                          {"reason", "OOMKilled"},
                          {"message", std::string(6000, 'x') + "\"quoted\"\n"}});
  const std::string text = ReadFile(dir.File("termination-log"));
  EXPECT_LE(text.size(), 4001u);  // and a newline
  auto log = nlohmann::json::parse(text, nullptr, false);
  ASSERT_TRUE(log.is_object()) << text.substr(0, 200);
  EXPECT_EQ(log["exitCode"], 137);
  EXPECT_EQ(log["rank"], 3);
  EXPECT_THAT(log["message"].get<std::string>(), HasSubstr("xxx..."));
}

}  // namespace
}  // namespace spawnpoint::agent
