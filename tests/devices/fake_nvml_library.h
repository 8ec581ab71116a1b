// The fake NVML library (tests/fakes/fake_nvml.c) as the device tests load it: which file,
// and the config it reads at nvmlInit_v2. Not thread-safe: it sets the process environment.
#pragma once

#include <cstdlib>
#include <string>

namespace spawnpoint::testing {

// $SPAWNPOINT_TEST_FAKE_NVML when set (the test nvml_header_abi points it at the fake built
// from NVIDIA's nvml.h), else the fake this build made (FAKE_NVML_PATH).
inline std::string FakeNvmlLibrary() {
  const char* path = std::getenv("SPAWNPOINT_TEST_FAKE_NVML");
  return path != nullptr && *path != '\0' ? path : FAKE_NVML_PATH;
}

// Points the fake NVML at a config (FAKE_NVML_CONFIG) for the lifetime of the object.
class ScopedNvmlConfig {
 public:
  explicit ScopedNvmlConfig(const std::string& path) {
    setenv("FAKE_NVML_CONFIG", path.c_str(), 1);
  }
  ~ScopedNvmlConfig() { unsetenv("FAKE_NVML_CONFIG"); }
  ScopedNvmlConfig(const ScopedNvmlConfig&) = delete;
  ScopedNvmlConfig& operator=(const ScopedNvmlConfig&) = delete;
};

}  // namespace spawnpoint::testing
