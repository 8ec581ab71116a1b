#include "operator/policy/restart_policy.h"

#include <algorithm>

namespace spawnpoint::op {

RestartDecision DecideRestart(const PodFailure& failure, const api::RestartPolicy& policy,
                              int restarts) {
  RestartDecision d;
  const std::string what = failure.Describe();
  const api::RestartVerdict verdict = api::JudgeRestart(policy, restarts, failure.retryable);
  if (verdict == api::RestartVerdict::kNotRetryable) {
    d.reason = "NonRetryableFailure";
    d.message = what + " (exit code " + std::to_string(failure.exit_code) +
                " is not retryable under the restart policy)";
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
              std::to_string(policy.max_restarts) + " after " +
              FormatDuration(RestartBackoff(policy, next));
  return d;
}

Clock::Duration RestartWaitRemaining(const api::RestartPolicy& policy, int restart,
                                     std::optional<WallTime> failed_at, WallTime now) {
  if (!failed_at) return Clock::Duration::zero();
  auto ready =
      *failed_at + std::chrono::duration_cast<WallTime::duration>(RestartBackoff(policy, restart));
  if (now >= ready) return Clock::Duration::zero();
  return std::chrono::duration_cast<Clock::Duration>(ready - now);
}

}  // namespace spawnpoint::op
