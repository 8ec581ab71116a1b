#include "agent/loader/types.h"

#include <cstdio>
#include <cstring>
#include <sstream>

namespace spawnpoint::loader {
namespace {

size_t AlignUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

}  // namespace

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kU8:
    case DType::kI8:
    case DType::kBool:
      return 1;
    case DType::kI16:
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kI32:
    case DType::kF32:
      return 4;
    case DType::kI64:
    case DType::kF64:
      return 8;
  }
  return 1;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kU8:
      return "u8";
    case DType::kI8:
      return "i8";
    case DType::kI16:
      return "i16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kBool:
      return "bool";
  }
  return "?";
}

StatusOr<DType> ParseDType(std::string_view name) {
  for (DType d : {DType::kU8, DType::kI8, DType::kI16, DType::kI32, DType::kI64, DType::kF16,
                  DType::kBF16, DType::kF32, DType::kF64, DType::kBool}) {
    if (name == DTypeName(d)) return d;
  }
  return InvalidArgument("unknown dtype \"" + std::string(name) + "\"");
}

int64_t ArraySpec::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ArraySpec::ShapeString() const {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

Array::Array(ArraySpec spec) : spec_(std::move(spec)) {
  // A negative dimension yields an empty array here; collation reports it as an error.
  nbytes_ = spec_.NumElements() < 0 ? 0 : spec_.NumBytes();
  bytes_ = std::make_unique_for_overwrite<std::byte[]>(std::max<size_t>(nbytes_, 1));
}

Array& Sample::Add(std::string name, DType dtype, std::vector<int64_t> shape) {
  arrays_.emplace_back(ArraySpec{std::move(name), dtype, std::move(shape)});
  return arrays_.back();
}

const Array* Sample::Find(std::string_view name) const {
  for (const Array& a : arrays_) {
    if (a.name() == name) return &a;
  }
  return nullptr;
}

BatchWriter BatchWriter::ForRegion(void* base, size_t capacity) {
  BatchWriter w;
  w.base_ = base;
  w.capacity_ = capacity;
  return w;
}

BatchWriter BatchWriter::ForHeap() { return BatchWriter(); }

StatusOr<void*> BatchWriter::AddField(ArraySpec spec) {
  for (int64_t d : spec.shape) {
    if (d < 0) {
      return InvalidArgument("batch field \"" + spec.name + "\" has a negative dimension " +
                             spec.ShapeString());
    }
  }
  for (const Field& f : fields_) {
    if (f.spec.name == spec.name) {
      return InvalidArgument("batch field \"" + spec.name + "\" is added twice");
    }
  }
  Field f;
  f.nbytes = spec.NumBytes();
  f.offset = AlignUp(used_, kAlignment);
  f.spec = std::move(spec);
  used_ = f.offset + f.nbytes;
  void* where = nullptr;
  if (base_ != nullptr && used_ <= capacity_ &&
      (!region_hook_ || region_hook_(static_cast<std::byte*>(base_) + f.offset, f.nbytes))) {
    where = static_cast<std::byte*>(base_) + f.offset;
  } else {
    if (base_ != nullptr) overflowed_ = true;
    heap_.push_back(std::make_unique_for_overwrite<std::byte[]>(std::max<size_t>(f.nbytes, 1)));
    where = heap_.back().get();
  }
  fields_.push_back(std::move(f));
  where_.push_back(where);
  return where;
}

const void* BatchWriter::FieldData(size_t i) const { return where_.at(i); }

bool BatchWriter::CopyTo(void* base, size_t capacity) const {
  if (used_ > capacity) return false;
  for (size_t i = 0; i < fields_.size(); ++i) {
    std::memcpy(static_cast<std::byte*>(base) + fields_[i].offset, where_[i], fields_[i].nbytes);
  }
  return true;
}

Status DefaultCollate(std::vector<Sample>& samples, BatchWriter& out) {
  if (samples.empty()) return InvalidArgument("collate: no samples");
  const Sample& first = samples.front();
  for (size_t s = 1; s < samples.size(); ++s) {
    const auto& arrays = samples[s].arrays();
    if (arrays.size() != first.arrays().size()) {
      return InvalidArgument("collate: sample " + std::to_string(s) + " of the batch has " +
                             std::to_string(arrays.size()) + " fields but sample 0 has " +
                             std::to_string(first.arrays().size()));
    }
    for (size_t f = 0; f < arrays.size(); ++f) {
      const ArraySpec& a = arrays[f].spec();
      const ArraySpec& b = first.arrays()[f].spec();
      if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape) {
        return InvalidArgument("collate: sample " + std::to_string(s) + " of the batch has field " +
                               a.name + " " + DTypeName(a.dtype) + a.ShapeString() +
                               " where sample 0 has " + b.name + " " + DTypeName(b.dtype) +
                               b.ShapeString() +
                               "; fields of different shapes need a custom Collate");
      }
    }
  }
  for (size_t f = 0; f < first.arrays().size(); ++f) {
    ArraySpec spec = first.arrays()[f].spec();
    const size_t per_sample = spec.NumBytes();
    spec.shape.insert(spec.shape.begin(), static_cast<int64_t>(samples.size()));
    SP_ASSIGN_OR_RETURN(void* dst, out.AddField(std::move(spec)));
    auto* d = static_cast<std::byte*>(dst);
    for (size_t s = 0; s < samples.size(); ++s) {
      std::memcpy(d + s * per_sample, samples[s].arrays()[f].data(), per_sample);
    }
  }
  return Status::Ok();
}

const BatchField* Batch::Find(std::string_view name) const {
  for (const BatchField& f : fields) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

void Batch::AddReleaseHook(std::function<void()> hook) const {
  std::lock_guard<std::mutex> lock(mu_);
  hooks_.push_back(std::move(hook));
}

BatchPtr MakeBatch(std::unique_ptr<Batch> batch, std::function<void()> release) {
  return BatchPtr(batch.release(), [release = std::move(release)](const Batch* b) {
    std::vector<std::function<void()>> hooks;
    {
      std::lock_guard<std::mutex> lock(b->mu_);
      hooks.swap(b->hooks_);
    }
    for (auto it = hooks.rbegin(); it != hooks.rend(); ++it) (*it)();
    delete b;
    if (release) release();
  });
}

}  // namespace spawnpoint::loader
