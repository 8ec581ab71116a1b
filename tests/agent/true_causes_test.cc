// Causes that are true (issue 39), through the real agent: a missing script is a located
// error of `plan` and `run` (exit 2, nothing started); the job's rendezvous port held by
// another process fails `run` before anything starts (exit 1, PortInUse, its holder named);
// a rank that hits EADDRINUSE is PortInUse with its port and holder, not CollectiveTimeout;
// a rank the Python shim stops is quoted in the shim's words.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/test_process.h"

namespace spawnpoint::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr std::chrono::milliseconds kTimeout{120'000};
constexpr const char* kPython = "/usr/bin/python3";  // Debian's, with torch

// A 1-node job of `ranks` CPU ranks running `command` + `args` (each a JSON string, which
// YAML reads as a double-quoted scalar), with `restart` as its restartPolicy and `extra`
// lines at its end (the container's, indented 8; the spec's, indented 2).
std::string Job(const std::vector<std::string>& command, const std::vector<std::string>& args,
                int ranks = 1, const std::string& extra = "",
                const std::string& restart = "{maxRestarts: 0}") {
  auto list = [](const std::vector<std::string>& items) {
    std::string out;
    for (const std::string& a : items) out += (out.empty() ? "" : ", ") + nlohmann::json(a).dump();
    return out;
  };
  return "apiVersion: spawnpoint.dev/v1alpha1\n"
         "kind: TrainingJob\n"
         "metadata: {name: causes}\n"
         "spec:\n"
         "  procsPerNode: " +
         std::to_string(ranks) +
         "\n"
         "  loader: {workersPerRank: 0}\n"
         "  restartPolicy: " +
         restart +
         "\n"
         "  template:\n"
         "    spec:\n"
         "      containers:\n"
         "      - name: trainer\n"
         "        image: x\n"
         "        command: [" +
         list(command) +
         "]\n"  // line 13
         "        args: [" +
         list(args) + "]\n" + extra;  // line 14
}

// A TCP socket listening on 0.0.0.0 at a port the kernel picks, held for the test.
class HeldPort {
 public:
  HeldPort() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    socklen_t len = sizeof(addr);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), len), 0);
    EXPECT_EQ(listen(fd_, 1), 0);
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
  }
  ~HeldPort() { close(fd_); }
  int port() const { return port_; }
  std::string Port() const { return std::to_string(port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

class TrueCausesTest : public ::testing::Test {
 protected:
  // `spawnpoint-agent <verb> -f job.yaml <flags>` in the test's directory; its exit code.
  int Agent(const std::string& verb, std::vector<std::string> flags = {"--master-port", "0"}) {
    std::vector<std::string> argv = {AGENT_BIN,
                                     verb,
                                     "-f",
                                     dir_.File("job.yaml"),
                                     "--gpu-backend",
                                     "none",
                                     "--metrics-addr",
                                     "off",
                                     "--termination-log",
                                     dir_.File("termination-log")};
    argv.insert(argv.end(), flags.begin(), flags.end());
    agent_ = std::make_unique<TestProcess>(argv, std::map<std::string, std::string>{}, dir_.path());
    return agent_->Wait(kTimeout);
  }
  nlohmann::json TerminationLog() {
    return nlohmann::json::parse(ReadFile(dir_.File("termination-log")), nullptr, false);
  }
  TempDir dir_;
  std::unique_ptr<TestProcess> agent_;
};

TEST_F(TrueCausesTest, AMissingScriptIsALocatedErrorOfPlanAndRunAndNothingStarts) {
  WriteFile(dir_.File("train.py"), "\n");
  WriteFile(dir_.File("job.yaml"), Job({kPython, "-u"}, {"trian.py", "--epochs", "1"}, 2));
  for (const char* verb : {"plan", "run"}) {
    EXPECT_EQ(Agent(verb), 2) << verb << ": " << agent_->Stderr();
    EXPECT_EQ(agent_->Stderr(),
              "[spawnpoint] error: " + dir_.File("job.yaml") +
                  ":14:16: spec.template.spec.containers[0].args[0]: the script \"trian.py\" "
                  "does not exist in " +
                  dir_.path() +
                  " (the agent's working directory: the container sets no workingDir): every "
                  "rank would exit 2 (\"can't open file\"), so nothing was started; Python "
                  "files there: train.py\n")
        << verb;
    // Nothing else: no rank's "can't open file", no plan on stdout.
    EXPECT_EQ(agent_->Stdout(), "") << verb;
  }
  EXPECT_FALSE(std::filesystem::exists(dir_.File("termination-log")));
}

TEST_F(TrueCausesTest, ATorchrunCommandsMissingScriptIsLocatedAgainstItsWorkingDir) {
  std::filesystem::create_directories(dir_.File("proj"));
  WriteFile(dir_.File("job.yaml"),
            Job({"torchrun", "--nproc_per_node=1"}, {"src/train.py", "--lr", "1"}, 1,
                "        workingDir: " + dir_.File("proj") + "\n"));
  EXPECT_EQ(Agent("plan"), 2) << agent_->Stderr();
  EXPECT_THAT(agent_->Stderr(),
              HasSubstr("job.yaml:14:16: spec.template.spec.containers[0].args[0]: the script "
                        "\"src/train.py\" does not exist in " +
                        dir_.File("proj") + " (the container's workingDir)"));
  // There, it plans: the check is of that path, not of the agent's directory.
  std::filesystem::create_directories(dir_.File("proj/src"));
  WriteFile(dir_.File("proj/src/train.py"), "\n");
  EXPECT_EQ(Agent("plan"), 0) << agent_->Stderr();
}

// `spawnpoint-agent torchrun` (no manifest): the same check, without a manifest's location.
TEST_F(TrueCausesTest, ATorchrunCommandLinesMissingScriptExitsTwo) {
  for (const bool plan : {true, false}) {
    std::vector<std::string> argv = {AGENT_BIN, "torchrun", "--nproc_per_node=1", "trian.py"};
    if (plan) argv.insert(argv.begin() + 2, "--plan");
    agent_ = std::make_unique<TestProcess>(argv, std::map<std::string, std::string>{}, dir_.path());
    EXPECT_EQ(agent_->Wait(kTimeout), 2) << plan << ": " << agent_->Stderr();
    EXPECT_EQ(agent_->Stderr(), "[spawnpoint] error: the script \"trian.py\" does not exist in " +
                                    dir_.path() +
                                    " (the agent's working directory): every rank would exit 2 "
                                    "(\"can't open file\"), so nothing was started\n")
        << plan;
    EXPECT_EQ(agent_->Stdout(), "") << plan;
  }
}

TEST_F(TrueCausesTest, TheRendezvousPortInUseFailsRunBeforeAnythingStarts) {
  HeldPort held;
  WriteFile(dir_.File("job.yaml"), Job({"/bin/sh", "-c", "touch started"}, {}, 2));
  EXPECT_EQ(Agent("run", {"--master-port", held.Port()}), 1) << agent_->Stderr();
  EXPECT_THAT(agent_->Stderr(),
              HasSubstr("[spawnpoint] error: port " + held.Port() +
                        ", the job's rendezvous port (MASTER_PORT), is already in use on this "
                        "node, held by pid " +
                        std::to_string(getpid()) + " ("));
  EXPECT_FALSE(std::filesystem::exists(dir_.File("started"))) << "a rank ran";
  nlohmann::json log = TerminationLog();
  ASSERT_TRUE(log.is_object());
  EXPECT_EQ(log["reason"], "PortInUse");
  EXPECT_EQ(log["exitCode"], 1);
  EXPECT_EQ(log["retryable"], false) << "not by default";
  EXPECT_THAT(log["message"].get<std::string>(), StartsWith("port " + held.Port() + ", the"));
  // The manifest's own port, and a retryOn that names the cause.
  WriteFile(dir_.File("job.yaml"),
            Job({"/bin/sh", "-c", "touch started"}, {}, 2,
                "  rendezvous: {port: " + held.Port() + "}\n", "{retryOn: [PortInUse]}"));
  EXPECT_EQ(Agent("run", {}), 1) << agent_->Stderr();
  EXPECT_FALSE(std::filesystem::exists(dir_.File("started"))) << "a rank ran";
  log = TerminationLog();
  EXPECT_EQ(log["reason"], "PortInUse");
  EXPECT_EQ(log["retryable"], true);
}

// What a rank prints when a port it listens on is taken: torch 1.13's TCPStore (the job's own
// MASTER_PORT is free: the script hard-codes another), and Python's own OSError.
TEST_F(TrueCausesTest, ARankThatHitsEaddrinuseIsPortInUseNamingThePortAndItsHolder) {
  HeldPort held;
  WriteFile(dir_.File("store.py"),
            "import datetime, sys\n"
            "import torch.distributed as dist\n"
            "timeout = datetime.timedelta(seconds=10)\n"
            "store = dist.TCPStore('127.0.0.1', int(sys.argv[1]), 1, True, timeout)\n");
  WriteFile(dir_.File("job.yaml"), Job({kPython, "store.py"}, {held.Port()}));
  EXPECT_EQ(Agent("run"), 1) << agent_->Stderr();
  nlohmann::json log = TerminationLog();
  ASSERT_TRUE(log.is_object());
  EXPECT_EQ(log["reason"], "PortInUse") << log.dump();
  EXPECT_EQ(log["exitCode"], 1);
  EXPECT_THAT(log["message"].get<std::string>(),
              StartsWith("port in use: port " + held.Port() + ", held by pid " +
                         std::to_string(getpid()) + " ("));
  EXPECT_THAT(log["line"].get<std::string>(), HasSubstr("Address already in use"));
  EXPECT_THAT(agent_->Stderr(), HasSubstr("reason PortInUse: port in use: port " + held.Port()));

  WriteFile(dir_.File("job.yaml"), Job({kPython, "-c",
                                        "import socket, sys\n"
                                        "socket.socket().bind(('0.0.0.0', int(sys.argv[1])))\n",
                                        held.Port()},
                                       {}));
  EXPECT_EQ(Agent("run"), 1) << agent_->Stderr();
  log = TerminationLog();
  EXPECT_EQ(log["reason"], "PortInUse") << log.dump();
  EXPECT_EQ(log["line"], "OSError: [Errno 98] Address already in use");
  EXPECT_EQ(log["exception"], "OSError");
}

// A script that starts a spawn Pool at its top level without a main guard: the shim stops
// the rank with one line, and the verdict quotes that line, not "exited with code 1".
TEST_F(TrueCausesTest, ARankTheShimStopsIsQuotedInTheShimsWords) {
  WriteFile(dir_.File("pool.py"),
            "import multiprocessing\n"
            "\n"
            "def square(x):\n"
            "    return x * x\n"
            "\n"
            "with multiprocessing.get_context('spawn').Pool(2) as pool:\n"
            "    print(pool.map(square, range(4)))\n");
  WriteFile(dir_.File("job.yaml"), Job({kPython, "pool.py"}, {}));
  EXPECT_EQ(Agent("run"), 1) << agent_->Stderr();
  nlohmann::json log = TerminationLog();
  ASSERT_TRUE(log.is_object());
  EXPECT_EQ(log["reason"], "UserError");
  const std::string line = log.value("line", "");
  EXPECT_THAT(line, StartsWith("spawnpoint-shim: fatal: pool.py:6 starts a spawn process at the "
                               "script's top level"));
  EXPECT_THAT(log["message"].get<std::string>(),
              StartsWith("the shim stopped the rank: \"" + line + "\" (exit code 1)"));
  EXPECT_THAT(agent_->Stderr(), Not(HasSubstr("exited with code 1")));
}

}  // namespace
}  // namespace spawnpoint::testing
