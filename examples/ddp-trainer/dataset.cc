#include "examples/ddp-trainer/dataset.h"

#include <cmath>
#include <cstdlib>
#include <map>
#include <random>
#include <sstream>

#include "agent/loader/dataset.h"

namespace spawnpoint::trainer {
namespace {

constexpr int kSide = 32;  // the decoded image is kSide x kSide

uint64_t Mix(uint64_t a, uint64_t b) {
  // splitmix64 of a combined key: well-spread streams from neighbouring indices.
  uint64_t z = a ^ (b + 0x9e3779b97f4a7c15ULL + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class RegressionImages : public loader::Dataset {
 public:
  RegressionImages(int64_t size, uint64_t seed, int passes)
      : size_(size), seed_(seed), passes_(passes) {}

  int64_t Size() const override { return size_; }

  StatusOr<loader::Sample> Get(int64_t index, loader::WorkerContext& ctx) override {
    std::mt19937_64 rng(Mix(seed_, static_cast<uint64_t>(index)));
    std::normal_distribution<float> normal;
    float latent[2 * kSide];
    for (float& v : latent) v = normal(rng);
    // "Decode": render the latent into an image, then smooth it `passes_` times; this is
    // the per-sample CPU cost a real JPEG decode + resize would have.
    static thread_local std::vector<float> image(kSide * kSide), next(kSide * kSide);
    for (int r = 0; r < kSide; ++r) {
      for (int c = 0; c < kSide; ++c) {
        image[r * kSide + c] = std::tanh(latent[r] * latent[kSide + c] + latent[(r + c) % kSide]);
      }
    }
    for (int p = 0; p < passes_; ++p) {
      for (int r = 0; r < kSide; ++r) {
        for (int c = 0; c < kSide; ++c) {
          float sum = 0;
          for (int dr = -1; dr <= 1; ++dr) {
            for (int dc = -1; dc <= 1; ++dc) {
              sum += image[((r + dr + kSide) % kSide) * kSide + (c + dc + kSide) % kSide];
            }
          }
          next[r * kSide + c] = 0.5f * image[r * kSide + c] + sum / 18.0f;
        }
      }
      image.swap(next);
    }
    // Features: per-row means, standardised, plus a small per-epoch augmentation jitter.
    float features[kFeatures];
    double mean = 0, var = 0;
    for (int r = 0; r < kFeatures; ++r) {
      float s = 0;
      for (int c = 0; c < kSide; ++c) s += image[r * kSide + c];
      features[r] = s / kSide + 0.5f * latent[r];
      mean += features[r];
    }
    mean /= kFeatures;
    for (float f : features) var += (f - mean) * (f - mean);
    const float scale = 1.0f / static_cast<float>(std::sqrt(var / kFeatures) + 1e-6);
    std::mt19937_64 augment(Mix(Mix(seed_, static_cast<uint64_t>(ctx.epoch)), index));
    std::normal_distribution<float> jitter(0.0f, 0.01f);
    loader::Sample sample;
    auto x = sample.Add("x", loader::DType::kF32, {kFeatures}).As<float>();
    for (int r = 0; r < kFeatures; ++r) x[r] = (features[r] - mean) * scale + jitter(augment);
    auto noise = sample.Add("noise", loader::DType::kF32, {kNoise}).As<float>();
    for (float& v : noise) v = normal(rng);
    return sample;
  }

 private:
  int64_t size_;
  uint64_t seed_;
  int passes_;
};

StatusOr<std::unique_ptr<loader::Dataset>> MakeRegressionImages(const std::string& arg) {
  std::map<std::string, std::string> kv;
  std::stringstream in(arg);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t eq = item.find('=');
    if (eq == std::string::npos)
      return InvalidArgument(std::string(kDatasetName) + ": bad argument \"" + item + "\"");
    kv[item.substr(0, eq)] = item.substr(eq + 1);
  }
  try {
    int64_t size = std::stoll(kv.at("size"));
    uint64_t seed = std::stoull(kv.at("seed"));
    int passes = std::stoi(kv.at("passes"));
    if (size <= 0 || passes < 0) throw std::out_of_range("range");
    return std::unique_ptr<loader::Dataset>(new RegressionImages(size, seed, passes));
  } catch (const std::exception&) {
    return InvalidArgument(std::string(kDatasetName) +
                           ": expected \"size=N,seed=S,passes=P\" with N > 0 and P >= 0, got \"" +
                           arg + "\"");
  }
}

SPAWNPOINT_REGISTER_DATASET(kDatasetName, MakeRegressionImages);

}  // namespace

std::string DatasetArg(int64_t size, uint64_t seed, int decode_passes) {
  return "size=" + std::to_string(size) + ",seed=" + std::to_string(seed) +
         ",passes=" + std::to_string(decode_passes);
}

}  // namespace spawnpoint::trainer
