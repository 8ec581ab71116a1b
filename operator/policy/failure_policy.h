// Why a node pod failed, and whether that cause may restart the gang. The sources, in
// order of trust: the agent's JSON termination message in the trainer container's
// terminated state (rank, exit code, signal, cause); else the container's own exit code and
// reason (OOMKilled, Error, StartError); pod-level causes (eviction, preemption, node loss)
// are infrastructure failures and always retryable. When the agent's message says whether
// the failure is retryable ("retryable": a rank it stopped for a stall, reason Stalled, under
// stallPolicy.action Restart or Fail), that wins; otherwise a failure is retryable by its
// exit code or cause (restartPolicy.retryableExitCodes and retryOn when given, else 128-255:
// signals, OOM kills). The agent's account of the rank's own words (the quoted line, the
// last lines, the peers it explains) is carried into status.lastFailure.
// Pure functions; thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
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
  // The rank's own words, from the agent: the line its cause was read from, that line's
  // Python exception type, its last lines (at most kMaxLogTailBytes) and from which stream.
  std::string line;
  std::string exception;
  std::string log_tail;
  std::string log_stream;
  std::string failed_at;  // when the agent saw the rank fail (RFC 3339, ms), "" if unknown
  // Failures of the same attempt that this one explains (a peer's collective error): the
  // other pods' and the ones the agent reported, as {node, pod, rank, exitCode, reason, line}.
  nlohmann::json consequences = nlohmann::json::array();

  nlohmann::json ToJson() const;
  // "node 1 (pod x-node-1) rank 3 exited 137 (OOMKilled): message"
  std::string Describe() const;
};

// status.lastFailure.stack keeps at most this much of the agent's stack (its first lines:
// the top frames).
inline constexpr size_t kMaxFailureStackBytes = 4096;
// status.lastFailure.logTail keeps at most this much of the rank's last lines (its end).
inline constexpr size_t kMaxLogTailBytes = 4096;
// A one-line summary (conditions, events) quotes at most this much of the message.
inline constexpr size_t kMaxSummaryMessageBytes = 400;

using api::IsRetryableExitCode;  // the rule the agent applies too (api/restart_rule.h)

// `pod` is in phase Failed; `trainer` is the name of the container that runs the agent.
PodFailure ClassifyPodFailure(const nlohmann::json& pod, const std::string& trainer,
                              const api::RestartPolicy& policy);

// restartPolicy.mode InPlace: what an agent of the gang said when it exited because the gang
// gave up (its termination message: the root failure with "nodeRank", "restarts" and
// "verdict": MaxRestartsReached, NonRetryableFailure, NodeLost, ...).
struct GangVerdict {
  std::string verdict;  // why the gang was not restarted
  std::string message;  // the agents' explanation ("verdictMessage")
  int restarts = 0;     // restarts the gang made, job-wide
  int node = 0;         // the node whose rank failed (not necessarily this pod's)
};
// The verdict in the trainer container's termination message of `pod`, when it exited 1 with
// one; nullopt for any other failure (the pod evicted, the agent killed or unable to start).
std::optional<GangVerdict> GangVerdictOf(const nlohmann::json& pod, const std::string& trainer);

// A failure as an agent's /status document states it (its lastFailure: rank, nodeRank,
// exitCode, signal, reason, message, line, exception, logTail, logStream, failedAt or time,
// consequences) for the pod of its node in `job`; retryable, as the gang restarted after it.
PodFailure FailureFromAgent(const nlohmann::json& failure, const std::string& job);

// The failure that ended the attempt when several pods failed (the others usually failed
// because a peer vanished): a collective timeout or error yields to any other cause (it is
// what a dying rank's peers see, often before its own agent sees the death); then the
// earliest, by the agent's failedAt (ms) when it reported one, else by the container's
// finishedAt; on a tie the retryable cause (a kill, an OOM, an eviction); then the lowest
// node. The other pods' failures become its consequences. `failures` must not be empty.
PodFailure FirstFailure(const std::vector<PodFailure>& failures);

}  // namespace spawnpoint::op
