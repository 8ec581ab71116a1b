// spawnpoint-test-rank: a stand-in for a training rank with scriptable misbehaviour, used
// by the supervision tests. It reads RANK like a real rank; the failure flags (--exit-code,
// --signal, --hang) apply to --fail-rank (default: every rank), the others to the rank
// they name (-1: every rank). Writes its pid (and that of any grandchild) to --pid-dir so
// tests can check that nothing survives.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

namespace {

void WriteFile(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << text << "\n";
  }
  rename(tmp.c_str(), path.c_str());  // atomic: readers never see a partial pid
}

bool Exists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0;
}

void SleepMs(long ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// --slow-sigterm: the rank's SIGTERM handler takes g_sigterm_ms, then records when it
// ended in g_stopped_path (CLOCK_REALTIME ns) and exits 0. Async-signal-safe calls only.
long g_sigterm_ms = 0;
char g_stopped_path[512];

void SlowSigterm(int) {
  timespec wait{g_sigterm_ms / 1000, (g_sigterm_ms % 1000) * 1'000'000};
  while (nanosleep(&wait, &wait) != 0) {
  }
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  char digits[32];
  int n = 0;
  for (unsigned long long v = now.tv_sec * 1'000'000'000ULL + now.tv_nsec; v != 0; v /= 10) {
    digits[n++] = static_cast<char>('0' + v % 10);
  }
  char text[32];
  for (int i = 0; i < n; ++i) text[i] = digits[n - 1 - i];
  int fd = open(g_stopped_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    (void)!write(fd, text, n);
    close(fd);
  }
  _exit(0);
}

long long RealtimeNs() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return now.tv_sec * 1'000'000'000LL + now.tv_nsec;
}

// A process that exists and is not a zombie (a reaped or dying-and-collected one is not).
bool Running(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/stat");
  std::string line;
  if (!std::getline(in, line)) return false;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z' &&
         line[paren + 2] != 'X';
}

[[noreturn]] void Usage(const char* why) {
  fprintf(stderr, "spawnpoint-test-rank: %s\n", why);
  exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  const char* rank_env = getenv("RANK");
  const int rank = rank_env ? atoi(rank_env) : 0;
  const char* restart_env = getenv("TORCHELASTIC_RESTART_COUNT");
  int fail_rank = -1, exit_code = 0, sig = 0, ignore_term_rank = -2, grandchild_rank = -2,
      slow_term_rank = -2;
  long after_ms = 0, run_ms = 0;
  bool hang = false, print_env = false;
  std::string pid_dir, fail_once_dir, bump_oom_file, check_gone_dir;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Usage(("missing value for " + a).c_str());
      return argv[++i];
    };
    if (a == "--fail-rank")
      fail_rank = std::stoi(next());
    else if (a == "--exit-code")
      exit_code = std::stoi(next());
    else if (a == "--signal")
      sig = std::stoi(next());
    else if (a == "--after-ms")
      after_ms = std::stol(next());
    else if (a == "--run-ms")
      run_ms = std::stol(next());
    else if (a == "--ignore-sigterm")
      ignore_term_rank = std::stoi(next());
    else if (a == "--hang")
      hang = true;
    else if (a == "--grandchild")
      grandchild_rank = std::stoi(next());
    else if (a == "--bump-oom")
      bump_oom_file = next();
    else if (a == "--pid-dir")
      pid_dir = next();
    else if (a == "--fail-once")
      fail_once_dir = next();
    else if (a == "--slow-sigterm")
      slow_term_rank = std::stoi(next());
    else if (a == "--sigterm-ms")
      g_sigterm_ms = std::stol(next());
    else if (a == "--check-gone")
      check_gone_dir = next();
    else if (a == "--print-env")
      print_env = true;
    else
      Usage(("unknown flag " + a).c_str());
  }
  auto applies = [&](int r) { return r == -1 || r == rank; };
  const bool targeted = applies(fail_rank);
  if (!pid_dir.empty())
    WriteFile(pid_dir + "/rank-" + std::to_string(rank) + ".pid", std::to_string(getpid()));
  printf("rank %d started restart=%s pid=%d at_ns=%lld\n", rank,
         restart_env ? restart_env : "unset", getpid(), RealtimeNs());
  if (!check_gone_dir.empty()) {
    // The grandchild this rank left in an earlier attempt must be gone before it runs again
    // (read before this attempt's own grandchild replaces the file).
    std::ifstream in(check_gone_dir + "/grandchild-" + std::to_string(rank) + ".pid");
    std::string pid;
    if (in >> pid && Running(pid)) printf("stale process %s still runs\n", pid.c_str());
  }
  if (print_env) {
    for (const char* name :
         {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NNODES",
          "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"}) {
      const char* v = getenv(name);
      printf("env %s=%s\n", name, v ? v : "");
    }
  }
  fflush(stdout);

  if (applies(grandchild_rank)) {
    // A test tool holds no GPU context: a plain fork is fine here.
    pid_t pid = fork();
    if (pid == 0) {
      setsid();  // escape the rank's process group, as daemonising helpers do
      for (;;) pause();
    }
    if (!pid_dir.empty()) {
      WriteFile(pid_dir + "/grandchild-" + std::to_string(rank) + ".pid", std::to_string(pid));
    }
  }
  if (applies(ignore_term_rank)) signal(SIGTERM, SIG_IGN);
  if (applies(slow_term_rank)) {
    snprintf(g_stopped_path, sizeof(g_stopped_path), "%s/stopped-%d", pid_dir.c_str(), rank);
    signal(SIGTERM, SlowSigterm);
  }

  bool fail = targeted && (exit_code != 0 || sig != 0 || hang);
  if (fail && !fail_once_dir.empty()) {
    std::string marker = fail_once_dir + "/failed-" + std::to_string(rank);
    if (Exists(marker)) {
      fail = false;
    } else {
      WriteFile(marker, "1");
    }
  }
  if (fail) {
    SleepMs(after_ms);
    if (hang) {
      for (;;) pause();
    }
    if (!bump_oom_file.empty()) {
      // What the kernel does when the cgroup's OOM killer fires.
      long count = 0;
      std::string key;
      std::ifstream in(bump_oom_file);
      while (in >> key) {
        if (key == "oom_kill") in >> count;
      }
      WriteFile(bump_oom_file, "oom 1\noom_kill " + std::to_string(count + 1));
    }
    if (sig != 0) {
      signal(sig, SIG_DFL);
      raise(sig);
    }
    fprintf(stderr, "rank %d failing with exit code %d\n", rank, exit_code);
    return exit_code;
  }
  if (run_ms < 0) {
    for (;;) pause();
  }
  SleepMs(run_ms);
  printf("rank %d done\n", rank);
  return 0;
}
