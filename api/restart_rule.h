// The restart rule both binaries apply to a failed gang, from the job's restartPolicy: which
// exit codes may be retried, how long to wait before restart n, and whether the gang runs
// again. The operator applies it cluster-wide (operator/policy/restart_policy.h); the agent
// when it owns the whole gang (agent/run/attempt_decision.h). Pure functions; thread-safe.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "api/field_reader.h"
#include "api/training_job.h"
#include "common/clock.h"

namespace spawnpoint::api {

// The longest wait before a restart, however many restarts came before.
inline constexpr std::chrono::seconds kMaxRestartBackoff{300};

// The causes a failure is reported with (status.lastFailure.reason) and restartPolicy.retryOn
// accepts: the agent's, from the exit and the rank's last lines (agent/supervisor/exit_cause.h),
// and the operator's for pods taken away (always retryable).
inline constexpr std::string_view kFailureCauses[] = {
    // The agent's.
    "UserError", "OOMKilled", "ShmExhausted", "Killed", "Terminated", "Crashed", "Stalled",
    "GpuOutOfMemory", "CollectiveTimeout", "CollectiveError", "LoaderWorkerKilled", "ImportError",
    "PortInUse",
    // The agents of a gang that gave up (NodeLost is the operator's too).
    "GangStartTimeout",
    // The operator's.
    "Evicted", "Preempted", "NodeLost"};

// spec.restartPolicy's fields, and restartPolicy.mode's values indexed by RestartMode.
inline constexpr std::string_view kRestartFields[] = {
    "mode",    "maxRestarts", "backoffSeconds", "resetAfterSeconds", "retryableExitCodes",
    "retryOn", "standby"};
inline constexpr std::string_view kRestartModeNames[] = {"InPlace", "Recreate"};

// Decodes spec.restartPolicy (absent: the defaults) with `reader`'s located errors.
Status DecodeRestartPolicy(FieldReader& reader, const Field& field, RestartPolicy* policy);

// A shell exit code (128+signal for signals) is retryable if listed in retryableExitCodes,
// or, with none listed, if it is 128-255 (signals, OOM kills, preemption).
bool IsRetryableExitCode(const RestartPolicy& policy, int shell_code);

// A failure with this shell exit code and cause (a kFailureCauses name, or "" if unknown) is
// retryable if its code is in retryableExitCodes or retryOn, or its cause in retryOn; with
// neither given, by the default rule (128-255).
bool IsRetryableFailure(const RestartPolicy& policy, int shell_code, std::string_view cause);

// The restart schedule. The first failure of a long run is usually a preemption, a lost
// node or a killed rank, where waiting helps nobody; a crash loop is where waiting matters.
// So a gang restarts at once after a failure that follows a healthy run, and backs off only
// while attempts keep failing quickly, as the kubelet treats a crash loop:
//   - an attempt that ran at least resetAfterSeconds before it failed was healthy: the
//     failure is the first of a new run of quick failures (1);
//   - one that failed sooner is one more quick failure in a row (the job's first attempt
//     starts the count at 0, so its failure is the first too);
//   - the wait after the n-th quick failure in a row: none for n <= 1, then backoffSeconds,
//     doubling (n = 2: backoffSeconds, n = 3: twice that, ...), capped at kMaxRestartBackoff.
// maxRestarts still counts every restart. Both binaries apply it: the agent for the gangs it
// owns, the operator for gangs of pods (it keeps the count in status.lastFailure).

// The quick failures in a row once an attempt that ran for `ran` has failed, given the count
// before it (`quick_before`, 0 for the job's first attempt).
int QuickFailuresAfter(const RestartPolicy& policy, int quick_before, Clock::Duration ran);

// The wait before the restart that follows the `quick`-th quick failure in a row.
Clock::Duration RestartBackoff(const RestartPolicy& policy, int quick);

// How a restart's wait reads in logs and conditions: "now" for none, else "in 40s: 3rd quick
// failure in a row (attempts under 600s)".
std::string RestartWhen(const RestartPolicy& policy, int quick);

// Whether a failed gang runs again, or why not: retryability first, then the budget.
enum class RestartVerdict { kRestart, kNotRetryable, kMaxRestartsReached };
RestartVerdict JudgeRestart(const RestartPolicy& policy, int restarts_done, bool retryable);

// JudgeRestart for a failure known by its shell exit code alone.
bool ShouldRestart(const RestartPolicy& policy, int restarts_done, int shell_code);

}  // namespace spawnpoint::api
