// Why a node pod failed, and whether that cause may restart the gang. The sources, in
// order of trust: the agent's JSON termination message in the trainer container's
// terminated state (rank, exit code, signal, cause); else the container's own exit code and
// reason (OOMKilled, Error, StartError); pod-level causes (eviction, preemption, node loss)
// are infrastructure failures and always retryable. When the agent's message says whether
// the failure is retryable ("retryable": a rank it stopped for a stall, reason Stalled, under
// stallPolicy.action Restart or Fail), that wins; otherwise exit codes are retryable by
// restartPolicy.retryableExitCodes when given, else 128-255 (signals, OOM kills).
// Pure functions; thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/restart_rule.h"
#include "api/training_job.h"

namespace spawnpoint::op {

struct PodFailure {
  int node = -1;      // node rank of the pod
  std::string pod;    // pod name
  int rank = -1;      // global rank that failed, -1 if unknown
  int exit_code = 0;  // shell convention: 128 + N for signal N
  int signal = 0;
  std::string reason;  // OOMKilled, ShmExhausted, Killed, Crashed, Terminated, UserError,
                       // Evicted, Preempted, NodeLost, Error, StartError, ...
  std::string message;
  bool retryable = false;
  std::string finished_at;  // the container's finishedAt (RFC 3339), "" if unknown
  // The agent's "stack" (a stalled rank's stacks), at most kMaxFailureStackBytes; "" if none.
  std::string stack;

  nlohmann::json ToJson() const;
  // "node 1 (pod x-node-1) rank 3 exited 137 (OOMKilled): message"
  std::string Describe() const;
};

// status.lastFailure.stack keeps at most this much of the agent's stack (its first lines:
// the top frames).
inline constexpr size_t kMaxFailureStackBytes = 4096;

using api::IsRetryableExitCode;  // the rule the agent applies too (api/restart_rule.h)

// `pod` is in phase Failed; `trainer` is the name of the container that runs the agent.
PodFailure ClassifyPodFailure(const nlohmann::json& pod, const std::string& trainer,
                              const api::RestartPolicy& policy);

// The failure that ended the attempt when several pods failed (the others usually failed
// because a peer vanished): the earliest finishedAt; on a tie the retryable cause (a kill,
// an OOM, an eviction explains a peer's collective error, not the other way round); then
// the lowest node. `failures` must not be empty.
const PodFailure& FirstFailure(const std::vector<PodFailure>& failures);

}  // namespace spawnpoint::op
