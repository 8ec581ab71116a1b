#include "agent/run/self_exe.h"

#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <string>

namespace spawnpoint::agent {
namespace {

std::string& LauncherPath() {
  static std::string path;
  return path;
}

// Runs before main(), while the process has one thread, so unsetenv cannot race a getenv.
__attribute__((constructor)) void CaptureLauncherPath() {
  const char* value = getenv(kSelfExeEnv);
  if (value == nullptr) return;
  if (value[0] == '/') {
    LauncherPath() = value;
    // The kernel named the process after ld.so; name it after the program instead.
    std::string name = LauncherPath().substr(LauncherPath().rfind('/') + 1);
    prctl(PR_SET_NAME, name.substr(0, 15).c_str(), 0, 0, 0);
  }
  unsetenv(kSelfExeEnv);
}

}  // namespace

std::string SelfExecutablePath() {
  if (!LauncherPath().empty()) return LauncherPath();
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace spawnpoint::agent
