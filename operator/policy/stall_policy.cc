#include "operator/policy/stall_policy.h"

namespace spawnpoint::op {

using nlohmann::json;

namespace {

constexpr const char* kNoStall = "no agent reports a stalled rank";

std::optional<double> Number(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return std::nullopt;
  return j[key].get<double>();
}

json Field(const json& j, const char* key) {
  return j.is_object() && j.contains(key) ? j[key] : json();
}

}  // namespace

bool SameStall(const json& a, const json& b) {
  if (!a.is_object() || !b.is_object()) return false;
  if (Field(a, "rank") != Field(b, "rank") || Field(a, "pod") != Field(b, "pod")) return false;
  std::optional<double> before = Number(a, "silentSeconds");
  std::optional<double> after = Number(b, "silentSeconds");
  return !before || !after || *after >= *before;
}

StallUpdate DecideStallFromReading(const json& previous, const json& reading,
                                   const std::string& now) {
  StallUpdate u;
  if (!reading.is_object()) {
    u.stalled = false;
    u.reason = stall_reason::kProgressing;
    u.message = kNoStall;
    u.stall = nullptr;
    return u;
  }
  const bool same = SameStall(previous, reading);
  json stall = json::object();
  for (const char* key : {"rank", "pod", "silentSeconds", "medianStepSeconds", "topFrame"}) {
    if (reading.contains(key) && !reading[key].is_null()) stall[key] = reading[key];
  }
  if (reading.contains("waiting") && reading["waiting"].is_array() && !reading["waiting"].empty()) {
    stall["waiting"] = reading["waiting"];
  }
  stall["since"] = same && previous.contains("since") ? previous["since"] : json(now);
  u.stalled = true;
  u.reason = stall_reason::kRankStalled;
  u.message = reading.value("message", "");
  if (u.message.empty()) {
    u.message = "rank " + Field(reading, "rank").dump() + " (pod " +
                reading.value("pod", std::string("?")) + ") made no step";
  }
  u.stall = std::move(stall);
  u.event = !same;
  if (u.event) u.event_message = u.message;
  return u;
}

StallUpdate DecideStallAfterFailure(const json& previous, const PodFailure& failure, bool restart,
                                    int attempt, const std::string& now) {
  StallUpdate u;
  u.stall = previous;
  const bool stalled = failure.reason == stall_reason::kStalledExit;
  if (stalled) {
    json reading = {{"rank", failure.rank}, {"pod", failure.pod}};
    u.event = !SameStall(previous, reading);
    u.message = failure.message;
    if (u.event) u.event_message = failure.message;
    if (!restart) {
      u.stalled = true;
      u.reason = stall_reason::kRankStalled;
      reading["since"] = u.event ? json(now) : previous.value("since", json(now));
      u.stall = std::move(reading);
    }
  }
  if (restart) {
    u.stalled = false;
    u.reason = stall_reason::kGangRestarted;
    u.message = "attempt " + std::to_string(attempt) + " failed" +
                (stalled ? " on a stalled rank" : "") + "; the gang restarts";
    u.stall = nullptr;
  }
  return u;
}

}  // namespace spawnpoint::op
