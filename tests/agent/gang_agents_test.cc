// Two agents of one job, started as the operator starts its pods' agents (--node-rank,
// --gang, --gang-token-file), restart their gang in place (issue 19): the agents and their
// loader workers stay, the restart is counted once for the job, and a rank that ignores
// SIGTERM or waits on a dead peer is stopped.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <regex>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/support/test_process.h"

namespace spawnpoint::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr std::chrono::milliseconds kTimeout{150'000};

// A port nothing listens on now (the kernel's pick for an ephemeral bind).
int FreeTcpPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

class GangAgentsTest : public ::testing::Test {
 protected:
  void SetUp() override { WriteFile(dir_.File("token"), "job-token-for-tests\n"); }

  // Starts node `n`'s agent of the job in job.yaml.
  std::unique_ptr<TestProcess> Agent(int n, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {AGENT_BIN,
                                     "run",
                                     "-f",
                                     dir_.File("job.yaml"),
                                     "--node-rank",
                                     std::to_string(n),
                                     "--master-port",
                                     std::to_string(master_port_),
                                     "--gang",
                                     "127.0.0.1:" + std::to_string(gang_port_),
                                     "--gang-token-file",
                                     dir_.File("token"),
                                     "--metrics-addr",
                                     "off",
                                     "--status-file",
                                     dir_.File("status-" + std::to_string(n) + ".json"),
                                     "--termination-log",
                                     dir_.File("termination-" + std::to_string(n) + ".json")};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<TestProcess>(argv);
  }
  // Writes the job (gang_ddp.py in `mode`, 400 steps), starts both nodes' agents into
  // node0 and node1, and waits until node 1's rank has made 5 steps.
  ::testing::AssertionResult StartTraining(const std::string& mode,
                                           std::unique_ptr<TestProcess>* node0,
                                           std::unique_ptr<TestProcess>* node1);
  // The coordinator's agent stopped mid-attempt and replaced, with gang_ddp.py in `mode`.
  void CoordinatorReplaced(const std::string& mode);
  nlohmann::json Status(int n) {
    return nlohmann::json::parse(ReadFile(dir_.File("status-" + std::to_string(n) + ".json")),
                                 nullptr, false);
  }

  TempDir dir_;
  int gang_port_ = FreeTcpPort();
  int master_port_ = FreeTcpPort();
};

std::string Job(const std::string& command, const std::string& args, int max_restarts,
                int workers) {
  return "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: gang}\n"
         "spec:\n  nodes: 2\n  procsPerNode: 1\n  backend: gloo\n  shmSize: 256Mi\n"
         "  loader: {workersPerRank: " +
         std::to_string(workers) +
         "}\n  restartPolicy: {maxRestarts: " + std::to_string(max_restarts) +
         ", backoffSeconds: 0}\n"
         "  template:\n    spec:\n      containers:\n      - name: trainer\n        image: x\n"
         "        command: " +
         command + "\n        args: " + args + "\n";
}

// The loader workers' pids each attempt of `rank` printed ("loader rank=R epoch=E
// restart=N worker_pids=a,b").
std::map<int, std::string> WorkerPids(const std::string& out, int rank) {
  std::map<int, std::string> by_restart;
  std::regex line("loader rank=" + std::to_string(rank) +
                  R"( epoch=0 restart=([0-9]+) worker_pids=([0-9,]+))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator();
       ++it) {
    by_restart[std::stoi((*it)[1])] = (*it)[2];
  }
  return by_restart;
}

// Node 0's agent cannot serve the gang (its port is taken, as by another job's agent on a
// shared network): it says so in its termination log and status, as an AgentError a new pod
// may not meet (retryable), instead of leaving the operator only its log.
TEST_F(GangAgentsTest, ANode0AgentThatCannotServeTheGangSaysWhyInItsTerminationLog) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  gang_port_ = ntohs(a.sin_port);
  WriteFile(dir_.File("job.yaml"), Job("[/bin/true]", "[]", 3, 0));
  auto node0 = Agent(0);
  EXPECT_EQ(node0->Wait(kTimeout), 1) << node0->Stderr();
  ::close(fd);
  EXPECT_THAT(node0->Stderr(), HasSubstr("gang channel: cannot listen on"));
  nlohmann::json log =
      nlohmann::json::parse(ReadFile(dir_.File("termination-0.json")), nullptr, false);
  ASSERT_TRUE(log.is_object()) << ReadFile(dir_.File("termination-0.json"));
  EXPECT_EQ(log["reason"], "AgentError");
  EXPECT_EQ(log["exitCode"], 1);
  EXPECT_EQ(log["retryable"], true);
  EXPECT_THAT(log["message"].get<std::string>(),
              HasSubstr("the agent failed: gang channel: cannot listen on 0.0.0.0:" +
                        std::to_string(gang_port_) + ": Address already in use"));
  nlohmann::json status = Status(0);
  EXPECT_EQ(status["phase"], "Failed");
  EXPECT_EQ(status["lastFailure"]["reason"], "AgentError");
}

