// The restart rule both binaries apply to a failed gang, from the job's restartPolicy: which
// exit codes may be retried, how long to wait before restart n, and whether the gang runs
// again. The operator applies it cluster-wide (operator/policy/restart_policy.h); the agent
// when it owns the whole gang (agent/run/attempt_decision.h). Pure functions; thread-safe.
#pragma once

#include <chrono>

#include "api/training_job.h"
#include "common/clock.h"

namespace spawnpoint::api {

// The longest wait before a restart, however many restarts came before.
inline constexpr std::chrono::seconds kMaxRestartBackoff{300};

// A shell exit code (128+signal for signals) is retryable if listed in retryableExitCodes,
// or, with none listed, if it is 128-255 (signals, OOM kills, preemption).
bool IsRetryableExitCode(const RestartPolicy& policy, int shell_code);

// The wait before restart `restart` (1 for the first): backoffSeconds doubled each restart,
// capped at kMaxRestartBackoff; zero for restart < 1 or backoffSeconds <= 0.
Clock::Duration RestartBackoff(const RestartPolicy& policy, int restart);

// Whether a failed gang runs again, or why not: retryability first, then the budget.
enum class RestartVerdict { kRestart, kNotRetryable, kMaxRestartsReached };
RestartVerdict JudgeRestart(const RestartPolicy& policy, int restarts_done, bool retryable);

// JudgeRestart for a failure known by its shell exit code alone.
bool ShouldRestart(const RestartPolicy& policy, int restarts_done, int shell_code);

}  // namespace spawnpoint::api
