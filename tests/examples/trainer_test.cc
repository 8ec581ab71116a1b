// Runs spawnpoint-example-trainer as real ranks, the way torchrun or the agent would, and
// checks what a supervisor and a user rely on: exit codes, the final lines, and that data
// parallelism is actually correct (identical parameters on every rank, a falling loss).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <ostream>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/free_port.h"

extern char** environ;

namespace {

using Env = std::map<std::string, std::string>;

struct Result {
  int exit_code = -1;  // valid when term_signal == 0
  int term_signal = 0;
  bool timed_out = false;
  std::string out;
  std::string err;
};

// The parent environment minus anything a launcher might have set for us (this test could
// itself run under torchrun), so each case controls exactly what the trainer sees.
Env BaseEnv() {
  static const char* const kScrubbed[] = {"RANK",
                                          "LOCAL_RANK",
                                          "WORLD_SIZE",
                                          "LOCAL_WORLD_SIZE",
                                          "MASTER_ADDR",
                                          "MASTER_PORT",
                                          "GROUP_RANK",
                                          "NODE_RANK",
                                          "NNODES",
                                          "TORCHELASTIC_RESTART_COUNT",
                                          "TORCHELASTIC_USE_AGENT_STORE",
                                          "SPAWNPOINT_BACKEND",
                                          "OMP_NUM_THREADS",
                                          "GLOO_SOCKET_IFNAME"};
  Env env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const char* k : kScrubbed) env.erase(k);
  return env;
}

using spawnpoint::testing::FreePort;

Env RankEnv(int rank, int world, int port) {
  Env env = BaseEnv();
  env["RANK"] = std::to_string(rank);
  env["LOCAL_RANK"] = std::to_string(rank);
  env["WORLD_SIZE"] = std::to_string(world);
  env["LOCAL_WORLD_SIZE"] = std::to_string(world);
  env["MASTER_ADDR"] = "127.0.0.1";
  env["MASTER_PORT"] = std::to_string(port);
  return env;
}

struct Child {
  pid_t pid = -1;
  int out_fd = -1;
  int err_fd = -1;
  Result result;
};

Child Spawn(const std::vector<std::string>& args, const Env& env) {
  std::vector<std::string> argv_s = {SPAWNPOINT_TRAINER_PATH};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s;
  for (const auto& [k, v] : env) env_s.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);

  int out[2], err[2];
  EXPECT_EQ(pipe2(out, O_CLOEXEC), 0);
  EXPECT_EQ(pipe2(err, O_CLOEXEC), 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  Child c;
  int rc = posix_spawn(&c.pid, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  EXPECT_EQ(rc, 0) << "posix_spawn " << argv[0] << ": " << std::strerror(rc);
  close(out[1]);
  close(err[1]);
  c.out_fd = out[0];
  c.err_fd = err[0];
  return c;
}

// Collects every child's output until all pipes close, then reaps them. Past the deadline
// the stragglers are killed and marked timed out, so a hung rank fails the test quickly.
std::vector<Result> Wait(std::vector<Child> children, std::chrono::seconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  bool timed_out = false;
  while (true) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Child*, int*>> owners;
    for (auto& c : children) {
      for (int* fd : {&c.out_fd, &c.err_fd}) {
        if (*fd < 0) continue;
        fds.push_back({*fd, POLLIN, 0});
        owners.push_back({&c, fd});
      }
    }
    if (fds.empty()) break;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    int n = poll(fds.data(), fds.size(), static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ADD_FAILURE() << "poll: " << std::strerror(errno);
      timed_out = true;
      break;
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto [child, fd] = owners[i];
      char buf[4096];
      ssize_t got = read(*fd, buf, sizeof(buf));
      if (got > 0) {
        (fd == &child->out_fd ? child->result.out : child->result.err).append(buf, got);
      } else if (got == 0 || errno != EINTR) {
        close(*fd);
        *fd = -1;
      }
    }
  }
  std::vector<Result> results;
  for (auto& c : children) {
    if (timed_out) kill(c.pid, SIGKILL);
    int status = 0;
    waitpid(c.pid, &status, 0);
    for (int fd : {c.out_fd, c.err_fd}) {
      if (fd >= 0) close(fd);
    }
    c.result.timed_out = timed_out;
    if (WIFEXITED(status)) c.result.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) c.result.term_signal = WTERMSIG(status);
    results.push_back(c.result);
  }
  return results;
}

Result RunOne(const std::vector<std::string>& args, const Env& env,
              std::chrono::seconds timeout = std::chrono::seconds(30)) {
  std::vector<Child> c;
  c.push_back(Spawn(args, env));
  return Wait(std::move(c), timeout)[0];
}

std::vector<Result> RunWorld(int world, const std::vector<std::string>& args,
                             std::chrono::seconds timeout = std::chrono::seconds(60)) {
  int port = FreePort();
  std::vector<Child> children;
  for (int r = 0; r < world; ++r) children.push_back(Spawn(args, RankEnv(r, world, port)));
  return Wait(std::move(children), timeout);
}

