// runPolicy.ttlSecondsAfterFinished: a finished job (Succeeded or Failed) is deleted, with
// its pods and service (garbage-collected through their owner references), that many
// seconds after status.completionTime. Pure; thread-safe.
#pragma once

#include <optional>

#include "api/training_job.h"
#include "common/clock.h"
#include "operator/common/wall_clock.h"

namespace spawnpoint::op {

struct TtlCheck {
  bool expired = false;
  std::optional<Clock::Duration> remaining;  // when a TTL applies and has not passed
};

TtlCheck CheckTtl(const api::RunPolicy& policy, std::optional<WallTime> completion, WallTime now);

}  // namespace spawnpoint::op
