#include "agent/loader/torch/torch_batch.h"

#include <cstdlib>
#include <cstring>

namespace spawnpoint::loader {
namespace {

constexpr size_t kPinnedAhead = 2;  // pinned batches waiting for the trainer

bool PinFromEnv() {
  const char* v = std::getenv("SPAWNPOINT_LOADER_PIN_MEMORY");
  return v != nullptr && (std::strcmp(v, "1") == 0 || std::strcmp(v, "true") == 0);
}

}  // namespace

torch::Tensor TensorBatch::operator[](const std::string& name) const {
  auto it = fields.find(name);
  return it == fields.end() ? torch::Tensor() : it->second;
}

StatusOr<torch::ScalarType> ToScalarType(DType dtype) {
  switch (dtype) {
    case DType::kU8:
      return torch::kUInt8;
    case DType::kI8:
      return torch::kInt8;
    case DType::kI16:
      return torch::kInt16;
    case DType::kI32:
      return torch::kInt32;
    case DType::kI64:
      return torch::kInt64;
    case DType::kF16:
      return torch::kFloat16;
    case DType::kBF16:
      return torch::kBFloat16;
    case DType::kF32:
      return torch::kFloat32;
    case DType::kF64:
      return torch::kFloat64;
    case DType::kBool:
      return torch::kBool;
  }
  return InvalidArgument(std::string("no torch dtype for ") + DTypeName(dtype));
}

StatusOr<TensorBatch> ToTensors(const BatchPtr& batch) {
  TensorBatch out;
  out.epoch = batch->epoch;
  out.index = batch->index;
  out.sample_indices = batch->sample_indices;
  for (const BatchField& f : batch->fields) {
    SP_ASSIGN_OR_RETURN(torch::ScalarType type, ToScalarType(f.dtype));
    // Each tensor owns a reference to the batch: the slot lives as long as any view.
    BatchPtr keep = batch;
    out.fields[f.name] = torch::from_blob(
        const_cast<void*>(f.data), f.shape, [keep](void*) mutable { keep.reset(); },
        torch::TensorOptions().dtype(type));
  }
  return out;
}

StatusOr<std::unique_ptr<TorchLoader>> TorchLoader::Create(LoaderOptions options,
                                                           std::optional<bool> pin_memory) {
  SP_ASSIGN_OR_RETURN(std::unique_ptr<Loader> loader, Loader::Create(std::move(options)));
  // Pinned memory only pays off when batches then go to a GPU.
  const bool pin = pin_memory.value_or(PinFromEnv()) && torch::cuda::is_available();
  return std::unique_ptr<TorchLoader>(new TorchLoader(std::move(loader), pin));
}

TorchLoader::TorchLoader(std::unique_ptr<Loader> loader, bool pin)
    : loader_(std::move(loader)), pin_(pin) {
  if (pin_) pinner_ = std::thread([this] { PinLoop(); });
}

TorchLoader::~TorchLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (pinner_.joinable()) pinner_.join();
}

Status TorchLoader::StartEpoch(int64_t epoch) {
  if (!pin_) return loader_->StartEpoch(epoch);
  std::unique_lock<std::mutex> lock(mu_);
  // The pinning thread owns the Loader between epochs' starts; it starts the epoch itself.
  ready_.clear();
  requested_epoch_ = epoch;
  epoch_requested_ = true;
  cv_.notify_all();
  return Status::Ok();
}

StatusOr<std::optional<TensorBatch>> TorchLoader::Next() {
  if (!pin_) {
    SP_ASSIGN_OR_RETURN(BatchPtr batch, loader_->Next());
    if (batch == nullptr) return std::optional<TensorBatch>();
    SP_ASSIGN_OR_RETURN(TensorBatch tensors, ToTensors(batch));
    return std::optional<TensorBatch>(std::move(tensors));
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !ready_.empty(); });
  auto item = std::move(ready_.front());
  ready_.pop_front();
  cv_.notify_all();
  return item;
}

void TorchLoader::PinLoop() {
  while (true) {
    int64_t epoch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || epoch_requested_; });
      if (stop_) return;
      epoch = requested_epoch_;
      epoch_requested_ = false;
    }
    Status started = loader_->StartEpoch(epoch);
    bool done = !started.ok();
    if (done) {
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back(started);
      cv_.notify_all();
    }
    while (!done) {
      StatusOr<std::optional<TensorBatch>> item = std::optional<TensorBatch>();
      auto batch = loader_->Next();
      if (!batch.ok()) {
        item = batch.status();
        done = true;
      } else if (*batch == nullptr) {
        done = true;
      } else {
        auto tensors = ToTensors(*batch);
        if (!tensors.ok()) {
          item = tensors.status();
          done = true;
        } else {
          for (auto& [name, t] : tensors->fields) t = t.pin_memory();  // a copy: frees the slot
          item = std::optional<TensorBatch>(std::move(*tensors));
        }
      }
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || epoch_requested_ || ready_.size() < kPinnedAhead; });
      if (stop_) return;
      if (epoch_requested_) break;  // the trainer moved on: abandon this epoch
      ready_.push_back(std::move(item));
      cv_.notify_all();
    }
  }
}

}  // namespace spawnpoint::loader