std::string Describe(const Result& r) {
  return "exit=" + std::to_string(r.exit_code) + " signal=" + std::to_string(r.term_signal) +
         (r.timed_out ? " TIMED OUT" : "") + "\n--- stdout\n" + r.out + "--- stderr\n" + r.err;
}

struct Final {
  int rank;
  double loss;
  std::string params;
};

std::vector<Final> FinalLines(const std::string& out) {
  static const std::regex re(R"(^final rank=(\d+) loss=(\d+\.\d{6}) params=([0-9a-f]{16})$)");
  std::vector<Final> finals;
  std::smatch m;
  size_t start = 0;
  while (start < out.size()) {
    size_t end = out.find('\n', start);
    std::string line =
        out.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (std::regex_match(line, m, re)) finals.push_back({std::stoi(m[1]), std::stod(m[2]), m[3]});
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return finals;
}

std::vector<double> EpochLosses(const std::string& out) {
  static const std::regex re(R"(epoch (\d+)/(\d+) loss=(\d+\.\d+) samples/s=)");
  std::vector<double> losses;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it) {
    losses.push_back(std::stod((*it)[3]));
  }
  return losses;
}

TEST(ExampleTrainer, TwoRanksEndWithIdenticalParametersAndFallingLoss) {
  // A small bucket cap so the gradients really travel in several buckets.
  auto results = RunWorld(
      2, {"--epochs", "3", "--steps-per-epoch", "30", "--bucket-bytes", "65536", "--timing"});
  ASSERT_EQ(results.size(), 2u);
  std::vector<Final> finals;
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << Describe(results[r]);
    auto f = FinalLines(results[r].out);
    ASSERT_EQ(f.size(), 1u) << Describe(results[r]);
    EXPECT_EQ(f[0].rank, r);
    finals.push_back(f[0]);
    for (const char* ev : {"start", "pg_ready", "first_allreduce", "end"}) {
      std::string want = "timing rank=" + std::to_string(r) + " event=" + ev + " unix_ns=";
      EXPECT_NE(results[r].out.find(want), std::string::npos) << want << "\n" << results[r].out;
    }
  }
  EXPECT_EQ(finals[0].params, finals[1].params);

  const std::string& out0 = results[0].out;
  EXPECT_NE(out0.find("world_size=2"), std::string::npos) << out0;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out0, m, std::regex(R"(buckets=(\d+))"))) << out0;
  EXPECT_GT(std::stoi(m[1]), 1) << out0;

  auto losses = EpochLosses(out0);
  ASSERT_EQ(losses.size(), 3u) << out0;
  EXPECT_LT(losses.back(), 0.6 * losses.front()) << out0;
  EXPECT_LT(finals[0].loss, 0.6 * losses.front()) << out0;
  // Only rank 0 reports progress.
  EXPECT_TRUE(EpochLosses(results[1].out).empty()) << results[1].out;
}

TEST(ExampleTrainer, SingleRankRuns) {
  auto results = RunWorld(1, {"--epochs", "2", "--steps-per-epoch", "20", "--hidden", "32"});
  ASSERT_EQ(results[0].exit_code, 0) << Describe(results[0]);
  auto f = FinalLines(results[0].out);
  ASSERT_EQ(f.size(), 1u) << Describe(results[0]);
  EXPECT_EQ(f[0].rank, 0);
  EXPECT_EQ(EpochLosses(results[0].out).size(), 2u) << results[0].out;
}

TEST(ExampleTrainer, SameSeedGivesSameParametersRegardlessOfBucketing) {
  auto a = RunWorld(1, {"--epochs", "1", "--steps-per-epoch", "10", "--hidden", "32"});
  auto b = RunWorld(
      1, {"--epochs", "1", "--steps-per-epoch", "10", "--hidden", "32", "--bucket-bytes", "64"});
  ASSERT_EQ(a[0].exit_code, 0) << Describe(a[0]);
  ASSERT_EQ(b[0].exit_code, 0) << Describe(b[0]);
  auto fa = FinalLines(a[0].out), fb = FinalLines(b[0].out);
  ASSERT_EQ(fa.size(), 1u);
  ASSERT_EQ(fb.size(), 1u);
  EXPECT_EQ(fa[0].params, fb[0].params);
}

TEST(ExampleTrainer, HelpExitsZero) {
  Result r = RunOne({"--help"}, BaseEnv());
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_NE(r.out.find("usage:"), std::string::npos);
}

