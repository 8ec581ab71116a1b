// Byte counts for messages, written as Kubernetes quantities ("64Mi", "1.5Gi", "100"), the
// units users set spec.shmSize and memory limits in. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace spawnpoint {

std::string FormatBytes(uint64_t bytes);

}  // namespace spawnpoint
