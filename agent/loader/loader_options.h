// What a Loader is asked for (LoaderOptions) and how unset options are filled from the
// environment the agent (or the user) provides. Pure functions of their arguments (the
// environment is injected) apart from the affinity fallback for `cpus`; thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace spawnpoint::loader {

inline constexpr int kWorkersFromEnv = -1;
inline constexpr int kAutoWorkers = -2;

struct LoaderOptions {
  std::string dataset;  // a registered name
  std::string dataset_arg;
  int64_t batch_size = 1;
  bool shuffle = false;
  bool drop_last = false;
  // >= 0: that many; kAutoWorkers: measured knee; kWorkersFromEnv: SPAWNPOINT_LOADER_WORKERS
  // (a number or "auto"), else 0. In agent mode the pool's size caps it.
  int workers = kWorkersFromEnv;
  std::optional<int> prefetch_factor;  // tasks in flight per worker; env, else 2
  // A task outstanding longer than this kills its worker; 0 disables. Env
  // SPAWNPOINT_LOADER_TIMEOUT_SECONDS, else 120 s.
  std::optional<std::chrono::milliseconds> timeout;
  std::optional<uint64_t> seed;  // env SPAWNPOINT_LOADER_SEED, else 0
  bool in_order = true;
  // Issue the next epoch's first batches while the current epoch drains, so the boundary
  // costs nothing (assumes StartEpoch(e + 1) follows epoch e).
  bool prefetch_next_epoch = true;
  std::vector<std::string> worker_command;  // standalone: default the program itself
  std::optional<size_t> slot_bytes;         // env SPAWNPOINT_LOADER_SLOT_BYTES, else probed
  std::optional<int> rank;                  // env RANK, else 0
  std::optional<int> world_size;            // env WORLD_SIZE, else 1
  std::optional<int> cpus;  // the rank's CPUs: env SPAWNPOINT_LOADER_CPUS, else the affinity
  std::string shm_dir;      // env SPAWNPOINT_LOADER_SHM_DIR, else /dev/shm
  std::string pool_dir;     // env SPAWNPOINT_LOADER_POOL_DIR; empty: standalone
  int max_attempts = 3;     // failures of one batch before Next() fails
  std::chrono::milliseconds auto_window{1000};  // measurement window of auto workers
  int output_fd = 2;  // standalone: where the workers' prefixed output goes
};

// A variable's value; nullopt when it is unset or empty.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;
// The process environment (getenv).
std::optional<std::string> ProcessEnv(const char* name);

// The options Create would use (environment applied, defaults filled, validated); errors are
// kInvalidArgument naming the option or variable.
StatusOr<LoaderOptions> ResolveLoaderOptions(LoaderOptions options, const EnvLookup& env);
// The same with the process environment.
StatusOr<LoaderOptions> ResolveLoaderOptions(LoaderOptions options);

// In agent mode (options.pool_dir set), the size of the pool the agent runs:
// SPAWNPOINT_LOADER_WORKERS, which must then be a number >= 1.
StatusOr<int> AgentPoolSize(const EnvLookup& env);

}  // namespace spawnpoint::loader
