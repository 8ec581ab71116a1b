// The Loader for 0 workers: each batch is built by the dataset in the trainer's thread, on
// the heap, when Next() asks for it. Thread-safety as Loader's: StartEpoch/Next from one
// thread (REQUIRES: the training loop's), Stats() from any.
#pragma once

#include <memory>

#include "agent/loader/loader.h"
#include "agent/loader/sampler.h"
#include "common/clock.h"

namespace spawnpoint::loader {

// Creates the dataset `options.dataset` in this process and a Loader over it. `options` are
// resolved (ResolveLoaderOptions); `sampler` is complete but for dataset_size. `clock`
// outlives the Loader.
StatusOr<std::unique_ptr<Loader>> CreateInProcessLoader(LoaderOptions options,
                                                        SamplerOptions sampler, const Clock* clock);

}  // namespace spawnpoint::loader
