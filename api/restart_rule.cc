#include "api/restart_rule.h"

#include <algorithm>

namespace spawnpoint::api {

bool IsRetryableExitCode(const RestartPolicy& policy, int shell_code) {
  const auto& codes = policy.retryable_exit_codes;
  if (codes.empty()) return shell_code >= 128 && shell_code <= 255;
  return std::find(codes.begin(), codes.end(), shell_code) != codes.end();
}

Clock::Duration RestartBackoff(const RestartPolicy& policy, int restart) {
  if (restart < 1 || policy.backoff_seconds <= 0) return Clock::Duration::zero();
  Clock::Duration wait = std::chrono::seconds(policy.backoff_seconds);
  for (int i = 1; i < restart && wait < kMaxRestartBackoff; ++i) wait *= 2;
  return std::min<Clock::Duration>(wait, kMaxRestartBackoff);
}

RestartVerdict JudgeRestart(const RestartPolicy& policy, int restarts_done, bool retryable) {
  if (!retryable) return RestartVerdict::kNotRetryable;
  if (restarts_done >= policy.max_restarts) return RestartVerdict::kMaxRestartsReached;
  return RestartVerdict::kRestart;
}

bool ShouldRestart(const RestartPolicy& policy, int restarts_done, int shell_code) {
  return JudgeRestart(policy, restarts_done, IsRetryableExitCode(policy, shell_code)) ==
         RestartVerdict::kRestart;
}

}  // namespace spawnpoint::api
