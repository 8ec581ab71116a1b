#include "api/restart_rule.h"

#include <algorithm>
#include <string>

#include "api/field_reader.h"

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

const char* RestartModeName(RestartMode mode) {
  return kRestartModeNames[static_cast<size_t>(mode)].data();
}

// Each entry an exit code (1-255) or a failure cause's name.
static Status DecodeRetryOn(FieldReader& reader, const Field& field, RestartPolicy* policy) {
  if (!field.value) return Status::Ok();
  const std::string expected = "a list of exit codes (1-255) and failure causes";
  if (!field.value->is_array()) return reader.WrongType(field, expected);
  policy->retry_on_exit_codes.clear();
  policy->retry_on_causes.clear();
  for (size_t i = 0; i < field.value->size(); ++i) {
    const Field entry{&(*field.value)[i], field.path.Index(i)};
    if (entry.value->is_string()) {
      size_t index = 0;
      SP_RETURN_IF_ERROR(reader.ReadChoice(entry, kFailureCauses, &index));
      policy->retry_on_causes.emplace_back(kFailureCauses[index]);
      continue;
    }
    if (!entry.value->is_number_integer()) {
      return reader.WrongType(entry, "an exit code (1-255) or a failure cause (" +
                                         std::string(kFailureCauses[0]) + ", ...)");
    }
    int code = 0;
    SP_RETURN_IF_ERROR(reader.ReadInt(entry, 1, 255, &code));
    policy->retry_on_exit_codes.push_back(code);
  }
  return Status::Ok();
}

Status DecodeRestartPolicy(FieldReader& reader, const Field& field, RestartPolicy* policy) {
  if (!field.value) return Status::Ok();
  SP_RETURN_IF_ERROR(
      reader.CheckObject(*field.value, field.path, "the gang restart settings", kRestartFields));
  const nlohmann::json& r = *field.value;
  SP_RETURN_IF_ERROR(reader.ReadEnum(Get(r, field.path, "mode"), kRestartModeNames, &policy->mode));
  SP_RETURN_IF_ERROR(
      reader.ReadInt(Get(r, field.path, "maxRestarts"), 0, kIntMax, &policy->max_restarts));
  SP_RETURN_IF_ERROR(
      reader.ReadInt(Get(r, field.path, "backoffSeconds"), 0, kIntMax, &policy->backoff_seconds));
  SP_RETURN_IF_ERROR(reader.ReadInt(Get(r, field.path, "resetAfterSeconds"), 1, kIntMax,
                                    &policy->reset_after_seconds));
  SP_RETURN_IF_ERROR(reader.ReadBool(Get(r, field.path, "standby"), &policy->standby));
  Field codes = Get(r, field.path, "retryableExitCodes");
  if (codes.value) {
    if (!codes.value->is_array()) return reader.WrongType(codes, "a list of exit codes (1-255)");
    policy->retryable_exit_codes.clear();
    for (size_t i = 0; i < codes.value->size(); ++i) {
      int code = 0;
      SP_RETURN_IF_ERROR(reader.ReadInt({&(*codes.value)[i], codes.path.Index(i)}, 1, 255, &code));
      policy->retryable_exit_codes.push_back(code);
    }
  }
  return DecodeRetryOn(reader, Get(r, field.path, "retryOn"), policy);
}

}  // namespace spawnpoint::api
