#include "agent/supervisor/restart_policy.h"

#include <algorithm>

namespace spawnpoint::agent {

std::chrono::milliseconds RestartBackoff(const api::RestartPolicy& policy, int restart) {
  using std::chrono::milliseconds;
  if (restart < 1 || policy.backoff_seconds <= 0) return milliseconds(0);
  const milliseconds cap = kMaxBackoff;
  milliseconds wait = std::chrono::seconds(policy.backoff_seconds);
  for (int i = 1; i < restart && wait < cap; ++i) wait *= 2;
  return std::min(wait, cap);
}

bool IsRetryableExitCode(const api::RestartPolicy& policy, int shell_code) {
  if (policy.retryable_exit_codes.empty()) return shell_code >= 128 && shell_code <= 255;
  return std::find(policy.retryable_exit_codes.begin(), policy.retryable_exit_codes.end(),
                   shell_code) != policy.retryable_exit_codes.end();
}

bool ShouldRestart(const api::RestartPolicy& policy, int restarts_done, int shell_code) {
  return restarts_done < policy.max_restarts && IsRetryableExitCode(policy, shell_code);
}

}  // namespace spawnpoint::agent
