#include "operator/kube/log.h"

#include <cstdio>

namespace spawnpoint::kube {

Logger StderrLogger() {
  return [](LogLevel level, const std::string& message) {
    if (level < LogLevel::kWarning) return;
    // One fprintf per line keeps concurrent lines whole.
    std::fprintf(stderr, "[kube] %s: %s\n", level == LogLevel::kWarning ? "warning" : "error",
                 message.c_str());
  };
}

Logger NullLogger() {
  return [](LogLevel, const std::string&) {};
}

}  // namespace spawnpoint::kube
