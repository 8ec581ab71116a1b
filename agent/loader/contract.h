// The contract between the pieces that start loader workers (the agent, or a Loader in
// standalone mode), the workers, and the rank's Loader: environment variable names and
// the files of a pool directory. Everything here is a constant or a pure function, apart
// from the record I/O, which is atomic (write a temporary file, then rename).
//
// A pool directory (one per rank) holds:
//   worker-<w>.sock       the listening socket of worker w, created once by the pool owner
//                         and inherited by every incarnation of the worker as fd 3
//   worker-<w>.exit.json  the last exit of worker w: {"workerId","pid","incarnation",
//                         "exitCode","signal","reason","message","stderrTail":[...]}
//   worker-<w>.pid        the pid of worker w's current incarnation, rewritten at each spawn:
//                         a rank kills a worker that never answers it (no Hello) as hung
//   stats.json            the rank Loader's statistics, rewritten about every second
//   service.sock          Python ranks: the agent's per-rank loader service, which the rank
//                         connects to (SPAWNPOINT_LOADER_SERVICE)
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/supervisor/exit_cause.h"
#include "common/status.h"

namespace spawnpoint::loader {

// Set by the pool owner on every worker it spawns.
inline constexpr char kEnvListenFd[] = "SPAWNPOINT_LOADER_LISTEN_FD";  // always 3
inline constexpr char kEnvWorkerId[] = "SPAWNPOINT_LOADER_WORKER_ID";
inline constexpr char kEnvWorkerRank[] = "SPAWNPOINT_LOADER_RANK";
inline constexpr char kEnvIncarnation[] = "SPAWNPOINT_LOADER_INCARNATION";  // 0, 1, ...
inline constexpr int kWorkerListenFd = 3;
// Staggered start-up (PoolSpec::start_concurrency): a worker given TURN_FD reads it until
// end of file before its start-up work (the Python worker's preload); a worker given
// STARTED_FD closes it when that work is done (or dies, which closes it too), so that the
// worker waiting on the other end may begin.
inline constexpr char kEnvTurnFd[] = "SPAWNPOINT_LOADER_TURN_FD";        // always 4
inline constexpr char kEnvStartedFd[] = "SPAWNPOINT_LOADER_STARTED_FD";  // always 5
inline constexpr int kWorkerTurnFd = 4;
inline constexpr int kWorkerStartedFd = 5;

// Given to a rank by the agent: the pool exists; connect to it.
inline constexpr char kEnvPoolDir[] = "SPAWNPOINT_LOADER_POOL_DIR";
inline constexpr char kEnvWorkers[] = "SPAWNPOINT_LOADER_WORKERS";  // N, or "auto" standalone
inline constexpr char kEnvAutoWorkers[] = "SPAWNPOINT_LOADER_AUTO_WORKERS";  // "1": tune in pool
// Loader settings, read when the program leaves the option unset.
inline constexpr char kEnvPrefetchFactor[] = "SPAWNPOINT_LOADER_PREFETCH_FACTOR";
inline constexpr char kEnvTimeoutSeconds[] = "SPAWNPOINT_LOADER_TIMEOUT_SECONDS";
inline constexpr char kEnvSeed[] = "SPAWNPOINT_LOADER_SEED";
inline constexpr char kEnvCpus[] = "SPAWNPOINT_LOADER_CPUS";  // a count, or a list "0-3,8"
inline constexpr char kEnvShmDir[] = "SPAWNPOINT_LOADER_SHM_DIR";
inline constexpr char kEnvSlotBytes[] = "SPAWNPOINT_LOADER_SLOT_BYTES";

std::string WorkerSocketPath(const std::string& dir, int worker);
std::string WorkerExitRecordPath(const std::string& dir, int worker);
std::string WorkerPidPath(const std::string& dir, int worker);
// The pid in worker w's pid file; 0 when there is none (yet) or it is not a number.
pid_t ReadWorkerPid(const std::string& dir, int worker);
std::string StatsPath(const std::string& dir);
std::string ServiceSocketPath(const std::string& pool_dir);

struct WorkerExitRecord {
  int worker_id = 0;
  pid_t pid = 0;
  int incarnation = 0;
  agent::ExitStatus status;
  agent::ExitCause cause;
  std::vector<std::string> stderr_tail;  // the incarnation's last stderr lines, oldest first

  nlohmann::json ToJson() const;
  static StatusOr<WorkerExitRecord> FromJson(const nlohmann::json& j);
  // "exit code 137 (SIGKILL), reason Killed: killed by SIGKILL"
  std::string Describe() const;
};

// Writes `text` to `path` atomically: readers see the old file or the new one, never a part.
Status WriteFileAtomically(const std::string& path, const std::string& text);
// kNotFound when there is no record (yet).
StatusOr<WorkerExitRecord> ReadExitRecord(const std::string& path);

// "0-3,8" (CPU ids) or "5" (a bare count); an error on anything else.
struct CpuSpec {
  int count = 0;
  std::vector<int> ids;  // empty when a bare count was given
};
StatusOr<CpuSpec> ParseCpuSpec(const std::string& text);
// The CPUs this process may run on (sched_getaffinity), at least 1.
int AffinityCpuCount();

}  // namespace spawnpoint::loader
