#include "bench/loader_bench_datasets.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <sstream>
#include <string>

#include "agent/loader/dataset.h"

namespace spawnpoint::bench {
namespace {

using loader::DType;

std::map<std::string, int64_t> ParseArgs(const std::string& arg) {
  std::map<std::string, int64_t> out;
  std::stringstream in(arg);
  std::string kv;
  while (std::getline(in, kv, ',')) {
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) out[kv.substr(0, eq)] = std::stoll(kv.substr(eq + 1));
  }
  return out;
}

int64_t Get(const std::map<std::string, int64_t>& a, const char* key, int64_t fallback) {
  auto it = a.find(key);
  return it == a.end() ? fallback : it->second;
}

class TransferDataset : public loader::Dataset {
 public:
  TransferDataset(int64_t size, int64_t floats) : size_(size), floats_(floats) {}
  int64_t Size() const override { return size_; }
  StatusOr<loader::Sample> Get(int64_t index, loader::WorkerContext&) override {
    loader::Sample s;
    auto x = s.Add("x", DType::kF32, {floats_}).As<float>();
    std::fill(x.begin(), x.end(), static_cast<float>(index));
    return s;
  }

 private:
  int64_t size_;
  int64_t floats_;
};

class ComputeDataset : public loader::Dataset {
 public:
  ComputeDataset(int64_t size, int64_t work_us) : size_(size), work_(work_us) {}
  int64_t Size() const override { return size_; }
  StatusOr<loader::Sample> Get(int64_t index, loader::WorkerContext&) override {
    // Busy CPU for `work_` of wall time, like the reference's perf_counter spin.
    const auto end = std::chrono::steady_clock::now() + work_;
    while (std::chrono::steady_clock::now() < end) {
    }
    loader::Sample s;
    auto x = s.Add("x", DType::kF32, {256}).As<float>();
    std::fill(x.begin(), x.end(), static_cast<float>(index));
    return s;
  }

 private:
  int64_t size_;
  std::chrono::microseconds work_;
};

}  // namespace
}  // namespace spawnpoint::bench

SPAWNPOINT_REGISTER_DATASET(spawnpoint::bench::kTransferDataset, [](const std::string& arg) {
  auto a = spawnpoint::bench::ParseArgs(arg);
  return std::make_unique<spawnpoint::bench::TransferDataset>(
      spawnpoint::bench::Get(a, "size", 1280), spawnpoint::bench::Get(a, "floats", 3 * 224 * 224));
});

SPAWNPOINT_REGISTER_DATASET(spawnpoint::bench::kComputeDataset, [](const std::string& arg) {
  auto a = spawnpoint::bench::ParseArgs(arg);
  return std::make_unique<spawnpoint::bench::ComputeDataset>(
      spawnpoint::bench::Get(a, "size", 1280), spawnpoint::bench::Get(a, "work_us", 2000));
});
