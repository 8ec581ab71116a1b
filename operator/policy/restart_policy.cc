#include "operator/policy/restart_policy.h"

#include <algorithm>

namespace spawnpoint::op {

RestartDecision DecideRestart(const PodFailure& failure, const api::RestartPolicy& policy,
                              int restarts, int quick) {
  RestartDecision d;
  const std::string what = failure.Describe();
  const api::RestartVerdict verdict = api::JudgeRestart(policy, restarts, failure.retryable);
  if (verdict == api::RestartVerdict::kNotRetryable) {
    d.reason = "NonRetryableFailure";
    d.message =
        what + (failure.reason == "Stalled" ? std::string(" (stallPolicy.action is Fail)")
                                            : " (exit code " + std::to_string(failure.exit_code) +
                                                  " is not retryable under the restart policy)");
    return d;
  }
  if (verdict == api::RestartVerdict::kMaxRestartsReached) {
    d.reason = "MaxRestartsReached";
    d.message = what + " (maxRestarts " + std::to_string(policy.max_restarts) + " reached)";
    return d;
  }
  const int next = restarts + 1;
  d.restart = true;
  d.reason = failure.reason.empty() ? "PodFailed" : failure.reason;
  d.message = what + "; restart " + std::to_string(next) + " of " +
              std::to_string(policy.max_restarts) + " " + api::RestartWhen(policy, quick);
  return d;
}

Clock::Duration RestartWaitRemaining(const api::RestartPolicy& policy, int quick,
                                     std::optional<WallTime> failed_at, WallTime now) {
  if (!failed_at) return Clock::Duration::zero();
  auto ready =
      *failed_at + std::chrono::duration_cast<WallTime::duration>(RestartBackoff(policy, quick));
  if (now >= ready) return Clock::Duration::zero();
  return std::chrono::duration_cast<Clock::Duration>(ready - now);
}

}  // namespace spawnpoint::op

namespace spawnpoint::op {

Clock::Duration AttemptRan(const std::vector<const nlohmann::json*>& pods, WallTime now) {
  std::optional<WallTime> first;
  for (const nlohmann::json* pod : pods) {
    const nlohmann::json* meta = pod->contains("metadata") ? &(*pod)["metadata"] : nullptr;
    if (meta == nullptr || !meta->contains("creationTimestamp") ||
        !(*meta)["creationTimestamp"].is_string()) {
      continue;
    }
    std::optional<WallTime> created = ParseTime((*meta)["creationTimestamp"].get<std::string>());
    if (created && (!first || *created < *first)) first = created;
  }
  if (!first || now <= *first) return Clock::Duration::zero();
  return std::chrono::duration_cast<Clock::Duration>(now - *first);
}

}  // namespace spawnpoint::op
