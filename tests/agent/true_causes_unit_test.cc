// Causes that are true (issue 39), piece by piece: the patterns read what a program printed,
// never the code a traceback or a warning quotes; EADDRINUSE is PortInUse with its port and
// its holder (a fake /proc tree, and a socket this test holds); the rendezvous port is tried
// before anything starts; a Python command's missing script is a located error.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "agent/run/preflight.h"
#include "agent/supervisor/failure_cause.h"
#include "agent/supervisor/port_holder.h"
#include "api/torchrun_command.h"
#include "api/training_job.h"
#include "tests/support/test_process.h"

namespace spawnpoint::agent {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using testing::TempDir;
using testing::WriteFile;

// What torch 1.13's init_process_group prints when MASTER_PORT is taken (captured from
// Debian's python3-torch): its quoted source line has both "timeout" and "c10d".
const std::vector<std::string> kTorch113PortInUse = {
    "[W socket.cpp:426] [c10d] The server socket has failed to bind to [::]:29500 (errno: 98 - "
    "Address already in use).",
    "Traceback (most recent call last):",
    "  File \"/tmp/train.py\", line 11, in <module>",
    "    dist.init_process_group(\"gloo\", timeout=timedelta(seconds=5))",
    "  File \"/usr/lib/python3/dist-packages/torch/distributed/rendezvous.py\", line 246, in "
    "_env_rendezvous_handler",
    "    store = _create_c10d_store(master_addr, master_port, rank, world_size, timeout)",
    "            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    "RuntimeError: The server socket has failed to listen on any local network address. The "
    "server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use). The "
    "server socket has failed to bind to 0.0.0.0:29500 (errno: 98 - Address already in use)."};

TEST(QuotedSourceTest, ATimeoutInATracebacksSourceLineIsNoCollectiveTimeout) {
  auto m = MatchTail(
      {"Traceback (most recent call last):", "  File \"train.py\", line 40, in <module>",
       "    store = _create_c10d_store(addr, port, rank, world, timeout)",
       "            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
       "  File \"train.py\", line 12, in _create_c10d_store",
       "    raise ValueError(\"no gloo timeout given\")", "ValueError: bad world size 0"});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->reason, ExitReason::kUserError);
  EXPECT_EQ(m->line, "ValueError: bad world size 0");
  // An exception group's frames, behind their "  | " margin, are quoted code too.
  m = MatchTail({"  + Exception Group Traceback (most recent call last):",
                 "  |   File \"t.py\", line 3, in <module>", "  |     wait(gloo_timeout)",
                 "  | ExceptionGroup: two (2 sub-exceptions)"});
  EXPECT_FALSE(m && m->reason == ExitReason::kCollectiveTimeout) << m->line;
  // The source line a warning quotes under its own line.
  m = MatchTail({"/tmp/t.py:9: UserWarning: slow start",
                 "  pg = new_group(backend=\"gloo\", timeout=t)", "ValueError: boom"});
  EXPECT_FALSE(m && m->reason == ExitReason::kCollectiveTimeout) << m->line;
}

TEST(QuotedSourceTest, ProgramsOwnLinesAndTheExceptionLineStillMatch) {
  // A non-Python program's plain error lines, indented or not.
  auto m = MatchTail({"trainer: step 7", "  gloo: Timed out waiting 30000ms for recv"});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->reason, ExitReason::kCollectiveTimeout);
  // After a frame and its source, a line indented less than the source is the program's own.
  m = MatchTail({"  File \"t.py\", line 3, in f", "    x = 1",
                 "  NCCL error: unhandled system error, NCCL version 2.18"});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->reason, ExitReason::kCollectiveError);
  // The exception line of a traceback.
  m = MatchTail({"Traceback (most recent call last):", "  File \"t.py\", line 3, in f",
                 "    dist.barrier()",
                 "RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
                 "1800000ms for recv operation to complete"});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->reason, ExitReason::kCollectiveTimeout);
  EXPECT_EQ(m->exception, "RuntimeError");
}

TEST(PortInUseTest, Torch113sTracebackIsPortInUseNamingThePort) {
  auto m = MatchTail(kTorch113PortInUse);
  ASSERT_TRUE(m);
  EXPECT_EQ(ExitReasonName(m->reason), std::string("PortInUse"));
  EXPECT_EQ(m->port, 29500);
  EXPECT_EQ(m->exception, "RuntimeError");
  EXPECT_THAT(m->line, StartsWith("RuntimeError: The server socket has failed to listen"));
  EXPECT_THAT(m->message, StartsWith("port in use: port 29500: \"RuntimeError: The server"));
  EXPECT_THAT(m->advice, HasSubstr("spec.rendezvous.port"));
  // Without the rank's own warning line too (the traceback alone).
  auto alone = MatchTail({kTorch113PortInUse.begin() + 1, kTorch113PortInUse.end()});
  ASSERT_TRUE(alone);
  EXPECT_EQ(alone->reason, ExitReason::kPortInUse);
}

