// Which samples each rank loads in an epoch, with DataLoader + DistributedSampler
// semantics: a permutation of the dataset drawn from (seed, epoch), the same on every rank
// (or the identity without shuffling), padded by wrapping around to a multiple of the world
// size; rank r takes every world_size-th index starting at r; consecutive runs of
// batch_size form the batches, and drop_last drops a short last batch. The permutation is
// computed here (Fisher-Yates over mt19937_64 with rejection sampling) rather than with
// std::shuffle, whose algorithm differs between standard libraries. Pure functions.
#pragma once

#include <cstdint>
#include <vector>

namespace spawnpoint::loader {

struct SamplerOptions {
  int64_t dataset_size = 0;
  int64_t batch_size = 1;
  bool shuffle = false;
  bool drop_last = false;
  uint64_t seed = 0;
  int rank = 0;
  int world_size = 1;
};

std::vector<int64_t> EpochPermutation(int64_t size, bool shuffle, uint64_t seed, int64_t epoch);
std::vector<int64_t> RankIndices(const SamplerOptions& options, int64_t epoch);
std::vector<std::vector<int64_t>> EpochBatches(const SamplerOptions& options, int64_t epoch);
int64_t SamplesPerRank(const SamplerOptions& options);
int64_t BatchesPerEpoch(const SamplerOptions& options);

}  // namespace spawnpoint::loader
