#include "agent/run/preflight.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace spawnpoint::agent {

uint64_t SharedMemoryNeeded(const api::TrainingJobSpec& spec, int ranks, int cpus_per_rank) {
  const int workers = spec.loader.workers_per_rank ? *spec.loader.workers_per_rank
                                                   : std::min(8, std::max(1, cpus_per_rank));
  const uint64_t estimate = static_cast<uint64_t>(ranks) * std::max(1, workers) *
                            static_cast<uint64_t>(spec.loader.prefetch_factor) *
                            kAssumedBatchSlotBytes;
  return std::min<uint64_t>(estimate, static_cast<uint64_t>(spec.shm_size_bytes));
}

Status CheckSharedMemory(const api::TrainingJobSpec& spec, int ranks, int cpus_per_rank,
                         const std::string& shm_path) {
  struct statvfs st {};
  if (statvfs(shm_path.c_str(), &st) != 0) {
    return FailedPrecondition("shared memory " + shm_path + " is not usable: " + strerror(errno) +
                              "; the data loader passes batches through it");
  }
  const uint64_t free_bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  const uint64_t total = static_cast<uint64_t>(st.f_blocks) * st.f_frsize;
  const uint64_t need = SharedMemoryNeeded(spec, ranks, cpus_per_rank);
  if (free_bytes >= need) return Status::Ok();
  const int workers = spec.loader.workers_per_rank.value_or(-1);
  return FailedPrecondition(
      shm_path + " has " + FormatBytes(free_bytes) + " free (" + FormatBytes(total) +
      " in all) but " + std::to_string(ranks) + " ranks x " +
      (workers >= 0 ? std::to_string(std::max(1, workers)) : std::string("auto")) +
      " loader workers x prefetchFactor " + std::to_string(spec.loader.prefetch_factor) +
      " need about " + FormatBytes(need) +
      ": batches would die with SIGBUS (\"Bus error\"). Fix: set spec.shmSize (the operator "
      "mounts that much memory at /dev/shm), or run the container with --shm-size, or lower "
      "loader.workersPerRank/prefetchFactor");
}

}  // namespace spawnpoint::agent
