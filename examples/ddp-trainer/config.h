// Command-line flags and the torchrun-style environment of one trainer rank. Kept free of
// libtorch so it compiles in a second, instead of the ~18 s a torch translation unit costs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"

namespace spawnpoint::trainer {

struct Flags {
  int epochs = 3;
  int steps_per_epoch = 50;
  int batch_size = 32;  // per rank
  double lr = 0.05;
  double momentum = 0.9;
  int hidden = 256;
  std::int64_t bucket_bytes = std::int64_t{1} << 20;
  std::uint64_t seed = 1234;  // data set and shuffling; identical on every rank
  int timeout_seconds = 300;  // rendezvous and collectives
  // Fault injection for restart tests: -1 = never.
  std::int64_t fail_at_step = -1;
  int fail_exit_code = 1;
  int fail_signal = 0;
  int fail_rank = 0;
  // Stall injection for hang detection tests: at this step --fail-rank sleeps forever
  // (first attempt only); -1 = never.
  std::int64_t hang_at_step = -1;
  bool timing = false;
  bool help = false;
  // Where batches come from: "loader" (spawnpoint's loader: spawned workers when the agent
  // gives the rank a pool, else in-process) or "memory" (a tensor built at start-up).
  std::string data = "loader";
  int decode_passes = 16;  // loader data: CPU cost per sample (smoothing passes)
};

// Parses argv[1..]. "--flag value" and "--flag=value" are both accepted.
StatusOr<Flags> ParseFlags(const std::vector<std::string>& args);

const char* Usage();

struct RankEnv {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;
  // torchrun's agent already hosts the TCPStore, so rank 0 must not start another one.
  bool use_agent_store = false;
  std::string backend = "gloo";  // the only one this CPU build implements
  // When set, libgomp and torch size the intra-op pool from it; otherwise we use 1 thread.
  bool omp_num_threads_set = false;
  std::string gloo_socket_ifname;
};

using Getenv = std::function<const char*(const char*)>;

// Reads RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (all
// required), TORCHELASTIC_RESTART_COUNT (default 0), TORCHELASTIC_USE_AGENT_STORE,
// SPAWNPOINT_BACKEND, OMP_NUM_THREADS and GLOO_SOCKET_IFNAME. Errors name the variable.
// nccl_supported says whether this build can honour SPAWNPOINT_BACKEND=nccl (it needs a
// CUDA libtorch built with NCCL); when false, nccl is an error and auto means gloo.
StatusOr<RankEnv> ReadRankEnv(const Getenv& getenv, bool nccl_supported);

// Checks the flags that only make sense against the world (e.g. --fail-rank < WORLD_SIZE).
Status CheckFlagsAgainstEnv(const Flags& flags, const RankEnv& env);

}  // namespace spawnpoint::trainer
