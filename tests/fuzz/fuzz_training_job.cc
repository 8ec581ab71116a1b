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

namespace {

// As the project writes a job: a manifest may carry bytes that are not UTF-8, so dumps
// replace them (TrainingJob.InvalidUtf8IsReportedNotThrown) rather than throw.
void Dump(const nlohmann::json& j) {
  (void)j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  for (bool local : {false, true}) {
    api::ParseOptions options;
    options.local = local;
    auto jobs = api::ParseTrainingJobs(text, "fuzz", options);
    if (jobs.ok()) {
      for (const auto& job : *jobs) Dump(api::TrainingJobToJson(job));
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
