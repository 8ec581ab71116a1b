#include "agent/run/attempt_decision.h"

#include "agent/run/exit_codes.h"
#include "api/restart_rule.h"

namespace spawnpoint::agent {

const char* AgentPhaseName(AgentPhase phase) {
  switch (phase) {
    case AgentPhase::kRunning:
      return "Running";
    case AgentPhase::kRestarting:
      return "Restarting";
    case AgentPhase::kSucceeded:
      return "Succeeded";
    case AgentPhase::kFailed:
      return "Failed";
    case AgentPhase::kTerminated:
      return "Terminated";
  }
  return "Unknown";
}

AttemptDecision Decide(const GangResult& result, int restarts, const api::RestartPolicy& policy,
                       bool owns_gang, int quick) {
  AttemptDecision d;
  if (result.outcome == GangOutcome::kSucceeded) {
    d.exit_code = kExitSucceeded;
    d.reason = "Succeeded";
    return d;
  }
  if (result.outcome == GangOutcome::kInterrupted || !result.failure) {
    d.phase = AgentPhase::kTerminated;
    d.reason = "Terminated";
    d.message = "stopped by " + SignalName(result.interrupt_signal);
    d.exit_code = result.ExitCode();  // 128 + the signal that stopped the agent
    return d;
  }
  // The rank's own code goes to the termination log; the agent's says "the job failed".
  d.exit_code = kExitJobFailed;
  d.failure = result.failure;
  const int code = d.failure->status.ShellCode();
  d.phase = AgentPhase::kFailed;
  if (!owns_gang) {
    d.reason = "GangSpansNodes";
    d.message = "the gang spans several nodes: the operator restarts it";
    return d;
  }
  const std::string cause = ExitReasonName(d.failure->cause.reason);
  const bool retryable =
      d.failure->retryable.value_or(api::IsRetryableFailure(policy, code, cause));
  switch (api::JudgeRestart(policy, restarts, retryable)) {
    case api::RestartVerdict::kNotRetryable:
      d.reason = "NonRetryableFailure";
      d.message = d.failure->retryable ? "stallPolicy.action is Fail"
                                       : "exit code " + std::to_string(code) + " is not retryable";
      if (!d.failure->retryable && !policy.retry_on_causes.empty()) {
        d.message += ", nor " + cause + " in restartPolicy.retryOn";
      }
      return d;
    case api::RestartVerdict::kMaxRestartsReached:
      d.reason = "MaxRestartsReached";
      d.message = "maxRestarts (" + std::to_string(policy.max_restarts) + ") reached";
      return d;
    case api::RestartVerdict::kRestart:
      break;
  }
  d.phase = AgentPhase::kRestarting;
  d.restart = true;
  d.reason = ExitReasonName(d.failure->cause.reason);
  d.backoff =
      std::chrono::duration_cast<std::chrono::milliseconds>(api::RestartBackoff(policy, quick));
  d.message = api::RestartWhen(policy, quick);
  return d;
}

}  // namespace spawnpoint::agent
