// The typed form of TrainingJob.status, which only the operator writes: phase, metav1
// Conditions (lastTransitionTime moves only when a condition's status flips), counts,
// lastFailure, lastEviction, utilisation, stall and straggler. ToJson(FromJson(x)) drops unknown
// fields, so comparing the JSON before and after a reconcile tells whether a status write is
// needed. A value type; not thread-safe to mutate concurrently.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace spawnpoint::op {

namespace phase {
inline constexpr const char* kPending = "Pending";
// Gang kueue: the pods wait, gated, for Kueue to admit the group (admission_policy.h).
inline constexpr const char* kQueued = "Queued";
inline constexpr const char* kRunning = "Running";
inline constexpr const char* kRestarting = "Restarting";
inline constexpr const char* kSucceeded = "Succeeded";
inline constexpr const char* kFailed = "Failed";
inline constexpr const char* kSuspended = "Suspended";
}  // namespace phase

namespace condition {
inline constexpr const char* kCreated = "Created";
inline constexpr const char* kRunning = "Running";
inline constexpr const char* kRestarting = "Restarting";
inline constexpr const char* kSucceeded = "Succeeded";
inline constexpr const char* kFailed = "Failed";
inline constexpr const char* kSuspended = "Suspended";
inline constexpr const char* kStalled = "Stalled";      // operator/policy/stall_policy.h
inline constexpr const char* kStraggler = "Straggler";  // operator/policy/stall_policy.h
inline constexpr const char* kQueued = "Queued";        // operator/policy/admission_policy.h
inline constexpr const char* kQuotaExceeded = "QuotaExceeded";  // operator/policy/quota_policy.h
// True while no operator runs (set by operator/watchdog/status_watchdog.h, cleared by the
// operator's first reconcile after).
inline constexpr const char* kStatusStale = "StatusStale";
}  // namespace condition

struct Condition {
  std::string type;
  std::string status;  // "True", "False", "Unknown"
  int64_t observed_generation = 0;
  std::string last_transition_time;
  std::string reason;
  std::string message;
};

struct NodeCounts {
  int pending = 0;
  int running = 0;
  int succeeded = 0;
  int failed = 0;
};

struct JobStatus {
  std::string phase;
  std::vector<Condition> conditions;
  int64_t observed_generation = 0;
  int world_size = 0;
  int gpus = 0;
  int restarts = 0;
  // Gang kueue: times Kueue evicted the gang (preemption, ...); never counted as restarts.
  int evictions = 0;
  // restartPolicy.mode InPlace: the attempt at which the current gang's pods were created
  // (pods labelled earlier are stale); nullopt in Recreate mode, where it is `restarts`.
  std::optional<int> gang_attempt;
  std::string start_time;       // "" when unset
  std::string completion_time;  // "" when unset
  NodeCounts nodes;
  nlohmann::json last_failure;   // object, or null when none
  nlohmann::json last_eviction;  // gang kueue: Kueue's last eviction of the gang, or null
  nlohmann::json utilisation;    // object, or null when never read
  nlohmann::json stall;          // the stalled rank reported (stall_policy.h), or null
  nlohmann::json straggler;      // the job's straggler named (stall_policy.h), or null

  static JobStatus FromJson(const nlohmann::json& status);
  nlohmann::json ToJson() const;

  // The earliest attempt label a pod of the current gang carries.
  int GangAttempt() const { return gang_attempt.value_or(restarts); }

  const Condition* Find(const std::string& type) const;
  bool IsTrue(const std::string& type) const;
  bool Finished() const;  // Succeeded or Failed condition True
  // Sets `type`; lastTransitionTime becomes `now` only if the status changed (or the
  // condition is new). Returns true on such a transition.
  bool SetCondition(const std::string& type, bool status, const std::string& reason,
                    const std::string& message, int64_t generation, const std::string& now);
};

}  // namespace spawnpoint::op