TEST(PortInUseTest, Torch2sGlooAndPythonsWordingsArePortInUse) {
  struct Case {
    std::string line;
    int port;
  } cases[] = {
      // torch 2.4+, TCPStore on libuv.
      {"torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
       "network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: "
       "address already in use",
       29500},
      {"RuntimeError: The server socket has failed to listen on any local network address. port: "
       "29511, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use",
       29511},
      // torch 2.0-2.3's socket.cpp.
      {"torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
       "network address. The server socket has failed to bind to [::]:29400 (errno: 98 - Address "
       "already in use). The server socket has failed to bind to 0.0.0.0:29400 (errno: 98 - "
       "Address already in use).",
       29400},
      {"RuntimeError: [../third_party/gloo/gloo/transport/tcp/socket.cc:95] bind: Address already "
       "in use",
       0},
      {"OSError: [Errno 98] Address already in use", 0},
  };
  for (const Case& c : cases) {
    auto m = MatchTail({"Traceback (most recent call last):", "  File \"t.py\", line 1", c.line});
    ASSERT_TRUE(m) << c.line;
    EXPECT_EQ(m->reason, ExitReason::kPortInUse) << c.line;
    EXPECT_EQ(m->port, c.port) << c.line;
    EXPECT_EQ(m->line, c.line);
  }
}

TEST(PortInUseTest, TheMessageNamesTheHolderAndRetryOnCanNameIt) {
  auto m = MatchTail(kTorch113PortInUse);
  ASSERT_TRUE(m);
  AddPortHolders(&*m, "held by pid 4242 (python3)");
  EXPECT_THAT(m->message, StartsWith("port in use: port 29500, held by pid 4242 (python3): \""));
  ExitStatus exited{1, 0};
  ExitCause c = RefineWithTail(ClassifyExit(exited, 0, 0), exited, m);
  EXPECT_EQ(c.reason, ExitReason::kPortInUse);
  EXPECT_THAT(c.message, HasSubstr("(exit code 1): another process on this node listens"));
  // Nothing to add when the line names no port.
  auto bare = MatchTail({"OSError: [Errno 98] Address already in use"});
  ASSERT_TRUE(bare);
  const std::string before = bare->message;
  AddPortHolders(&*bare, "held by pid 1 (x)");
  EXPECT_EQ(bare->message, before);
  EXPECT_EQ(ExitReasonFromName("PortInUse"), ExitReason::kPortInUse);
}

TEST(ShimStopTest, TheShimsFatalLineIsQuotedOverWhatCameBefore) {
  const std::string shim =
      "spawnpoint-shim: fatal: train.py:12 starts DataLoader workers at the script's top level; "
      "under spawn each child process imports the script";
  auto m = MatchTail({"spawnpoint: step() is a no-op here (x: y)", "epoch 0",
                      "RuntimeError: CUDA error: out of memory", shim});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->reason, ExitReason::kUserError);
  EXPECT_EQ(m->line, shim);
  EXPECT_EQ(m->exception, "");
  EXPECT_EQ(m->message, "the shim stopped the rank: \"" + shim + "\"");
}

// A fake /proc: LISTEN sockets (st 0A) on port 30000 (0x7530) in tcp and tcp6, one that is
// not listening on it, and processes holding each, one of them unreadable.
class FakeProc {
 public:
  FakeProc() {
    namespace fs = std::filesystem;
    fs::create_directories(Path("net"));
    const std::string header =
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
        "timeout inode\n";
    WriteFile(Path("net/tcp"),
              header +
                  "   0: 00000000:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000  "
                  "1000        0 1234 1 0000000000000000 100 0 0 10 0\n"
                  "   1: 0100007F:7530 0100007F:A000 01 00000000:00000000 00:00000000 00000000  "
                  "1000        0 999 1 0000000000000000 20 4 30 10 -1\n"
                  "   2: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  "
                  "1000        0 777 1 0000000000000000 100 0 0 10 0\n");
    WriteFile(Path("net/tcp6"),
              header +
                  "   0: 00000000000000000000000000000000:7530 "
                  "00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 "
                  "00000000  1000        0 5678 1 0000000000000000 100 0 0 10 0\n");
    Process(100, "python3", "socket:[1234]");
    Process(200, "curl", "socket:[999]");
    Process(300, "server", "socket:[5678]");
    Process(400, "web", "socket:[777]");
    fs::create_directories(Path("500"));  // no fd/: another user's
  }
  std::string root() const { return dir_.path(); }

