// Stalled and straggling ranks (issue 13): what the job's Stalled and Straggler conditions,
// status.stall, status.straggler and the RankStalled and Straggler events say. The agents name
// a rank that made no step for spec.stallPolicy's timeout in their status document ("stall",
// docs/status.md), and a rank they stopped for it (action Restart or Fail) in the termination
// message (reason Stalled). The operator itself names the job's straggler: the slowest rank
// of the whole job by its own work per step, from every agent's figures (JobStraggler,
// operator/utilisation/agent_status.h). A hang and slowness are told apart: Stalled is True
// (reason RankStalled, the agent's message) only while the current attempt has a rank that
// makes no step, False once none is reported (reason Progressing) or the gang restarts
// (GangRestarted); Straggler is True (reason SlowerThanPeers: rank, pod, ratio and what was
// measured) while the job has a rank that steps but slower than its peers, False once it
// has none (NoStraggler) or the gang restarts. A Warning event
// RankStalled is recorded once per distinct stall: another rank or pod, or the same rank
// stalled again after it made progress; a Warning event Straggler once per distinct
// straggler (rank and pod), again only after it was cleared. status.stall and
// status.straggler keep what the events were recorded for, so an operator restart does not
// repeat them. Pure functions; thread-safe.
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
inline constexpr const char* kStraggler = "Straggler";  // the event
}  // namespace stall_reason

namespace straggler_reason {
inline constexpr const char* kSlowerThanPeers = "SlowerThanPeers";  // condition True
inline constexpr const char* kNoStraggler = "NoStraggler";
}  // namespace straggler_reason

struct StallUpdate {
  // The Stalled condition to set; nullopt leaves it as it is. The reconciler writes False
  // only if the condition was ever set.
  std::optional<bool> stalled;
  std::string reason;
  std::string message;
  // The Straggler condition to set, likewise.
  std::optional<bool> straggling;
  std::string straggling_reason;
  std::string straggling_message;
  // status.stall from now on: an object, or null.
  nlohmann::json stall;
  // Record a Warning event RankStalled with `event_message`: a stall not reported before.
  bool event = false;
  std::string event_message;
  // status.straggler from now on (an object, or null); nullopt leaves it as it is.
  std::optional<nlohmann::json> straggler;
  // Record a Warning event Straggler with `straggler_event_message`: a straggler not named
  // before.
  bool straggler_event = false;
  std::string straggler_event_message;
};

// From the latest reading of the running attempt's agents. `previous` is status.stall
// (object or null); `reading` the job's stall (JobStall: the agent's "stall" object of the
// culprit, or null when every agent was read and none reports one); `now` RFC 3339.
// status.stall becomes {rank, pod, silentSeconds, medianStepSeconds, topFrame, waiting,
// since}: `since` is when the operator first saw this stall.
StallUpdate DecideStallFromReading(const nlohmann::json& previous, const nlohmann::json& reading,
                                   const std::string& now);

// From the latest readings of the running attempt's agents, each nullopt when it is not
// known (some pod could not be read): `stall` as for DecideStallFromReading, `straggler` the
// job's straggler (JobStraggler: {rank, pod, ratio, busySeconds, peersBusySeconds, ...}, or
// null when every agent was read and none of the job's ranks straggles). `previous_stall` and
// `previous_straggler` are status.stall and status.straggler. Each sets its own condition: a
// job may have a stalled rank and a straggler at once. status.straggler becomes {rank, pod,
// ratio, busySeconds, peersBusySeconds, since}: `since` is when the operator first named it.
StallUpdate DecideStallFromReadings(const nlohmann::json& previous_stall,
                                    const nlohmann::json& previous_straggler,
                                    const std::optional<nlohmann::json>& stall,
                                    const std::optional<nlohmann::json>& straggler,
                                    const std::string& now);

// After a failed attempt: `failure` ended it, and the gang restarts (`restart`) or the job
// fails. A restart clears the Stalled condition and status.stall (the next attempt has not
// stalled); a Stalled failure records the event if the poller has not already, and when the
// job fails leaves the condition True with the failure's message. A restart clears the
// Straggler condition and status.straggler too: a straggler of the next attempt is a new one.
StallUpdate DecideStallAfterFailure(const nlohmann::json& previous, const PodFailure& failure,
                                    bool restart, int attempt, const std::string& now);

// Whether `a` and `b` (status.stall or a reading) name the same stall: the same rank and
// pod, and `b` not silent for less time than `a` (which would mean the rank stepped since).
bool SameStall(const nlohmann::json& a, const nlohmann::json& b);

// Whether `a` and `b` (status.straggler or a reading) name the same straggler: the same rank
// and pod.
bool SameStraggler(const nlohmann::json& a, const nlohmann::json& b);

// A straggler ({rank, pod, ratio, busySeconds, peersBusySeconds}) in words, as the agent
// says it: "rank 1 (pod big-node-1) is 1.98x slower than the other ranks: 0.1 s of its own
// work per step vs 0.051 s (medians of the last 20 steps)".
std::string DescribeStraggler(const nlohmann::json& straggler);

}  // namespace spawnpoint::op
