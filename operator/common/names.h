// The names, labels and annotations the operator gives a TrainingJob's children, so that
// every part (reconciler, informers, tests) agrees on them. Pure; thread-safe.
#pragma once

#include <string>

namespace spawnpoint::op {

inline constexpr const char* kJobNameLabel = "spawnpoint.dev/job-name";
inline constexpr const char* kNodeRankLabel = "spawnpoint.dev/node-rank";
// The attempt a pod belongs to: status.restarts when it was created (with restartPolicy.mode
// InPlace the pods keep it across in-place restarts).
inline constexpr const char* kAttemptLabel = "spawnpoint.dev/attempt";

// On a TrainingJob: the trainer image already has the agent at this path (no init container).
inline constexpr const char* kAgentPathAnnotation = "spawnpoint.dev/agent-path";
// On a TrainingJob: the rendezvous address instead of <job>-node-0.<job> (e.g. 127.0.0.1 where
// pod DNS names do not resolve).
inline constexpr const char* kMasterAddrAnnotation = "spawnpoint.dev/master-addr";

inline constexpr const char* kTrainingJobKind = "TrainingJob";
inline constexpr const char* kComponent = "spawnpoint-operator";

// The environment variable holding the job (JSON) in every pod; the agent reads it with
// --job-env.
inline constexpr const char* kJobEnv = "SPAWNPOINT_JOB";

// "<job>-node-<i>": deterministic, so a repeated or interrupted reconcile never makes two.
inline std::string PodName(const std::string& job, int node) {
  return job + "-node-" + std::to_string(node);
}
// The headless Service is named after the job (pod DNS: <job>-node-<i>.<job>).
inline std::string ServiceName(const std::string& job) { return job; }
// The default rendezvous address: node 0's stable DNS name through the headless Service.
inline std::string DefaultMasterAddr(const std::string& job) {
  return PodName(job, 0) + "." + ServiceName(job);
}

// The job's Secret: the token of its gang channel (restartPolicy.mode InPlace) and its
// agents' status token (common/status_token.h). "<job>-tokens-<the first 8 characters of the
// job's UID>", so a Secret left by an earlier job of the same name (not yet garbage-collected)
// is never taken for this one's.
inline std::string JobSecretName(const std::string& job, const std::string& job_uid) {
  return job + "-tokens-" + job_uid.substr(0, 8);
}

}  // namespace spawnpoint::op
