#include "api/restart_rule.h"

#include <algorithm>

namespace spawnpoint::api {

bool IsRetryableExitCode(const RestartPolicy& policy, int shell_code) {
  const auto& codes = policy.retryable_exit_codes;
  if (codes.empty()) return shell_code >= 128 && shell_code <= 255;
  return std::find(codes.begin(), codes.end(), shell_code) != codes.end();
}

bool IsRetryableFailure(const RestartPolicy& policy, int shell_code, std::string_view cause) {
  if (policy.retry_on_exit_codes.empty() && policy.retry_on_causes.empty()) {
    return IsRetryableExitCode(policy, shell_code);
  }
  const auto& codes = policy.retryable_exit_codes;
  const auto& on_codes = policy.retry_on_exit_codes;
  const auto& causes = policy.retry_on_causes;
  return std::find(codes.begin(), codes.end(), shell_code) != codes.end() ||
         std::find(on_codes.begin(), on_codes.end(), shell_code) != on_codes.end() ||
         (!cause.empty() && std::find(causes.begin(), causes.end(), cause) != causes.end());
}

int QuickFailuresAfter(const RestartPolicy& policy, int quick_before, Clock::Duration ran) {
  if (ran >= std::chrono::seconds(policy.reset_after_seconds)) return 1;
  return std::max(0, quick_before) + 1;
}

Clock::Duration RestartBackoff(const RestartPolicy& policy, int quick) {
  if (quick <= 1 || policy.backoff_seconds <= 0) return Clock::Duration::zero();
  Clock::Duration wait = std::chrono::seconds(policy.backoff_seconds);
  for (int i = 2; i < quick && wait < kMaxRestartBackoff; ++i) wait *= 2;
  return std::min<Clock::Duration>(wait, kMaxRestartBackoff);
}

std::string RestartWhen(const RestartPolicy& policy, int quick) {
  const Clock::Duration wait = RestartBackoff(policy, quick);
  if (wait <= Clock::Duration::zero()) return "now";
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(wait).count();
  std::string seconds = ms % 1000 == 0
                            ? std::to_string(ms / 1000)
                            : std::to_string(ms / 1000) + "." + std::to_string(ms % 1000 / 100);
  const int n = quick;
  const int last = n % 10, tens = n % 100 / 10;
  const char* suffix = tens == 1   ? "th"
                       : last == 1 ? "st"
                       : last == 2 ? "nd"
                       : last == 3 ? "rd"
                                   : "th";
  return "in " + seconds + "s: " + std::to_string(n) + suffix +
         " quick failure in a row (attempts under " + std::to_string(policy.reset_after_seconds) +
         "s)";
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
