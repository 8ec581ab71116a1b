// What a failed attempt leads to: a gang restart after a backoff, or the end of the job.
// status.restarts counts restarts already made and never exceeds maxRestarts; the backoff
// before restart n (n >= 1) is backoffSeconds x 2^(n-1), capped at 300 s, measured from when
// the failure was seen (status.lastFailure.time), so it survives an operator restart.
// Pure functions; thread-safe.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "api/restart_rule.h"
#include "api/training_job.h"
#include "common/clock.h"
#include "operator/common/wall_clock.h"
#include "operator/policy/failure_policy.h"

namespace spawnpoint::op {

// The backoff rule is the agent's too (api/restart_rule.h).
using api::kMaxRestartBackoff;
using api::RestartBackoff;

struct RestartDecision {
  bool restart = false;
  // For a restart: the Restarting condition's reason and message. Otherwise the Failed
  // condition's: NonRetryableFailure or MaxRestartsReached.
  std::string reason;
  std::string message;
};

// `restarts` is status.restarts before this failure.
RestartDecision DecideRestart(const PodFailure& failure, const api::RestartPolicy& policy,
                              int restarts);

// How long until the gang of restart `restart` may be created after a failure seen at
// `failed_at`; zero when it may be created now.
Clock::Duration RestartWaitRemaining(const api::RestartPolicy& policy, int restart,
                                     std::optional<WallTime> failed_at, WallTime now);

}  // namespace spawnpoint::op