TEST(ExampleTrainer, UnknownFlagIsExitTwo) {
  Result r = RunOne({"--no-such-flag"}, RankEnv(0, 1, 1));
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_NE(r.err.find("--no-such-flag"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;

  r = RunOne({"--epochs", "zero"}, RankEnv(0, 1, 1));
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_NE(r.err.find("--epochs"), std::string::npos) << r.err;

  r = RunOne({"--fail-at-step", "1", "--fail-rank", "3"}, RankEnv(0, 2, 1));
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_NE(r.err.find("--fail-rank"), std::string::npos) << r.err;
}

struct BadEnvCase {
  const char* variable;
  std::optional<std::string> value;  // nullopt: unset
};

void PrintTo(const BadEnvCase& c, std::ostream* os) {
  *os << c.variable << (c.value ? "=" + *c.value : " unset");
}

class BadEnv : public testing::TestWithParam<BadEnvCase> {};

TEST_P(BadEnv, ExitsTwoNamingTheVariable) {
  Env env = RankEnv(0, 2, 29500);
  if (GetParam().value) {
    env[GetParam().variable] = *GetParam().value;
  } else {
    env.erase(GetParam().variable);
  }
  Result r = RunOne({}, env);
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_NE(r.err.find(GetParam().variable), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(FinalLines(r.out).size(), 0u);
}

INSTANTIATE_TEST_SUITE_P(
    ExampleTrainer, BadEnv,
    testing::Values(
        BadEnvCase{"RANK", std::nullopt}, BadEnvCase{"LOCAL_RANK", std::nullopt},
        BadEnvCase{"WORLD_SIZE", std::nullopt}, BadEnvCase{"LOCAL_WORLD_SIZE", std::nullopt},
        BadEnvCase{"MASTER_ADDR", std::nullopt}, BadEnvCase{"MASTER_PORT", std::nullopt},
        BadEnvCase{"RANK", "2"}, BadEnvCase{"RANK", "-1"}, BadEnvCase{"WORLD_SIZE", "two"},
        BadEnvCase{"LOCAL_RANK", "5"}, BadEnvCase{"MASTER_PORT", "70000"},
        BadEnvCase{"TORCHELASTIC_RESTART_COUNT", "x"}, BadEnvCase{"SPAWNPOINT_BACKEND", "nccl"},
        BadEnvCase{"SPAWNPOINT_BACKEND", "mpi"}),
    [](const testing::TestParamInfo<BadEnvCase>& info) {
      std::string name = info.param.variable;
      name += "_" + info.param.value.value_or("unset");
      for (char& ch : name) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return name;
    });

TEST(ExampleTrainer, FailAtStepExitsWithTheCode) {
  Result r = RunOne(
      {"--steps-per-epoch", "10", "--hidden", "32", "--fail-at-step", "3", "--fail-exit-code", "7"},
      RankEnv(0, 1, FreePort()));
  EXPECT_EQ(r.exit_code, 7) << Describe(r);
  EXPECT_EQ(FinalLines(r.out).size(), 0u) << r.out;
}

TEST(ExampleTrainer, FailAtStepRaisesTheSignal) {
  Result r = RunOne({"--steps-per-epoch", "10", "--hidden", "32", "--fail-at-step", "0",
                     "--fail-signal", std::to_string(SIGTERM)},
                    RankEnv(0, 1, FreePort()));
  EXPECT_EQ(r.term_signal, SIGTERM) << Describe(r);
}

TEST(ExampleTrainer, FailAtStepOnlyOnTheFirstAttempt) {
  Env env = RankEnv(0, 1, FreePort());
  env["TORCHELASTIC_RESTART_COUNT"] = "1";
  Result r = RunOne(
      {"--steps-per-epoch", "10", "--hidden", "32", "--fail-at-step", "3", "--fail-exit-code", "7"},
      env);
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(FinalLines(r.out).size(), 1u) << r.out;
}

// What the agent relies on: when one rank dies, the survivors notice and exit non-zero
// instead of hanging in a collective until the timeout.
TEST(ExampleTrainer, PeerFailureEndsTheOtherRank) {
  auto results = RunWorld(2,
                          {"--steps-per-epoch", "20", "--hidden", "32", "--fail-at-step", "5",
                           "--fail-rank", "1", "--fail-exit-code", "3"},
                          std::chrono::seconds(30));
  EXPECT_EQ(results[1].exit_code, 3) << Describe(results[1]);
  EXPECT_FALSE(results[0].timed_out) << Describe(results[0]);
  EXPECT_NE(results[0].exit_code, 0) << Describe(results[0]);
  EXPECT_EQ(FinalLines(results[0].out).size(), 0u) << results[0].out;
}

// With TORCHELASTIC_USE_AGENT_STORE every rank, rank 0 included, is a store client; with no
// store listening it must give up at the timeout with a clear error.
TEST(ExampleTrainer, AgentStoreModeWaitsForTheStoreThenTimesOut) {
  Env env = RankEnv(0, 1, FreePort());
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  auto start = std::chrono::steady_clock::now();
  Result r = RunOne({"--timeout-seconds", "1"}, env);
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_NE(r.err.find("no rendezvous store"), std::string::npos) << r.err;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

}  // namespace
