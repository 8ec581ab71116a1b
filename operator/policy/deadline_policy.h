// runPolicy.activeDeadlineSeconds: a job that has run that long since status.startTime
// (reset when it is suspended) fails with reason DeadlineExceeded and its running pods are
// stopped. Pure; thread-safe.
#pragma once

#include <optional>
#include <string>

#include "api/training_job.h"
#include "common/clock.h"
#include "operator/common/wall_clock.h"

namespace spawnpoint::op {

struct DeadlineCheck {
  bool exceeded = false;
  std::optional<Clock::Duration> remaining;  // when not exceeded and a deadline applies
  std::string message;                       // when exceeded
};

DeadlineCheck CheckDeadline(const api::RunPolicy& policy, std::optional<WallTime> start,
                            WallTime now);

}  // namespace spawnpoint::op
