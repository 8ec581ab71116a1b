#include "operator/policy/suspend_policy.h"

namespace spawnpoint::op {

SuspendTransition DecideSuspend(const api::RunPolicy& policy, bool was_suspended) {
  if (policy.suspend) return SuspendTransition::kSuspend;
  return was_suspended ? SuspendTransition::kResume : SuspendTransition::kNone;
}

}  // namespace spawnpoint::op
