// The TrainingJob manifest through parsing, defaulting and validation: as a YAML stream
// (api::ParseTrainingJobs, what `spawnpoint-agent run -f` reads; JSON is YAML) and as the
// JSON object the operator receives from the API server (api::TrainingJobFromJson). What
// parses is written back (TrainingJobToJson) and must parse again.
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "api/training_job.h"
#include "tests/fuzz/fuzz_input.h"

namespace api = spawnpoint::api;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  for (bool local : {false, true}) {
    api::ParseOptions options;
    options.local = local;
    auto jobs = api::ParseTrainingJobs(text, "fuzz", options);
    if (jobs.ok()) {
      for (const auto& job : *jobs) (void)api::TrainingJobToJson(job).dump();
    }
  }
  nlohmann::json object = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (object.is_object()) {
    auto job = api::TrainingJobFromJson(object);
    if (job.ok()) {
      // Defaulted and validated once, the written object is a valid job too.
      auto again = api::TrainingJobFromJson(api::TrainingJobToJson(*job));
      if (!again.ok()) {
        std::fprintf(stderr, "round trip failed: %s\n", again.status().ToString().c_str());
        __builtin_trap();
      }
    }
  }
  return 0;
}
