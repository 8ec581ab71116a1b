// Checks made before any process starts, so a job that cannot work fails at once with
// the fix instead of minutes later with "Bus error", or is warned about (an interpreter
// without torch). Thread-safe (reads the filesystem; ProbeTorch runs one process).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "agent/plan/node_plan.h"
#include "agent/process/spawner.h"
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

// The program a rank execs, as an absolute path: argv[0] resolved against the rank's PATH
// (a name with a '/' taken relative to its workingDir, else to this process's directory),
// as the spawner will run it. Errors name the command and the PATH searched.
StatusOr<std::string> ResolveRankExecutable(const RankPlan& rank);

// Whether `interpreter` can `import torch` in the rank's environment (less the agent's
// SPAWNPOINT_* settings) and working directory: one run of `interpreter -c "import torch"`
// through `spawner`, killed after `timeout` (import torch takes ~1-2 s). Costs a process and
// that time: plan runs it; run does not, so the ranks are not delayed.
struct TorchProbe {
  std::optional<std::string> version;  // torch.__version__ when the import worked
  // Otherwise why not, one line: the interpreter's last line of output
  // ("ModuleNotFoundError: No module named 'torch'"), or that it did not answer in time.
  std::string error;
};
TorchProbe ProbeTorch(ProcessSpawner* spawner, const std::string& interpreter, const RankPlan& rank,
                      std::chrono::milliseconds timeout);

}  // namespace spawnpoint::agent
