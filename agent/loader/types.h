// The loader's data model, free of torch: a Sample is an ordered list of named dense
// arrays that owns its bytes; collation stacks samples field-wise through a BatchWriter
// into one contiguous region (a shared-memory slot, or the heap with 0 workers); the
// trainer receives a Batch whose fields are read-only views into that region. The region
// is released when the last std::shared_ptr<const Batch> goes away, after the release
// hooks an adapter (e.g. torch) chained onto it have run.
//
// Thread-safety: Array, Sample and BatchWriter are plain values (one thread at a time).
// A Batch is immutable once handed out and may be read and released from any thread;
// AddReleaseHook is thread-safe.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "common/bytes.h"
#include "common/status.h"

namespace spawnpoint::loader {

enum class DType : uint8_t { kU8, kI8, kI16, kI32, kI64, kF16, kBF16, kF32, kF64, kBool };

size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);  // "u8", "i32", "f32", ...
StatusOr<DType> ParseDType(std::string_view name);

template <typename T>
constexpr DType DTypeOf() {
  if constexpr (std::is_same_v<T, uint8_t>)
    return DType::kU8;
  else if constexpr (std::is_same_v<T, int8_t>)
    return DType::kI8;
  else if constexpr (std::is_same_v<T, int16_t>)
    return DType::kI16;
  else if constexpr (std::is_same_v<T, int32_t>)
    return DType::kI32;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DType::kI64;
  else if constexpr (std::is_same_v<T, float>)
    return DType::kF32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::kF64;
  else if constexpr (std::is_same_v<T, bool>)
    return DType::kBool;
  else
    static_assert(sizeof(T) == 0, "no DType for this C++ type");
}

struct ArraySpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // empty: a scalar

  int64_t NumElements() const;
  size_t NumBytes() const { return static_cast<size_t>(NumElements()) * DTypeSize(dtype); }
  std::string ShapeString() const;  // "[3, 224, 224]"
  bool operator==(const ArraySpec&) const = default;
};

// A named dense array owning its bytes (uninitialised on creation: filling it is the
// dataset's job, and zeroing large arrays first would cost a full extra memory pass).
class Array {
 public:
  explicit Array(ArraySpec spec);
  Array(Array&&) = default;
  Array& operator=(Array&&) = default;

  const ArraySpec& spec() const { return spec_; }
  const std::string& name() const { return spec_.name; }
  void* data() { return bytes_.get(); }
  const void* data() const { return bytes_.get(); }
  size_t nbytes() const { return nbytes_; }
  template <typename T>
  std::span<T> As() {
    return {static_cast<T*>(data()), nbytes_ / sizeof(T)};
  }
  template <typename T>
  std::span<const T> As() const {
    return {static_cast<const T*>(data()), nbytes_ / sizeof(T)};
  }

 private:
  ArraySpec spec_;
  size_t nbytes_ = 0;
  std::unique_ptr<std::byte[]> bytes_;
};

class Sample {
 public:
  // Adds an uninitialised array and returns it for the caller to fill.
  Array& Add(std::string name, DType dtype, std::vector<int64_t> shape);
  template <typename T>
  Sample& Add(std::string name, std::vector<int64_t> shape, std::span<const T> values) {
    Array& a = Add(std::move(name), DTypeOf<T>(), std::move(shape));
    std::copy(values.begin(), values.begin() + std::min(values.size(), a.nbytes() / sizeof(T)),
              a.As<T>().begin());
    return *this;
  }
  template <typename T>
  Sample& AddScalar(std::string name, T value) {
    Add(std::move(name), DTypeOf<T>(), {}).template As<T>()[0] = value;
    return *this;
  }

  const std::vector<Array>& arrays() const { return arrays_; }
  std::vector<Array>& arrays() { return arrays_; }
  const Array* Find(std::string_view name) const;

 private:
  std::vector<Array> arrays_;
};

// Where collation writes a batch: a fixed region (a shared-memory slot) or the heap.
// Fields are laid out back to back, each aligned to kAlignment bytes. A region that is too
// small does not fail AddField (the overflowing fields go to scratch memory so user code
// runs to the end); Overflowed() then says so and BytesUsed() is the full need, which makes
// the error name the real size.
class BatchWriter {
 public:
  static constexpr size_t kAlignment = 64;
  struct Field {
    ArraySpec spec;  // batch dimension first
    size_t offset = 0;
    size_t nbytes = 0;
  };

  static BatchWriter ForRegion(void* base, size_t capacity);
  static BatchWriter ForHeap();
  BatchWriter(BatchWriter&&) = default;
  BatchWriter& operator=(BatchWriter&&) = default;

  // Reserves a field and returns where to write its bytes. Errors: a duplicate name, a
  // negative dimension.
  StatusOr<void*> AddField(ArraySpec spec);

  // Region mode: called with where a field will go before AddField hands it out; false
  // puts the field on the heap instead and the writer reports Overflowed() (e.g. the pages
  // could not be populated).
  void SetRegionHook(std::function<bool(void* where, size_t nbytes)> hook) {
    region_hook_ = std::move(hook);
  }

  const std::vector<Field>& fields() const { return fields_; }
  size_t BytesUsed() const { return used_; }
  bool Overflowed() const { return overflowed_; }
  bool IsHeap() const { return base_ == nullptr; }
  const void* FieldData(size_t i) const;
  // Copies a heap-mode batch into a region with the same layout; false if it does not fit.
  bool CopyTo(void* base, size_t capacity) const;

 private:
  BatchWriter() = default;
  void* base_ = nullptr;
  size_t capacity_ = 0;
  size_t used_ = 0;
  bool overflowed_ = false;
  std::vector<Field> fields_;
  std::vector<std::unique_ptr<std::byte[]>> heap_;  // per field, heap mode / overflow
  std::vector<void*> where_;
  std::function<bool(void*, size_t)> region_hook_;
};

// Stacks samples field-wise: every sample must have the same fields in the same order,
// with equal dtypes and shapes; the batch field gets shape [samples, ...sample shape].
// Errors name the sample position and the field.
Status DefaultCollate(std::vector<Sample>& samples, BatchWriter& out);

struct BatchField {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // batch dimension first
  const void* data = nullptr;
  size_t nbytes = 0;

  template <typename T>
  std::span<const T> As() const {
    return {static_cast<const T*>(data), nbytes / sizeof(T)};
  }
};

// What the trainer gets. Views stay valid while any copy of the shared_ptr lives.
class Batch {
 public:
  int64_t epoch = 0;
  int64_t index = 0;  // position in the rank's epoch
  std::vector<int64_t> sample_indices;
  std::vector<BatchField> fields;
  int worker_id = -1;  // -1: built in the calling process

  size_t size() const { return sample_indices.size(); }
  const BatchField* Find(std::string_view name) const;
  // Runs `hook` when the batch is released, before its memory is reused; hooks run last
  // added first, on whichever thread drops the last reference.
  void AddReleaseHook(std::function<void()> hook) const;

 private:
  friend std::shared_ptr<const Batch> MakeBatch(std::unique_ptr<Batch>, std::function<void()>);
  mutable std::mutex mu_;
  mutable std::vector<std::function<void()>> hooks_;
};

using BatchPtr = std::shared_ptr<const Batch>;

// Wraps `batch` so that dropping the last reference runs its hooks, then `release`.
BatchPtr MakeBatch(std::unique_ptr<Batch> batch, std::function<void()> release);

using ::spawnpoint::FormatBytes;  // "1.5Gi", "640Ki", "12"

}  // namespace spawnpoint::loader
