// What a failed attempt leads to: a gang restart, now or after a backoff, or the end of the
// job. status.restarts counts restarts already made and never exceeds maxRestarts. The wait
// follows the schedule of api/restart_rule.h: none after a failure that follows a healthy
// run, backoffSeconds doubling while attempts keep failing within resetAfterSeconds. The
// count of quick failures and the failure's time are kept in status.lastFailure, so the
// wait survives an operator restart. Pure functions; thread-safe.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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

// `restarts` is status.restarts before this failure; `quick` the quick failures in a row,
// this one included (api::QuickFailuresAfter).
RestartDecision DecideRestart(const PodFailure& failure, const api::RestartPolicy& policy,
                              int restarts, int quick);

// How long until the next gang may be created after the `quick`-th quick failure in a row,
// seen at `failed_at`; zero when it may be created now.
Clock::Duration RestartWaitRemaining(const api::RestartPolicy& policy, int quick,
                                     std::optional<WallTime> failed_at, WallTime now);

// How long the attempt of these pods ran when it was seen failed at `now`: from the earliest
// creationTimestamp among them; zero when none has one.
Clock::Duration AttemptRan(const std::vector<const nlohmann::json*>& pods, WallTime now);

}  // namespace spawnpoint::op