// Node 1's agent never comes (its pod unschedulable, say): node 0's agent gives up after
// --gang-join-timeout with the cause GangStartTimeout, its own exit code and no signal, since
// no rank failed and nothing was killed (it used to read "exit 137 (Killed), SIGKILL").
TEST_F(GangAgentsTest, AGangWhoseNodesNeverMeetGivesUpWithGangStartTimeoutAndNoSignal) {
  WriteFile(dir_.File("job.yaml"), Job("[/bin/true]", "[]", 3, 0));
  auto node0 = Agent(0, {"--gang-join-timeout", "1.5"});
  EXPECT_EQ(node0->Wait(kTimeout), 1) << node0->Stderr();
  nlohmann::json log =
      nlohmann::json::parse(ReadFile(dir_.File("termination-0.json")), nullptr, false);
  ASSERT_TRUE(log.is_object()) << ReadFile(dir_.File("termination-0.json"));
  EXPECT_EQ(log["reason"], "GangStartTimeout") << log.dump();
  EXPECT_EQ(log["verdict"], "GangStartTimeout") << log.dump();
  EXPECT_EQ(log["exitCode"], 1) << log.dump();
  EXPECT_TRUE(!log.contains("signal") || log["signal"].is_null()) << log.dump();
  EXPECT_EQ(log["retryable"], true);
  EXPECT_EQ(log["message"],
            "the gang did not start within 1.5 s: not every node's agent reached its barrier");
  nlohmann::json status = Status(0);
  EXPECT_EQ(status["phase"], "Failed");
  EXPECT_EQ(status["lastFailure"]["reason"], "GangStartTimeout");
  EXPECT_TRUE(status["lastFailure"]["signal"].is_null()) << status["lastFailure"].dump();
}

TEST_F(GangAgentsTest, ARankKilledOnNode1RestartsTheGangInPlaceWithItsLoaderWorkers) {
  WriteFile(dir_.File("job.yaml"),
            Job("[\"" TRAINER_BIN "\"]",
                "[--epochs, '2', --steps-per-epoch, '20', --fail-at-step, '5', --fail-rank, '1', "
                "--fail-signal, '9']",
                3, 2));
  auto node0 = Agent(0), node1 = Agent(1);
  const pid_t pid0 = node0->pid(), pid1 = node1->pid();
  ASSERT_EQ(node1->Wait(kTimeout), 0) << node1->Stderr();
  ASSERT_EQ(node0->Wait(kTimeout), 0) << node0->Stderr();
  // The same two agents ran both attempts: one restart each, no process replaced.
  for (auto* a : {node0.get(), node1.get()}) {
    EXPECT_THAT(a->Stderr(), HasSubstr("restart 1 of 3 now; after: rank 1 (local rank 0, node 1"))
        << a->Stderr();
    EXPECT_THAT(a->Stderr(), HasSubstr("all ranks succeeded, restarts 1"));
    EXPECT_EQ(CountLines(a->Stderr(), "restart 1 of 3"), 1);
  }
  EXPECT_NE(pid0, pid1);
  EXPECT_THAT(node0->Stderr(), HasSubstr("stopping the ranks: another node's rank failed"));
  // Loader workers survive the restart on both nodes.
  for (int rank : {0, 1}) {
    const std::string out = rank == 0 ? node0->Stdout() : node1->Stdout();
    auto pids = WorkerPids(out, rank);
    ASSERT_TRUE(pids.count(0) && pids.count(1)) << out;
    EXPECT_EQ(pids[0], pids[1]) << "rank " << rank << "'s workers were replaced:\n" << out;
  }
  // The coordinator's status document says what the operator reads.
  nlohmann::json s = Status(0);
  EXPECT_EQ(s["phase"], "Succeeded");
  EXPECT_EQ(s["restarts"], 1);
  EXPECT_EQ(s["lastFailure"]["nodeRank"], 1);
  EXPECT_EQ(s["lastFailure"]["rank"], 1);
  EXPECT_EQ(s["lastFailure"]["reason"], "Killed");
}

