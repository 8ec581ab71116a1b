#include "tests/loader/test_datasets.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "agent/loader/dataset.h"

namespace spawnpoint::loader::testing {

std::map<std::string, std::string> ParseArgs(const std::string& arg) {
  std::map<std::string, std::string> out;
  std::stringstream in(arg);
  std::string kv;
  while (std::getline(in, kv, ',')) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos) {
      out[kv] = "1";
    } else {
      out[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }
  return out;
}

namespace {

int64_t Int(const std::map<std::string, std::string>& a, const std::string& k, int64_t d) {
  auto it = a.find(k);
  return it == a.end() ? d : std::stoll(it->second);
}
std::string Str(const std::map<std::string, std::string>& a, const std::string& k) {
  auto it = a.find(k);
  return it == a.end() ? "" : it->second;
}

// True for exactly one caller across all processes: whoever creates the file first.
bool ClaimMarker(const std::string& path) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  close(fd);
  return true;
}

class IndexDataset : public Dataset {
 public:
  explicit IndexDataset(const std::string& arg) : args_(ParseArgs(arg)) {
    size_ = Int(args_, "size", 100);
    dim_ = Int(args_, "dim", 4);
    work_ = Int(args_, "work", 0);
    sleep_ms_ = Int(args_, "sleep_ms", 0);
    slow_worker_ = Int(args_, "slow_worker", -1);
    if (Int(args_, "print", 0)) std::printf("dataset ready in pid %d\n", getpid());
  }
  int64_t Size() const override { return size_; }

  StatusOr<Sample> Get(int64_t index, WorkerContext& ctx) override {
    if (index < 0 || index >= size_) {
      return InvalidArgument("index " + std::to_string(index) + " out of range");
    }
    BeforeSample(index, ctx);
    Sample s;
    s.AddScalar<int64_t>("index", index);
    Array& v = s.Add("value", DType::kF32, {DimFor(index)});
    float acc = static_cast<float>(index);
    for (int64_t k = 0; k < work_; ++k) acc = std::sin(acc) * 0.5f + static_cast<float>(index);
    auto values = v.As<float>();
    std::fill(values.begin(), values.end(),
              work_ > 0 ? std::round(acc) : static_cast<float>(index));
    s.AddScalar<int32_t>("worker", ctx.worker_id);
    s.AddScalar<int32_t>("incarnation", ctx.incarnation);
    s.AddScalar<int64_t>("pid", getpid());
    Extra(s, index, ctx);
    if (sleep_ms_ > 0 && (slow_worker_ < 0 || slow_worker_ == ctx.worker_id)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms_));
    }
    return s;
  }

 protected:
  virtual void BeforeSample(int64_t index, WorkerContext& ctx) {}
  virtual void Extra(Sample& s, int64_t index, WorkerContext& ctx) {}
  virtual int64_t DimFor(int64_t index) const { return dim_; }

  std::map<std::string, std::string> args_;
  int64_t size_, dim_, work_, sleep_ms_, slow_worker_;
};

class HangDataset : public IndexDataset {
 public:
  using IndexDataset::IndexDataset;

 protected:
  void BeforeSample(int64_t index, WorkerContext&) override {
    if (index == Int(args_, "at", -1) && ClaimMarker(Str(args_, "marker"))) {
      std::fprintf(stderr, "hanging on index %lld\n", static_cast<long long>(index));
      while (true) pause();
    }
  }
};

class ThrowDataset : public IndexDataset {
 public:
  using IndexDataset::IndexDataset;
  StatusOr<Sample> Get(int64_t index, WorkerContext& ctx) override {
    if (index == Int(args_, "at", -1)) {
      if (Str(args_, "mode") == "status") {
        return InvalidArgument("corrupt record " + std::to_string(index));
      }
      throw std::runtime_error("cannot decode sample " + std::to_string(index));
    }
    return IndexDataset::Get(index, ctx);
  }
};

class CrashDataset : public IndexDataset {
 public:
  using IndexDataset::IndexDataset;

 protected:
  void BeforeSample(int64_t index, WorkerContext& ctx) override {
    if (index != Int(args_, "at", -1)) return;
    if (ctx.incarnation >= Int(args_, "until_incarnation", 1 << 30)) return;
    const std::string marker = Str(args_, "marker");
    if (!marker.empty() && !ClaimMarker(marker)) return;
    const int sig = static_cast<int>(Int(args_, "signal", SIGKILL));
    std::fprintf(stderr, "about to crash on index %lld with signal %d\n",
                 static_cast<long long>(index), sig);
    std::fflush(stderr);
    raise(sig);
  }
};

class AugmentDataset : public IndexDataset {
 public:
  using IndexDataset::IndexDataset;

 protected:
  void Extra(Sample& s, int64_t, WorkerContext& ctx) override {
    s.AddScalar<int64_t>("rand", static_cast<int64_t>(ctx.rng()));
    s.AddScalar<int64_t>("seed", static_cast<int64_t>(ctx.seed));
  }
};

class VarSizeDataset : public IndexDataset {
 public:
  using IndexDataset::IndexDataset;

 protected:
  int64_t DimFor(int64_t index) const override {
    return index >= Int(args_, "grow_at", size_) ? Int(args_, "big_dim", dim_ * 4) : dim_;
  }
};

SPAWNPOINT_REGISTER_DATASET("index",
                            [](const std::string& a) { return std::make_unique<IndexDataset>(a); });
SPAWNPOINT_REGISTER_DATASET("hang",
                            [](const std::string& a) { return std::make_unique<HangDataset>(a); });
SPAWNPOINT_REGISTER_DATASET("throw",
                            [](const std::string& a) { return std::make_unique<ThrowDataset>(a); });
SPAWNPOINT_REGISTER_DATASET("crash",
                            [](const std::string& a) { return std::make_unique<CrashDataset>(a); });
SPAWNPOINT_REGISTER_DATASET("augment", [](const std::string& a) {
  return std::make_unique<AugmentDataset>(a);
});
SPAWNPOINT_REGISTER_DATASET("varsize", [](const std::string& a) {
  return std::make_unique<VarSizeDataset>(a);
});
}  // namespace
}  // namespace spawnpoint::loader::testing
