// Secrets drawn from the kernel's random source. Thread-safe.
#pragma once

#include <cstddef>
#include <string>

#include "common/status.h"

namespace spawnpoint {

// `bytes` random bytes from /dev/urandom, hex-encoded (2 × bytes lowercase characters);
// Unavailable if they cannot be read.
StatusOr<std::string> RandomHex(size_t bytes);

}  // namespace spawnpoint