 private:
  std::string Path(const std::string& rel) const { return dir_.File(rel); }
  void Process(int pid, const std::string& comm, const std::string& socket) {
    const std::string p = std::to_string(pid);
    std::filesystem::create_directories(Path(p + "/fd"));
    WriteFile(Path(p + "/comm"), comm + "\n");
    std::filesystem::create_symlink("/dev/null", Path(p + "/fd/0"));
    std::filesystem::create_symlink(socket, Path(p + "/fd/7"));
  }
  TempDir dir_;
};

TEST(PortHolderTest, ListenersOnThePortAndTheirHoldersFromAFakeProc) {
  FakeProc proc;
  PortListeners l = FindPortListeners(30000, proc.root());
  EXPECT_TRUE(l.listening);
  ASSERT_EQ(l.holders.size(), 2u);
  EXPECT_EQ(l.holders[0].pid, 100);
  EXPECT_EQ(l.holders[0].command, "python3");
  EXPECT_EQ(l.holders[1].pid, 300);  // its IPv6 socket
  EXPECT_EQ(DescribePortHolders(l), "held by pid 100 (python3), pid 300 (server)");
  // Nobody listens on 30001; 8080's listener is held by pid 400.
  EXPECT_FALSE(FindPortListeners(30001, proc.root()).listening);
  EXPECT_EQ(DescribePortHolders(FindPortListeners(30001, proc.root())), "");
  EXPECT_EQ(DescribePortHolders(FindPortListeners(8080, proc.root())), "held by pid 400 (web)");
  // A listener no readable process holds.
  PortListeners unseen{.listening = true};
  EXPECT_THAT(DescribePortHolders(unseen), StartsWith("held by a process this agent cannot see"));
}

// A TCP socket listening on the wildcard address at a port the kernel picks; closed at the end.
class HeldPort {
 public:
  explicit HeldPort(int family = AF_INET) {
    fd_ = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_storage ss{};
    socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    ss.ss_family = static_cast<sa_family_t>(family);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&ss), len), 0);
    EXPECT_EQ(listen(fd_, 1), 0);
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &len), 0);
    port_ = ntohs(family == AF_INET ? reinterpret_cast<sockaddr_in*>(&ss)->sin_port
                                    : reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  }
  ~HeldPort() { Close(); }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST(PortHolderTest, ThisProcessIsFoundHoldingARealSocket) {
  HeldPort held;
  PortListeners l = FindPortListeners(held.port());
  EXPECT_TRUE(l.listening);
  ASSERT_EQ(l.holders.size(), 1u);
  EXPECT_EQ(l.holders[0].pid, getpid());
  std::ifstream comm("/proc/self/comm");
  std::string name;
  std::getline(comm, name);
  EXPECT_EQ(l.holders[0].command, name);
}

TEST(RendezvousPortTest, APortThisTestHoldsIsInUseNamingItsHolder) {
  for (int family : {AF_INET, AF_INET6}) {
    HeldPort held(family);
    const std::string port = std::to_string(held.port());
    std::optional<std::string> busy = RendezvousPortInUse(held.port(), /*self=*/0);
    ASSERT_TRUE(busy) << "family " << family;
    EXPECT_THAT(*busy, StartsWith("port " + port +
                                  ", the job's rendezvous port (MASTER_PORT), "
                                  "is already in use on this node, held by pid " +
                                  std::to_string(getpid())));
    EXPECT_THAT(*busy, HasSubstr("spec.rendezvous.port, or --master-port"));
    // The agent's own socket is the ranks': not in use.
    EXPECT_FALSE(RendezvousPortInUse(held.port(), getpid()));
    held.Close();
    EXPECT_FALSE(RendezvousPortInUse(held.port(), 0)) << "closed, it is free";
  }
  EXPECT_FALSE(RendezvousPortInUse(0, 0)) << "--master-port 0: a free port, picked later";
}

