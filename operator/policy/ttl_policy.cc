#include "operator/policy/ttl_policy.h"

namespace spawnpoint::op {

TtlCheck CheckTtl(const api::RunPolicy& policy, std::optional<WallTime> completion, WallTime now) {
  TtlCheck check;
  if (!policy.ttl_seconds_after_finished || !completion) return check;
  const auto expiry = *completion + std::chrono::seconds(*policy.ttl_seconds_after_finished);
  if (now >= expiry) {
    check.expired = true;
    return check;
  }
  check.remaining = std::chrono::duration_cast<Clock::Duration>(expiry - now);
  return check;
}

}  // namespace spawnpoint::op
