// The vfork spawner on real children: what the child inherits (descriptors, signal state,
// CPUs, process group) and how a step that fails in the child is reported. The child runs on
// the agent's memory and makes raw system calls only, so each of its steps is checked here
// by what the started program sees in /proc.
#include "agent/process/spawner.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/test_process.h"

namespace spawnpoint::agent {
namespace {

using spawnpoint::testing::ReadFile;
using spawnpoint::testing::TempDir;
using spawnpoint::testing::WriteFile;

// Waits for `pid` and returns its exit code (128+signal when killed).
int Reap(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// One line of /proc/<pid>/status as the started program saw it, e.g. "SigIgn:\t0...".
std::string StatusLine(const std::string& status, const std::string& key) {
  size_t at = status.find("\n" + key + ":");
  if (at == std::string::npos) return "";
  size_t end = status.find('\n', at + 1);
  std::string line = status.substr(at + 1, end - at - 1);
  size_t value = line.find_first_not_of(" \t", key.size() + 1);
  return value == std::string::npos ? "" : line.substr(value);
}

class SpawnerTest : public ::testing::Test {
 protected:
  // Runs `argv` with stdout into a file and returns what it printed; `exit_code` its code.
  std::string Run(SpawnOptions options, int* exit_code = nullptr) {
    const std::string out = dir_.File("out-" + std::to_string(runs_++));
    int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    EXPECT_GE(fd, 0);
    options.stdout_fd = fd;
    if (options.env.empty()) options.env = {"PATH=/usr/bin:/bin"};
    StatusOr<pid_t> pid = spawner_->Spawn(options);
    close(fd);
    EXPECT_TRUE(pid.ok()) << pid.status().ToString();
    if (!pid.ok()) return "";
    int code = Reap(*pid);
    if (exit_code != nullptr) *exit_code = code;
    return ReadFile(out);
  }

  std::unique_ptr<ProcessSpawner> spawner_ = MakeVforkSpawner();
  TempDir dir_;
  int runs_ = 0;
};

TEST_F(SpawnerTest, TheChildStartsWithNoIgnoredAndNoBlockedSignals) {
  // The agent ignores SIGPIPE and a thread may block signals; neither may reach a rank
  // (an ignored SIGPIPE survives exec and would turn a closed pipe into EPIPE loops).
  struct sigaction ignore {
  }, old_pipe{};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &old_pipe);
  sigset_t usr2, old_mask;
  sigemptyset(&usr2);
  sigaddset(&usr2, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &usr2, &old_mask);

  SpawnOptions options;
  options.argv = {"cat", "/proc/self/status"};
  std::string status = Run(options);

  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  sigaction(SIGPIPE, &old_pipe, nullptr);
  EXPECT_EQ(StatusLine(status, "SigIgn"), "0000000000000000") << status;
  EXPECT_EQ(StatusLine(status, "SigBlk"), "0000000000000000") << status;
}

// What ignored_signals asks for is ignored in the started program, and only that (SIGPIPE,
// which the agent ignores, stays at its default); the bit of signal n is 1 << (n - 1).
TEST_F(SpawnerTest, TheSignalsItIsToldToIgnoreAreIgnoredAfterExec) {
  struct sigaction ignore {
  }, old_pipe{};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &old_pipe);
  SpawnOptions options;
  options.argv = {"cat", "/proc/self/status"};
  options.ignored_signals = {SIGRTMIN + 6};
  std::string status = Run(options);
  sigaction(SIGPIPE, &old_pipe, nullptr);
  char expected[17];
  snprintf(expected, sizeof(expected), "%016llx", 1ULL << (SIGRTMIN + 6 - 1));
  EXPECT_EQ(StatusLine(status, "SigIgn"), expected) << status;
}

TEST_F(SpawnerTest, KeepsExactlyTheDescriptorsItIsGivenUnderTheirNewNumbers) {
  int moved[2], kept[2];
  ASSERT_EQ(pipe2(moved, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(kept, O_CLOEXEC), 0);
  // Opened without O_CLOEXEC, as a library might: the child must not see it.
  int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  int stray = fcntl(null_fd, F_DUPFD, 12);  // F_DUPFD's copy has no close-on-exec flag
  close(null_fd);
  ASSERT_GE(stray, 12);
  ASSERT_LT(kept[1], 9);  // sh's redirections take one digit

  SpawnOptions options;
  // kept[1] keeps its own number, so only its close-on-exec flag has to be cleared.
  options.inherit_fds = {{moved[1], 9}, {kept[1], kept[1]}};
  const std::string k = std::to_string(kept[1]), s = std::to_string(stray);
  options.argv = {"sh", "-c",
                  "echo moved >&9; echo kept >&" + k + "; test -e /proc/$$/fd/" + s +
                      " && echo stray-open || echo stray-closed"};
  int code = -1;
  std::string out = Run(options, &code);
  close(moved[1]);
  close(kept[1]);
  close(stray);
  char buf[64] = {};
  ssize_t n = read(moved[0], buf, sizeof(buf) - 1);
  EXPECT_EQ(std::string(buf, n > 0 ? n : 0), "moved\n");
  char buf2[64] = {};
  n = read(kept[0], buf2, sizeof(buf2) - 1);
  EXPECT_EQ(std::string(buf2, n > 0 ? n : 0), "kept\n");
  EXPECT_EQ(out, "stray-closed\n");
  EXPECT_EQ(code, 0);
  close(moved[0]);
  close(kept[0]);
}

TEST_F(SpawnerTest, TheChildLeadsItsOwnProcessGroupAndRunsOnTheGivenCpus) {
  SpawnOptions options;
  options.cpus = {0};
  options.argv = {"cat", "/proc/self/status", "/proc/self/stat"};
  std::string out = Run(options);
  EXPECT_EQ(StatusLine(out, "Cpus_allowed_list"), "0") << out;
  // /proc/self/stat: "pid (comm) state ppid pgrp ..."; cat is the group's leader.
  size_t stat_at = out.rfind(") ");
  ASSERT_NE(stat_at, std::string::npos);
  int pid = 0, ppid = 0, pgrp = 0;
  char state = 0;
  size_t open_paren = out.rfind(" (", stat_at);
  size_t line_start = out.rfind('\n', open_paren);
  line_start = line_start == std::string::npos ? 0 : line_start + 1;
  pid = std::stoi(out.substr(line_start, open_paren - line_start));
  ASSERT_EQ(sscanf(out.c_str() + stat_at + 2, "%c %d %d", &state, &ppid, &pgrp), 3);
  EXPECT_EQ(pgrp, pid);
  EXPECT_EQ(ppid, getpid());
}

TEST_F(SpawnerTest, AMissingWorkingDirectoryNamesTheStepAndItsError) {
  SpawnOptions options;
  options.argv = {"true"};
  options.env = {"PATH=/usr/bin:/bin"};
  options.working_dir = dir_.File("no-such-dir");
  StatusOr<pid_t> pid = spawner_->Spawn(options);
  ASSERT_FALSE(pid.ok());
  EXPECT_NE(pid.status().ToString().find("chdir: No such file or directory"), std::string::npos)
      << pid.status().ToString();
}

TEST_F(SpawnerTest, AFileTheKernelCannotExecuteNamesExecveAndItsError) {
  // Executable bits, but neither ELF nor "#!": the child's execve fails with ENOEXEC.
  const std::string bad = dir_.File("not-a-program");
  WriteFile(bad, "\x01\x02\x03 not a program\n");
  ASSERT_EQ(chmod(bad.c_str(), 0755), 0);
  SpawnOptions options;
  options.argv = {bad};
  StatusOr<pid_t> pid = spawner_->Spawn(options);
  ASSERT_FALSE(pid.ok());
  EXPECT_NE(pid.status().ToString().find("execve: Exec format error"), std::string::npos)
      << pid.status().ToString();
  EXPECT_NE(pid.status().ToString().find(bad), std::string::npos);
}

TEST_F(SpawnerTest, ADescriptorThatIsNotOpenNamesDup2) {
  SpawnOptions options;
  options.argv = {"true"};
  options.inherit_fds = {{987654, 5}};
  StatusOr<pid_t> pid = spawner_->Spawn(options);
  ASSERT_FALSE(pid.ok());
  EXPECT_NE(pid.status().ToString().find("dup2: Bad file descriptor"), std::string::npos)
      << pid.status().ToString();
}

TEST_F(SpawnerTest, ManySpawnsFromSeveralThreadsLeaveNoDescriptorOrChildBehind) {
  // Every spawn path (success and each failure) ends with the agent's descriptors as they
  // were and every child reaped: the spawner is called from the supervisors' threads.
  auto fds = [] {
    int n = 0;
    for (int fd = 0; fd < 1024; ++fd) n += fcntl(fd, F_GETFD) >= 0 ? 1 : 0;
    return n;
  };
  const int before = fds();
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      std::unique_ptr<ProcessSpawner> spawner = MakeVforkSpawner();
      for (int i = 0; i < 50; ++i) {
        SpawnOptions options;
        options.env = {"PATH=/usr/bin:/bin"};
        options.argv = {"true"};
        if (i % 5 == 4) options.working_dir = "/no/such/dir";
        StatusOr<pid_t> pid = spawner->Spawn(options);
        if (i % 5 == 4) {
          if (pid.ok()) failures++;
          continue;
        }
        if (!pid.ok() || Reap(*pid) != 0) failures++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(fds(), before);
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1);  // no child left: ECHILD
}

}  // namespace
}  // namespace spawnpoint::agent
