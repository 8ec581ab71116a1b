// The restart policy of a gang, as a pure function of the job's restartPolicy: whether a
// failure may be retried and how long to wait first. The operator applies the same rules
// cluster-wide; the agent applies them when it owns the whole gang (one node, or every
// node run locally). Thread-safe (no state).
#pragma once

#include <chrono>

#include "api/training_job.h"

namespace spawnpoint::agent {

// Backoff before restart number `restart` (1-based): backoffSeconds doubled each restart,
// capped at kMaxBackoff.
inline constexpr std::chrono::seconds kMaxBackoff{300};
std::chrono::milliseconds RestartBackoff(const api::RestartPolicy& policy, int restart);

// A shell exit code (128+signal for signals) is retryable if listed in
// retryableExitCodes, or, with none listed, if it is 128-255.
bool IsRetryableExitCode(const api::RestartPolicy& policy, int shell_code);

// Whether a gang that failed with `shell_code` after `restarts_done` restarts runs again.
bool ShouldRestart(const api::RestartPolicy& policy, int restarts_done, int shell_code);

}  // namespace spawnpoint::agent
