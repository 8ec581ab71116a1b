// Helpers for tests that run real programs: a child process with captured output and a
// deadline, polling with deadlines (never sleeps as synchronisation), temp dirs.
// Not thread-safe; one instance per test.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace spawnpoint::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A program started with posix_spawn; stdout and stderr go to files in a temp dir.
class TestProcess {
 public:
  TestProcess(std::vector<std::string> argv, std::map<std::string, std::string> extra_env = {},
              std::string working_dir = "");
  ~TestProcess();  // kills the process group if still running

  pid_t pid() const { return pid_; }
  // Waits up to `timeout` for the exit; returns the shell exit code (128+signal), or -1 on
  // timeout (the process is then killed).
  int Wait(std::chrono::milliseconds timeout);  // `timeout` times SanitizerSlowdown()
  bool Running();
  std::string Stdout() const;
  std::string Stderr() const;

 private:
  TempDir dir_;
  pid_t pid_ = -1;
  int code_ = -2;
};

std::string ReadFile(const std::string& path);
void WriteFile(const std::string& path, const std::string& text);

// How many times longer the deadlines of WaitUntil and TestProcess::Wait are in a sanitizer
// build (make test-asan, make test-tsan): 3 under ASan, 6 under TSan, else 1. Deadlines, never
// expected times.
int SanitizerSlowdown();

// Polls `condition` every 10 ms until it holds or `timeout` (times SanitizerSlowdown())
// passes.
bool WaitUntil(const std::function<bool()>& condition, std::chrono::milliseconds timeout);

// True if a process with this pid exists (zombies count as existing).
bool ProcessExists(pid_t pid);
int CountLines(const std::string& text, const std::string& needle);

}  // namespace spawnpoint::testing
