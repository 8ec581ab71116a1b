#include "agent/loader/sampler.h"

#include <algorithm>
#include <random>

namespace spawnpoint::loader {
namespace {

// Uniform in [0, bound) without modulo bias.
uint64_t Bounded(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t x;
  do {
    x = rng();
  } while (x >= limit);
  return x % bound;
}

}  // namespace

std::vector<int64_t> EpochPermutation(int64_t size, bool shuffle, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> p(static_cast<size_t>(std::max<int64_t>(size, 0)));
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<int64_t>(i);
  if (!shuffle || p.size() < 2) return p;
  // DistributedSampler seeds its generator with seed + epoch.
  std::mt19937_64 rng(seed + static_cast<uint64_t>(epoch));
  for (size_t i = p.size() - 1; i > 0; --i) {
    std::swap(p[i], p[Bounded(rng, i + 1)]);
  }
  return p;
}

int64_t SamplesPerRank(const SamplerOptions& o) {
  if (o.dataset_size <= 0 || o.world_size <= 0) return 0;
  return (o.dataset_size + o.world_size - 1) / o.world_size;
}

std::vector<int64_t> RankIndices(const SamplerOptions& o, int64_t epoch) {
  std::vector<int64_t> all = EpochPermutation(o.dataset_size, o.shuffle, o.seed, epoch);
  const int64_t per_rank = SamplesPerRank(o);
  std::vector<int64_t> mine;
  if (all.empty()) return mine;
  mine.reserve(static_cast<size_t>(per_rank));
  const int64_t n = static_cast<int64_t>(all.size());
  for (int64_t k = 0; k < per_rank; ++k) {
    // Position in the padded list; positions past the end wrap to the start.
    int64_t pos = k * o.world_size + o.rank;
    mine.push_back(all[static_cast<size_t>(pos % n)]);
  }
  return mine;
}

int64_t BatchesPerEpoch(const SamplerOptions& o) {
  const int64_t n = SamplesPerRank(o);
  if (o.batch_size <= 0) return 0;
  return o.drop_last ? n / o.batch_size : (n + o.batch_size - 1) / o.batch_size;
}

std::vector<std::vector<int64_t>> EpochBatches(const SamplerOptions& o, int64_t epoch) {
  std::vector<int64_t> mine = RankIndices(o, epoch);
  const int64_t batches = BatchesPerEpoch(o);
  std::vector<std::vector<int64_t>> out;
  out.reserve(static_cast<size_t>(batches));
  for (int64_t b = 0; b < batches; ++b) {
    const size_t begin = static_cast<size_t>(b * o.batch_size);
    const size_t end = std::min(mine.size(), begin + static_cast<size_t>(o.batch_size));
    out.emplace_back(mine.begin() + begin, mine.begin() + end);
  }
  return out;
}

}  // namespace spawnpoint::loader
