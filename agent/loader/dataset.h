// The interface user code implements, and the registry through which a spawned worker
// (a fresh process image, so nothing can be handed over in memory) finds a dataset by
// name. Register from a translation unit linked into the executable itself: a static
// library's object that nothing references is dropped by the linker, and with it the
// registration.
//
// Thread-safety: the registry is safe to use from static initialisers and any thread. A
// Dataset is used by one thread of one worker process at a time; a WorkerContext belongs
// to that thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "agent/loader/types.h"
#include "common/status.h"

namespace spawnpoint::loader {

// What a dataset knows about the worker calling it. `seed` is derived from (base seed,
// rank, worker id, epoch), so every worker of every rank has its own random stream and
// each epoch differs; `rng` starts from `seed` at the worker's first batch of the epoch.
struct WorkerContext {
  int rank = 0;
  int world_size = 1;
  int worker_id = 0;  // 0 also in the calling process when the loader runs 0 workers
  int num_workers = 0;
  int incarnation = 0;  // 0 for the first process of this worker, +1 per respawn
  int64_t epoch = 0;
  uint64_t seed = 0;
  std::mt19937_64 rng;
};

// The seed of worker `worker` of rank `rank` in `epoch` (a splitmix64 chain: adjacent
// inputs give unrelated seeds).
uint64_t DeriveSeed(uint64_t base_seed, int rank, int worker, int64_t epoch);

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t Size() const = 0;
  // Loads sample `index` (0 <= index < Size()). An error or an exception fails the batch
  // and the loader reports it with the index and this message; it is not retried.
  virtual StatusOr<Sample> Get(int64_t index, WorkerContext& ctx) = 0;
  // Writes the batch of `samples` into `out`. The default stacks fields (DefaultCollate);
  // override for variable-size fields or to pack differently.
  virtual Status Collate(std::vector<Sample>& samples, BatchWriter& out, WorkerContext& ctx) {
    return DefaultCollate(samples, out);
  }
};

using DatasetFactory = std::function<StatusOr<std::unique_ptr<Dataset>>(const std::string& arg)>;

// Registers `factory` under `name`; a second registration of a name is ignored and
// returns false. Prefer SPAWNPOINT_REGISTER_DATASET.
bool RegisterDataset(const std::string& name, DatasetFactory factory);
// Builds the dataset; errors name it and list what is registered. Exceptions thrown by the
// factory become errors.
StatusOr<std::unique_ptr<Dataset>> CreateDataset(const std::string& name, const std::string& arg);
std::vector<std::string> RegisteredDatasets();

namespace internal {
// Accepts factories returning std::unique_ptr<D> for any D derived from Dataset, or
// StatusOr<std::unique_ptr<Dataset>>.
template <typename F>
DatasetFactory WrapFactory(F f) {
  return [f = std::move(f)](const std::string& arg) -> StatusOr<std::unique_ptr<Dataset>> {
    auto made = f(arg);
    if constexpr (std::is_same_v<decltype(made), StatusOr<std::unique_ptr<Dataset>>>) {
      return made;
    } else {
      return std::unique_ptr<Dataset>(std::move(made));
    }
  };
}
}  // namespace internal

}  // namespace spawnpoint::loader

// At namespace scope: SPAWNPOINT_REGISTER_DATASET("images", [](const std::string& arg) {
//   return std::make_unique<ImageDataset>(arg); });
#define SPAWNPOINT_REGISTER_DATASET(name, factory)                                         \
  [[maybe_unused]] static const bool SP_CONCAT(spawnpoint_dataset_registered_, __LINE__) = \
      ::spawnpoint::loader::RegisterDataset(name,                                          \
                                            ::spawnpoint::loader::internal::WrapFactory(factory))
