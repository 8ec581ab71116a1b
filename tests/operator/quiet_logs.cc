// Operator logs are noise in unit test output; SPAWNPOINT_TEST_LOGS=1 shows them.
#include <cstdlib>

#include "operator/common/log.h"

namespace {

const bool kQuiet = [] {
  const char* show = std::getenv("SPAWNPOINT_TEST_LOGS");
  if (show == nullptr || std::string(show) != "1") {
    spawnpoint::op::SetLogSink([](const std::string&) {});
  }
  return true;
}();

}  // namespace
