// Checks made before any process starts, so a job that cannot work fails at once with
// the fix instead of minutes later with "Bus error". Thread-safe (reads the filesystem).
#pragma once

#include <cstdint>
#include <string>

#include "api/training_job.h"
#include "common/bytes.h"
#include "common/status.h"

namespace spawnpoint::agent {

// What we assume one in-flight loader batch may occupy in shared memory when sizing the
// check; the loader's own ring is checked exactly when it is allocated.
inline constexpr uint64_t kAssumedBatchSlotBytes = 32ull << 20;

// The shared memory the loader of `ranks` ranks needs: ranks x workers (at least one) x
// prefetchFactor x kAssumedBatchSlotBytes, but no more than spec.shmSize (the job's own
// statement of what it needs). Auto workers count as min(8, cpus per rank).
uint64_t SharedMemoryNeeded(const api::TrainingJobSpec& spec, int ranks, int cpus_per_rank);

// Fails with a one-line message naming the mount, its free space, the need, and the fix
// (spec.shmSize) when `shm_path` has less free space than needed.
Status CheckSharedMemory(const api::TrainingJobSpec& spec, int ranks, int cpus_per_rank,
                         const std::string& shm_path);

}  // namespace spawnpoint::agent
