// Kubernetes quantities ("8Gi", "1.5G", "1e3"), as manifests give them: api::ParseQuantity.
#include <string_view>

#include "api/training_job.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto bytes = spawnpoint::api::ParseQuantity(text);
  if (bytes.ok() && *bytes < 0) __builtin_trap();  // a quantity of bytes is never negative
  return 0;
}
