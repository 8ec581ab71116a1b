// The example trainer's data set for the spawnpoint loader: synthetic "images" decoded
// and augmented on loader workers, with real CPU cost per sample, so worker parallelism
// matters as it does for image pipelines. Deterministic: a sample depends only on
// (seed, index) and its augmentation on (seed, epoch, index), never on which worker built
// it, so a respawned worker or a different worker count yields the same batches.
#pragma once

#include <cstdint>
#include <string>

namespace spawnpoint::trainer {

inline constexpr const char* kDatasetName = "example-regression";
inline constexpr int64_t kFeatures = 32;  // the "x" field: [kFeatures] float32 per sample
inline constexpr int64_t kNoise = 8;      // the "noise" field: [kNoise] float32 label noise

// The loader's dataset argument: "size=N,seed=S,passes=P".
std::string DatasetArg(int64_t size, uint64_t seed, int decode_passes);

}  // namespace spawnpoint::trainer
