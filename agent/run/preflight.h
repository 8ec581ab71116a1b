// Checks made before any process starts, so a job that cannot work fails at once with
// the fix instead of minutes later with "Bus error" or a rank's EADDRINUSE, or is warned
// about (an interpreter without torch). Thread-safe (reads the filesystem, binds a socket for
// a moment; ProbeTorch runs one process).
#pragma once

#include <sys/types.h>

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

// Whether rank 0's store could listen on `port` here, tried the way c10d's TCPStore binds
// it (bind and listen on [::] dual-stack, else 0.0.0.0, with SO_REUSEADDR, then closed at
// once): when both fail with EADDRINUSE, the one-line message naming the port and who holds
// it (agent/supervisor/port_holder.h, read under `proc_root`), with the fix. A port whose
// every visible holder is `self` is not in use: the agent's own is the ranks'. nullopt when
// the port is free, or for any other error (no verdict on what it cannot judge).
std::optional<std::string> RendezvousPortInUse(int port, pid_t self,
                                               const std::string& proc_root = "/proc");

// The script of a Python trainer command (`python3 -u train.py`, `env X=1 python3 train.py`,
// or the one a torchrun command launches) must be there before anything starts:
// InvalidArgument located at the command or args element that names it
// (TrainerContainer::argv_origins: "job.yaml:14:16: spec.template.spec.containers[0].args[0]";
// none for a command line's job) and naming the directory a relative path was resolved against
// (workingDir, itself against `cwd`, else `cwd`: the agent's own). What is not certainly a script
// file of a Python command passes: `-m`, `-c`, stdin, a shell's `-c` string, any other program, a
// path it cannot stat.
Status CheckScript(const api::TrainerContainer& trainer, const std::string& cwd);

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