TEST_F(GangAgentsTest, TheJobsBudgetFailsTheGangWithMaxRestartsReachedAfterExactlyIt) {
  WriteFile(dir_.File("job.yaml"), Job("[/bin/sh, -c]", "['kill -9 $$']", 2, 0));
  auto node0 = Agent(0), node1 = Agent(1);
  EXPECT_EQ(node0->Wait(kTimeout), 1) << node0->Stderr();
  EXPECT_EQ(node1->Wait(kTimeout), 1) << node1->Stderr();
  for (auto* a : {node0.get(), node1.get()}) {
    EXPECT_EQ(CountLines(a->Stderr(), "gang: restart "), 2) << a->Stderr();
    EXPECT_THAT(a->Stderr(), HasSubstr("restart 2 of 2"));
    EXPECT_THAT(a->Stderr(), Not(HasSubstr("restart 3")));
  }
  for (int n : {0, 1}) {
    auto t = nlohmann::json::parse(
        ReadFile(dir_.File("termination-" + std::to_string(n) + ".json")), nullptr, false);
    ASSERT_TRUE(t.is_object()) << n;
    EXPECT_EQ(t["restarts"], 2);
    EXPECT_EQ(t["reason"], "Killed");
  }
  EXPECT_THAT(node0->Stderr(), HasSubstr("gang: failed: "));
}

// Node 1's rank fails (exit 3: not retryable) and leaves a child that ignores SIGTERM, so
// node 1's agent is still stopping what its rank left (up to the grace period) when the gang's
// verdict comes and node 0's agent, the coordinator, exits. Node 1 reads the verdict it was
// sent before the connection closed: the job failed with rank 1's exit, not a lost coordinator
// (which would have it wait two minutes to rejoin and then say NodeLost).
TEST_F(GangAgentsTest, ANodeStillStoppingItsRanksWhenTheGangEndsReadsTheVerdict) {
  WriteFile(dir_.File("job.yaml"),
            Job("[/bin/sh, -c]",
                "['if [ \"$RANK\" = 1 ]; then (trap \"\" TERM; exec sleep 60) & exit 3; fi; "
                "exec sleep 60']",
                3, 0));
  auto node0 = Agent(0), node1 = Agent(1, {"--grace-period", "5"});
  EXPECT_EQ(node0->Wait(kTimeout), 1) << node0->Stderr();
  EXPECT_EQ(node1->Wait(kTimeout), 1) << node1->Stderr();
  EXPECT_THAT(node1->Stderr(), Not(HasSubstr("went away"))) << node1->Stderr();
  for (int n : {0, 1}) {
    auto t = nlohmann::json::parse(
        ReadFile(dir_.File("termination-" + std::to_string(n) + ".json")), nullptr, false);
    ASSERT_TRUE(t.is_object()) << n;
    EXPECT_EQ(t["reason"], "UserError") << n << ": " << t.dump();
    EXPECT_EQ(t["restarts"], 0) << n;
    EXPECT_EQ(t["rank"], 1) << n;
  }
}

// Rank 1 dies; rank 0's allreduce then fails and it blocks SIGTERM: its agent SIGKILLs it
// after the grace period and the gang restarts; the cause is the kill, not rank 0's error.
TEST_F(GangAgentsTest, ARankThatBlocksSigtermAfterItsPeerDiedIsStoppedAndTheGangRestarts) {
  WriteFile(dir_.File("job.yaml"),
            Job("[/usr/bin/python3, \"" GANG_DDP_PY "\"]", "[block, '30']", 3, 0));
  auto node0 = Agent(0, {"--grace-period", "2"}), node1 = Agent(1, {"--grace-period", "2"});
  ASSERT_EQ(node0->Wait(kTimeout), 0) << node0->Stderr() << node0->Stdout();
  ASSERT_EQ(node1->Wait(kTimeout), 0) << node1->Stderr();
  EXPECT_THAT(node0->Stdout(), HasSubstr("blocking SIGTERM"));
  EXPECT_THAT(node0->Stderr(), HasSubstr("restart 1 of 3 now; after: rank 1 (local rank 0, "
                                         "node 1) failed: exit code 137 (SIGKILL)"));
  std::smatch a, b;
  const std::string out0 = node0->Stdout(), out1 = node1->Stdout();
  std::regex params(R"(done restart=1 params=([-0-9.]+))");
  ASSERT_TRUE(std::regex_search(out0, a, params)) << out0;
  ASSERT_TRUE(std::regex_search(out1, b, params)) << out1;
  EXPECT_EQ(a[1], b[1]);
}

