#include "operator/policy/deadline_policy.h"

namespace spawnpoint::op {

DeadlineCheck CheckDeadline(const api::RunPolicy& policy, std::optional<WallTime> start,
                            WallTime now) {
  DeadlineCheck check;
  if (!policy.active_deadline_seconds || !start) return check;
  const auto limit = std::chrono::seconds(*policy.active_deadline_seconds);
  const auto end = *start + limit;
  if (now >= end) {
    check.exceeded = true;
    check.message = "the job ran longer than activeDeadlineSeconds (" +
                    std::to_string(*policy.active_deadline_seconds) + "s)";
    return check;
  }
  check.remaining = std::chrono::duration_cast<Clock::Duration>(end - now);
  return check;
}

}  // namespace spawnpoint::op
