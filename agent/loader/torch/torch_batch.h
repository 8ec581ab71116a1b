// The torch face of the loader: a Batch's fields as torch::Tensor views of the
// shared-memory slot (zero copy). Every tensor keeps the batch alive; the slot goes back to
// the ring when the last tensor (and the last BatchPtr) is freed, on whatever thread.
// With pin_memory and CUDA available, TorchLoader copies each batch into pinned host memory
// on a background thread so host-to-device copies can be asynchronous; without CUDA it
// hands out the views directly. Thread-safety: ToTensors is thread-safe; a TorchLoader is
// driven from one thread (the training loop).
#pragma once

#include <torch/torch.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "agent/loader/loader.h"

namespace spawnpoint::loader {

struct TensorBatch {
  int64_t epoch = 0;
  int64_t index = 0;
  std::vector<int64_t> sample_indices;
  std::map<std::string, torch::Tensor> fields;

  // The field, or an undefined tensor if there is none of that name.
  torch::Tensor operator[](const std::string& name) const;
};

StatusOr<torch::ScalarType> ToScalarType(DType dtype);

// Views of `batch` as tensors; errors only for a dtype torch cannot represent.
StatusOr<TensorBatch> ToTensors(const BatchPtr& batch);

// Iterates a Loader's epochs as TensorBatches, pinning them in the background when asked
// and possible.
class TorchLoader {
 public:
  // pin_memory: LoaderOptions has no such field (the core is torch-free); the job's
  // loader.pinMemory arrives as SPAWNPOINT_LOADER_PIN_MEMORY, read when pin_memory is unset.
  static StatusOr<std::unique_ptr<TorchLoader>> Create(LoaderOptions options,
                                                       std::optional<bool> pin_memory = {});
  ~TorchLoader();

  Status StartEpoch(int64_t epoch);
  // The next batch; nullopt at the end of the epoch.
  StatusOr<std::optional<TensorBatch>> Next();
  Loader& loader() { return *loader_; }
  bool pinning() const { return pin_; }

 private:
  TorchLoader(std::unique_ptr<Loader> loader, bool pin);
  void PinLoop();

  std::unique_ptr<Loader> loader_;
  bool pin_ = false;
  // Pinning pipeline: the background thread pulls from loader_ and pins; Next() pops.
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StatusOr<std::optional<TensorBatch>>> ready_;
  bool epoch_requested_ = false;
  int64_t requested_epoch_ = 0;
  bool stop_ = false;
  std::thread pinner_;
};

}  // namespace spawnpoint::loader
