// The trainer-side data loader: DataLoader + DistributedSampler semantics over a pool of
// spawned (never forked) persistent worker processes, with batches delivered as views of
// a per-rank shared-memory ring.
//
//   int main(int argc, char** argv) {
//     if (int rc = spawnpoint::loader::RunWorkerIfRequested(argc, argv); rc >= 0) return rc;
//     auto loader = spawnpoint::loader::Loader::Create({.dataset = "images", .batch_size = 64});
//     for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//       (*loader)->StartEpoch(epoch);
//       while (true) {
//         auto batch = (*loader)->Next();       // StatusOr<BatchPtr>
//         if (!batch.ok()) fail(batch.status());
//         if (*batch == nullptr) break;         // the epoch is over
//         train(**batch);
//       }
//     }
//   }
//
// Agent mode: SPAWNPOINT_LOADER_POOL_DIR names a pool the agent already runs (workers
// SPAWNPOINT_LOADER_WORKERS); the Loader connects to <dir>/worker-<w>.sock. Standalone
// mode (no such variable): the Loader runs the pool itself in a temporary directory, with
// the program's own command (/proc/self/exe and its argv) as the worker command.
//
// Every sample of an epoch is delivered exactly once and, unless in_order is false, in
// sampler order, also when workers die or hang: a dead worker's tasks are reissued and its
// respawned incarnation reconnected; a task outstanding longer than `timeout` (not counting
// the time its worker waited for a CPU, up to 10 timeouts: hang_clock.h) gets its worker
// SIGKILLed and is treated the same. A batch that cannot be built (its worker died on it
// max_attempts times, the dataset failed on one of its indices, or it is larger than a slot)
// fails Next() when the trainer reaches it, so earlier batches are still delivered; the
// message names the batch, the indices, the worker and pid, the exit code or signal and the
// worker's last stderr lines. A worker out of service for longer than `timeout` (its pool is
// gone) fails Next() too. Errors are sticky: once Next() failed, the Loader stays failed.
//
// Standalone workers are this process's children and are reaped by pid; a program that
// reaps with waitpid(-1) or ignores SIGCHLD still gets them respawned, but their exit causes
// are then unknown.
//
// Thread-safety: Create/StartEpoch/Next are called from one thread (the training loop);
// Stats() and WorkerPids() from any thread; batches may be released from any thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/loader/dataset.h"
#include "agent/loader/loader_options.h"
#include "agent/loader/types.h"
#include "agent/loader/worker.h"
#include "common/status.h"

namespace spawnpoint::loader {

struct LoaderStats {
  int64_t epoch = -1;
  int64_t batches = 0;  // delivered by Next() since Create
  int64_t samples = 0;
  double batches_per_second = 0;  // over the last ~5 s
  double samples_per_second = 0;
  double wait_seconds = 0;          // time the trainer spent blocked in Next(): the data stall
  double stall_fraction = 0;        // wait_seconds / wall time since the first StartEpoch
  double first_batch_seconds = -1;  // Create to the first batch returned
  int queue_depth = 0;              // batches built and waiting for Next()
  int in_flight = 0;                // tasks at workers
  int active_workers = 0;
  int pool_workers = 0;
  bool auto_workers = false;
  bool auto_settled = false;
  int64_t restarts_died = 0;  // exited or killed by a signal (other than below)
  int64_t restarts_hung = 0;  // killed by the Loader after `timeout`
  int64_t restarts_oom = 0;
  int64_t restarts_shm = 0;  // SIGBUS
  size_t slots = 0;
  size_t slot_bytes = 0;
  // What first_batch_seconds is made of (pool loaders, once the first batch came; -1
  // before or unknown): spawning the workers (standalone; 0 on the agent's pool), worker 0's
  // Hello, asking for batch 0 until it was built (of which the worker's own build time),
  // making the ring, and the rest until Next() handed it over.
  double first_batch_spawn_s = -1;
  double first_batch_connect_s = -1;
  double first_batch_probe_s = -1;
  double first_batch_build_s = -1;
  double first_batch_ring_s = -1;
  double first_batch_handover_s = -1;
  bool first_batch_in_place = false;  // built in its ring slot (no copy)

  nlohmann::json ToJson() const;
};

struct PoolClientStats;
// Copies what a PoolClient knows (queue, in flight, workers, restarts, slots) into `s`.
void SetPoolFields(const PoolClientStats& c, LoaderStats& s);

class Loader {
 public:
  // Fills unset options from the environment, starts or connects to the pool, and (unless
  // the slot size is given) has worker 0 build the first batch to size the ring, which is
  // then allocated and checked against the shared-memory directory's free space. Errors:
  // kInvalidArgument for bad options, kFailedPrecondition for too little shared memory, and
  // whatever a worker reports when it cannot load the dataset.
  static StatusOr<std::unique_ptr<Loader>> Create(LoaderOptions options);
  virtual ~Loader() = default;

  virtual int64_t DatasetSize() const = 0;
  virtual int64_t BatchesPerEpoch() const = 0;
  // Begins epoch `epoch` (batches issued for it ahead of time are kept; others dropped).
  virtual Status StartEpoch(int64_t epoch) = 0;
  // The next batch of the epoch; nullptr once the epoch is exhausted.
  virtual StatusOr<BatchPtr> Next() = 0;
  virtual LoaderStats Stats() const = 0;
  // Per worker id, the pid that last said Hello (0 if none yet); empty with 0 workers.
  virtual std::vector<pid_t> WorkerPids() const = 0;
  // The options after filling from the environment.
  virtual const LoaderOptions& options() const = 0;
};

}  // namespace spawnpoint::loader
