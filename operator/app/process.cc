#include "operator/app/process.h"

#include <pthread.h>
#include <unistd.h>

#include "operator/common/log.h"

namespace spawnpoint::op {

sigset_t BlockStopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return signals;
}

std::string StartLogging(const std::string& log_level, const std::string& identity) {
  LogLevel level = LogLevel::kInfo;
  ParseLogLevel(log_level, &level);
  SetLogLevel(level);
  if (!identity.empty()) return identity;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return std::string(host) + "_" + std::to_string(getpid());
}

}  // namespace spawnpoint::op