api::TrainerContainer Trainer(std::vector<std::string> command, std::vector<std::string> args = {},
                              std::string working_dir = "") {
  api::TrainerContainer t;
  t.command = std::move(command);
  t.args = std::move(args);
  t.working_dir = std::move(working_dir);
  for (size_t i = 0; i < t.command.size(); ++i) {
    t.argv_origins.push_back("job.yaml:9:" + std::to_string(i) + ": command[" + std::to_string(i) +
                             "]");
  }
  for (size_t i = 0; i < t.args.size(); ++i) {
    t.argv_origins.push_back("job.yaml:10:" + std::to_string(i) + ": args[" + std::to_string(i) +
                             "]");
  }
  return t;
}

TEST(CheckScriptTest, AMissingScriptIsLocatedAndNamesItsDirectory) {
  TempDir dir;
  WriteFile(dir.File("train.py"), "print(1)\n");
  EXPECT_TRUE(CheckScript(Trainer({"python3", "-u", "train.py"}), dir.path()).ok());
  Status s = CheckScript(Trainer({"python3"}, {"-u", "-W", "ignore", "trian.py", "--lr", "1"}),
                         dir.path());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "job.yaml:10:3: args[3]: the script \"trian.py\" does not exist in " +
                             dir.path() +
                             " (the agent's working directory: the container sets no "
                             "workingDir): every rank would exit 2 (\"can't open file\"), so "
                             "nothing was started; Python files there: train.py");
  // workingDir, relative to the agent's directory; `env` before the interpreter.
  std::filesystem::create_directories(dir.File("proj"));
  s = CheckScript(Trainer({"/usr/bin/env", "A=1", "python3.11", "src/x.py"}, {}, "proj"),
                  dir.path());
  EXPECT_THAT(s.message(), StartsWith("job.yaml:9:3: command[3]: the script \"src/x.py\" does "
                                      "not exist in " +
                                      dir.File("proj") + " (the container's workingDir)"));
  // An absolute path.
  s = CheckScript(Trainer({"python3", dir.File("gone.py")}), "/");
  EXPECT_THAT(s.message(), HasSubstr("the script \"" + dir.File("gone.py") + "\" does not exist:"));
  // No origins (a command line's job): the script, where it was looked for.
  api::TrainerContainer bare = Trainer({"python3", "gone.py"});
  bare.argv_origins.clear();
  EXPECT_THAT(CheckScript(bare, dir.path()).message(),
              StartsWith("the script \"gone.py\" does not exist in " + dir.path() +
                         " (the agent's working directory): every rank"));
}

TEST(CheckScriptTest, ATorchrunCommandsScriptIsLocatedWhereItWasWritten) {
  TempDir dir;
  auto job = api::ParseTrainingJobs(
      "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: t}\n"
      "spec:\n  template:\n    spec:\n      containers:\n      - name: trainer\n"
      "        image: x\n"
      "        command: [torchrun, --nproc_per_node, \"2\"]\n"
      "        args: [missing.py, --, --lr, \"1\"]\n",
      "job.yaml");
  ASSERT_TRUE(job.ok()) << job.status().message();
  ASSERT_TRUE((*job)[0].spec.trainer.torchrun);
  Status s = CheckScript((*job)[0].spec.trainer, dir.path());
  EXPECT_THAT(s.message(), StartsWith("job.yaml:11:16: spec.template.spec.containers[0].args[0]: "
                                      "the script \"missing.py\" does not exist in " +
                                      dir.path()));
}

TEST(CheckScriptTest, WhatIsNotCertainlyAScriptFileIsNotChecked) {
  TempDir dir;
  for (const auto& argv :
       std::vector<std::vector<std::string>>{{"python3", "-m", "missing.module"},
                                             {"python3", "-c", "import missing"},
                                             {"python3", "-"},
                                             {"python3"},
                                             {"bash", "-c", "python3 missing.py"},
                                             {"sh", "missing.sh"},
                                             {"./trainer", "missing.py"},
                                             {"env", "-i", "python3", "missing.py"},
                                             {"python3", "--version"},
                                             {"torchrun", "-m", "missing.module"},
                                             {"torchrun", "--no_python", "missing-binary"}}) {
    api::TrainerContainer t = Trainer(argv);
    if (argv[0] == "torchrun") {
      size_t bad = 0;
      auto parsed = api::ParseTorchrunCommand(argv, "", &bad);
      ASSERT_TRUE(parsed.ok() && parsed->has_value());
      t.torchrun = **parsed;
      t.command = t.torchrun->RankArgv();
    }
    EXPECT_TRUE(CheckScript(t, dir.path()).ok()) << nlohmann::json(argv).dump();
  }
}

}  // namespace
}  // namespace spawnpoint::agent
