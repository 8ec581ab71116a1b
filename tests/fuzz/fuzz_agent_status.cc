// The node agent's /status document as the operator reads it: parsed as
// HttpAgentStatusReader::Read parses the body, then folded by the operator's readers of it,
// op::AggregateUtilisation, op::JobStall and op::JobStraggler. The input holds up to four
// pods' documents separated by "\n--\n"; a part that is not a JSON object is a pod that
// could not be read.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "operator/utilisation/agent_status.h"
#include "tests/fuzz/fuzz_input.h"

namespace op = spawnpoint::op;
using nlohmann::json;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<op::PodReading> readings;
  int i = 0;
  for (const std::string& part : spawnpoint::fuzz::SplitParts(data, size, 4)) {
    json doc = json::parse(part, nullptr, /*allow_exceptions=*/false);
    op::PodReading reading{"pod-" + std::to_string(i++), json()};
    if (doc.is_object()) {
      reading.status = std::move(doc);
    } else {
      reading.status = spawnpoint::Internal("GET /status: the body is not a JSON object");
    }
    readings.push_back(std::move(reading));
  }
  (void)op::AggregateUtilisation(readings, "2026-01-01T00:00:00Z").dump();
  if (auto stall = op::JobStall(readings)) (void)stall->dump();
  if (auto s = op::JobStraggler(readings, 1.5, json())) {
    (void)s->straggler.dump();
    // As the next poll sees it: the verdict is the previous one.
    (void)op::JobStraggler(readings, 1.5, s->straggler);
  }
  return 0;
}
