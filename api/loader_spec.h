// spec.loader: how a TrainingJob's ranks load data (the agent's loader pool, its workers and
// their start-up), decoded and validated with located errors ("job.yaml:9:21:
// spec.loader.startMethod: \"fork\" is not allowed: ..."). Pure; thread-compatible (the
// reader's state).
#pragma once

#include <string_view>

#include "api/training_job.h"
#include "common/status.h"

namespace spawnpoint::api {

class FieldReader;  // api/field_reader.h, internal to api/
struct Field;

inline constexpr std::string_view kLoaderFields[] = {
    "workersPerRank", "prefetchFactor", "persistentWorkers", "pinMemory",  "timeoutSeconds",
    "seed",           "startMethod",    "workerCommand",     "pythonPool", "preloadModules"};

// Reads spec.loader (absent: `loader` as it is) into `loader`; the first error names the field.
Status DecodeLoaderSpec(FieldReader& reader, const Field& field, LoaderSpec* loader);

}  // namespace spawnpoint::api