::testing::AssertionResult GangAgentsTest::StartTraining(const std::string& mode,
                                                         std::unique_ptr<TestProcess>* node0,
                                                         std::unique_ptr<TestProcess>* node1) {
  WriteFile(dir_.File("job.yaml"),
            Job("[/usr/bin/python3, \"" GANG_DDP_PY "\"]", "[" + mode + ", '400']", 3, 0));
  *node0 = Agent(0);
  *node1 = Agent(1);
  const bool training = WaitUntil(
      [&] {
        nlohmann::json s = Status(1);
        return s.is_object() && s["progress"].is_array() && !s["progress"].empty() &&
               s["progress"][0].value("steps", 0) >= 5;
      },
      kTimeout);
  if (training) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "node 1's rank made no 5 steps:\n" << (*node1)->Stderr();
}

// Node 0's agent, the coordinator, is stopped mid-attempt (its pod deleted: SIGTERM) and a
// new one starts knowing no restart: node 1's agent stops its ranks, rejoins the new
// coordinator, and the gang trains to the end in its next attempt, counted once. In MODE
// "linger" node 0's rank, on its SIGTERM, drops its connections at once and ends 3 s later,
// so node 1's rank fails (a collective error, exit 1: not retryable) while the old
// coordinator still runs: it must be gone by then, or its verdict fails the job.
void GangAgentsTest::CoordinatorReplaced(const std::string& mode) {
  std::unique_ptr<TestProcess> node0, node1;
  ASSERT_TRUE(StartTraining(mode, &node0, &node1));
  const pid_t pid1 = node1->pid();
  ::kill(node0->pid(), SIGTERM);
  EXPECT_EQ(node0->Wait(kTimeout), 128 + SIGTERM) << node0->Stderr();
  EXPECT_THAT(node0->Stderr(), HasSubstr("SIGTERM: the gang's coordinator closes now"));
  auto replacement = Agent(0);  // --restart-count 0: it has not seen the first attempt end
  ASSERT_EQ(node1->Wait(kTimeout), 0) << node1->Stderr();
  ASSERT_EQ(replacement->Wait(kTimeout), 0) << replacement->Stderr();
  EXPECT_EQ(node1->pid(), pid1);
  EXPECT_THAT(node1->Stderr(), HasSubstr("the gang's coordinator went away during attempt 0"));
  EXPECT_THAT(node1->Stderr(), HasSubstr("all ranks succeeded, restarts 1"));
  EXPECT_THAT(replacement->Stderr(), HasSubstr("all ranks succeeded, restarts 1"));
  std::smatch a, b;
  const std::string out0 = replacement->Stdout(), out1 = node1->Stdout();
  std::regex params(R"(done restart=1 params=([-0-9.]+))");
  ASSERT_TRUE(std::regex_search(out0, a, params)) << out0;
  ASSERT_TRUE(std::regex_search(out1, b, params)) << out1;
  EXPECT_EQ(a[1], b[1]);
}

TEST_F(GangAgentsTest, WhenTheCoordinatorsAgentIsReplacedTheOtherNodesRejoinAndTheCountHolds) {
  CoordinatorReplaced("steady");
}

TEST_F(GangAgentsTest, ACoordinatorStoppingSlowlyDecidesNothingOnTheFailuresItsStopCauses) {
  CoordinatorReplaced("linger");
}

// Node 1's agent is stopped mid-attempt (its pod deleted) while its rank lingers 3 s after
// dropping its connections: node 0's rank fails at once (a collective error, exit 1: not
// retryable); node 1 leaves the gang at its SIGTERM, so the coordinator counts it lost (the
// cause), restarts the gang when the new node 1's agent joins, and the job succeeds.
TEST_F(GangAgentsTest, ANodeWhoseAgentStopsSlowlyIsLostNotJudgedOnItsPeersErrors) {
  std::unique_ptr<TestProcess> node0, node1;
  ASSERT_TRUE(StartTraining("linger", &node0, &node1));
  ::kill(node1->pid(), SIGTERM);
  EXPECT_EQ(node1->Wait(kTimeout), 128 + SIGTERM) << node1->Stderr();
  EXPECT_THAT(node1->Stderr(), HasSubstr("SIGTERM: node 1 leaves the gang now"));
  auto replacement = Agent(1);
  ASSERT_EQ(node0->Wait(kTimeout), 0) << node0->Stderr();
  ASSERT_EQ(replacement->Wait(kTimeout), 0) << replacement->Stderr();
  EXPECT_THAT(node0->Stderr(), HasSubstr("all ranks succeeded, restarts 1"));
  EXPECT_THAT(replacement->Stderr(), HasSubstr("all ranks succeeded, restarts 1"));
  EXPECT_THAT(node0->Stderr(), Not(HasSubstr("not restarted")));
}

}  // namespace
}  // namespace spawnpoint::testing
