#include "operator/policy/stall_policy.h"

#include <cstdio>

#include "api/straggler.h"

namespace spawnpoint::op {

using nlohmann::json;

namespace {

constexpr const char* kNoStall = "no agent reports a stalled rank";
constexpr const char* kNoStraggler =
    "no rank is slower than stallPolicy.stragglerRatio x its peers";

std::optional<double> Number(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return std::nullopt;
  return j[key].get<double>();
}

json Field(const json& j, const char* key) {
  return j.is_object() && j.contains(key) ? j[key] : json();
}

// Seconds as the agent writes them in its messages.
std::string Seconds(double s) {
  char buf[32];
  snprintf(buf, sizeof(buf), s >= 10 ? "%.0f s" : "%.2g s", s);
  return buf;
}

}  // namespace

bool SameStraggler(const json& a, const json& b) {
  return a.is_object() && b.is_object() && Field(a, "rank") == Field(b, "rank") &&
         Field(a, "pod") == Field(b, "pod");
}

std::string DescribeStraggler(const json& straggler) {
  char ratio[32];
  snprintf(ratio, sizeof(ratio), "%.2fx", Number(straggler, "ratio").value_or(0));
  const std::string pod = straggler.is_object() ? straggler.value("pod", std::string("?")) : "?";
  return "rank " + Field(straggler, "rank").dump() + " (pod " + pod + ") is " + ratio +
         " slower than the other ranks: " + Seconds(Number(straggler, "busySeconds").value_or(0)) +
         " of its own work per step vs " +
         Seconds(Number(straggler, "peersBusySeconds").value_or(0)) + " (medians of the last " +
         std::to_string(api::kStragglerWindowSteps) + " steps)";
}

StallUpdate DecideStallFromReadings(const json& previous_stall, const json& previous_straggler,
                                    const std::optional<json>& stall,
                                    const std::optional<json>& straggler, const std::string& now) {
  StallUpdate u;
  if (stall) {
    u = DecideStallFromReading(previous_stall, *stall, now);
  } else {
    u.stall = previous_stall;
  }
  if (straggler && straggler->is_object()) {
    const bool same = SameStraggler(previous_straggler, *straggler);
    json kept = json::object();
    for (const char* key : {"rank", "pod", "ratio", "busySeconds", "peersBusySeconds"}) {
      if (straggler->contains(key) && !(*straggler)[key].is_null()) kept[key] = (*straggler)[key];
    }
    kept["since"] =
        same && previous_straggler.contains("since") ? previous_straggler["since"] : json(now);
    u.straggler = std::move(kept);
    u.straggler_event = !same;
    if (u.straggler_event) u.straggler_event_message = DescribeStraggler(*u.straggler);
  } else if (straggler) {
    u.straggler = nullptr;
  }
  // A slow rank is not a hang: the straggler has a condition of its own.
  const json& named = u.straggler ? *u.straggler : previous_straggler;
  if (named.is_object()) {
    u.straggling = true;
    u.straggling_reason = straggler_reason::kSlowerThanPeers;
    u.straggling_message = DescribeStraggler(named);
  } else if (straggler) {
    u.straggling = false;
    u.straggling_reason = straggler_reason::kNoStraggler;
    u.straggling_message = kNoStraggler;
  }
  return u;
}

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
    u.straggler = nullptr;
    u.straggling = false;
    u.straggling_reason = stall_reason::kGangRestarted;
    u.straggling_message = u.message;
  }
  return u;
}

}  // namespace spawnpoint::op
