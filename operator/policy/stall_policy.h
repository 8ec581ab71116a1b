// Stalled ranks (issue 13): what the job's Stalled condition, status.stall and the
// RankStalled event say. The agents name a rank that made no step for spec.stallPolicy's
// timeout in their status document ("stall", docs/status.md), and a rank they stopped for it
// (action Restart or Fail) in the termination message (reason Stalled). The condition is True
// (reason RankStalled, the agent's message) while the current attempt has a stalled rank,
// False once no agent reports one (reason Progressing) or the gang restarts (GangRestarted);
// a Warning event RankStalled is recorded once per distinct stall: another rank or pod, or
// the same rank stalled again after it made progress. status.stall keeps the stall the event
// was recorded for, so an operator restart does not repeat it. Pure functions; thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "operator/policy/failure_policy.h"

namespace spawnpoint::op {

namespace stall_reason {
inline constexpr const char* kRankStalled = "RankStalled";  // condition True; the event
inline constexpr const char* kProgressing = "Progressing";  // no agent reports a stall
inline constexpr const char* kGangRestarted = "GangRestarted";
inline constexpr const char* kStalledExit = "Stalled";  // the termination message's reason
}  // namespace stall_reason

struct StallUpdate {
  // The Stalled condition to set; nullopt leaves it as it is. The reconciler writes False
  // only if the condition was ever set.
  std::optional<bool> stalled;
  std::string reason;
  std::string message;
  // status.stall from now on: an object, or null.
  nlohmann::json stall;
  // Record a Warning event RankStalled with `event_message`: a stall not reported before.
  bool event = false;
  std::string event_message;
};

// From the latest reading of the running attempt's agents. `previous` is status.stall
// (object or null); `reading` the job's stall (JobStall: the agent's "stall" object of the
// culprit, or null when every agent was read and none reports one); `now` RFC 3339.
// status.stall becomes {rank, pod, silentSeconds, medianStepSeconds, topFrame, waiting,
// since}: `since` is when the operator first saw this stall.
StallUpdate DecideStallFromReading(const nlohmann::json& previous, const nlohmann::json& reading,
                                   const std::string& now);

// After a failed attempt: `failure` ended it, and the gang restarts (`restart`) or the job
// fails. A restart clears the condition and status.stall (the next attempt has not stalled);
// a Stalled failure records the event if the poller has not already, and when the job fails
// leaves the condition True with the failure's message.
StallUpdate DecideStallAfterFailure(const nlohmann::json& previous, const PodFailure& failure,
                                    bool restart, int attempt, const std::string& now);

// Whether `a` and `b` (status.stall or a reading) name the same stall: the same rank and
// pod, and `b` not silent for less time than `a` (which would mean the rank stepped since).
bool SameStall(const nlohmann::json& a, const nlohmann::json& b);

}  // namespace spawnpoint::op
