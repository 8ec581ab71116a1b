// What one attempt of a gang leads to: the job succeeded, the agent was stopped, the gang
// restarts after a backoff, or the job failed and why it is not restarted. Decide() is the
// agent's half of the restart rule both binaries share (api/restart_rule.h); NodeAgent
// reports what it returns. Pure functions; thread-safe.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "agent/supervisor/exit_cause.h"
#include "agent/supervisor/gang.h"
#include "api/training_job.h"

namespace spawnpoint::agent {

// The phases of the status file, the endpoint and the console, as they spell them.
enum class AgentPhase { kRunning, kRestarting, kSucceeded, kFailed, kTerminated };
const char* AgentPhaseName(AgentPhase phase);  // "Running", "Restarting", ...

struct AttemptDecision {
  AgentPhase phase = AgentPhase::kSucceeded;  // never kRunning from Decide()
  bool restart = false;                       // phase == kRestarting
  // Succeeded, Terminated, the failure's reason for a restart (OOMKilled, ...), or why
  // not: NonRetryableFailure, MaxRestartsReached, GangSpansNodes.
  std::string reason;
  // One line: "stopped by SIGTERM"; for a failure not restarted, why ("exit code 1 is
  // not retryable"); for a restart, when ("now", "in 20s: 3rd quick failure in a row
  // (attempts under 600s)"); empty otherwise.
  std::string message;
  // The agent's, when it does not restart (agent/run/exit_codes.h): 0, 1 for a failure
  // (the rank's own code is in `failure`), 128 + N when a signal stopped the agent.
  int exit_code = 0;
  std::chrono::milliseconds backoff{0};  // restart: the wait before the next attempt
  std::optional<RankFailure> failure;    // the failing member, for a restart or a failure
};

// `restarts`: restarts this agent already made (the budget it spends); `owns_gang`: false
// when the gang spans nodes this agent does not run, so the operator decides restarts;
// `quick`: the quick failures in a row, this attempt's included (api::QuickFailuresAfter),
// which set the wait before a restart (api/restart_rule.h) and its message ("now", "in
// 20s: 3rd quick failure in a row ...").
AttemptDecision Decide(const GangResult& result, int restarts, const api::RestartPolicy& policy,
                       bool owns_gang, int quick);

}  // namespace spawnpoint::agent
