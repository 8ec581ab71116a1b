// The desired children of a TrainingJob, computed from the job alone (pure functions, so
// they are deterministic and unit-tested without a cluster):
//  - a headless Service <job> (clusterIP None, publishNotReadyAddresses, the rendezvous
//    port) that gives every pod the DNS name <job>-node-<i>.<job> before it is ready;
//  - pod <job>-node-<i> of an attempt: the template's pod with hostname/subdomain, labels
//    (job-name, node-rank, attempt), a controller ownerReference, restartPolicy Never (the
//    operator owns restarts), the GPU limit, a memory emptyDir at /dev/shm of shmSize, the
//    rendezvous environment, and the trainer container's command replaced by the agent
//    (`spawnpoint-agent run --job-env SPAWNPOINT_JOB --node-rank i ...`), which runs the
//    trainer's own command and args for each rank. With restartPolicy.mode InPlace and more
//    than one node (RestartsInPlace) the agents form a gang that restarts in place: they get
//    `--gang <node 0's address>:<gang port> --gang-token-file <mount>/token --max-restarts
//    <maxRestarts> --restart-count <attempt>`, the gang port is a container port and the
//    job's gang Secret is mounted read-only; otherwise `--max-restarts 0` (the operator
//    recreates the gang). The agent comes from an init container
//    that copies it out of the agent image into a shared emptyDir, or is used in place when
//    the trainer image has it (PodSettings::agent_path or the job's
//    spawnpoint.dev/agent-path annotation).
//  - the gang Secret (JobSecretName) of an in-place job: its token, owned by the job.
// Pure functions (but NewGangToken, which reads /dev/urandom); thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "api/training_job.h"
#include "common/status.h"

namespace spawnpoint::op {

struct PodSettings {
  // The image the init container copies the agent from; it holds agent_image_dir.
  std::string agent_image = "ghcr.io/spawnpoint/agent:latest";
  // What the agent image holds: bin/spawnpoint-agent and share/spawnpoint/python (the shim).
  std::string agent_image_dir = "/opt/spawnpoint";
  // Non-empty: the trainer image already has the agent at this path; no init container.
  std::string agent_path;
  // Non-empty: MASTER_ADDR for every job instead of <job>-node-0.<job> (a job's
  // spawnpoint.dev/master-addr annotation wins over both).
  std::string master_addr;
  // The agent's status endpoint (GET /status), declared as a container port.
  int status_port = 9400;
  // Where node 0's agent listens for the gang channel (restartPolicy.mode InPlace), declared
  // as a container port; 0: GangPort(job's rendezvous port).
  int gang_port = 0;
  // The job's Secret holds a status token (kStatusTokenKey): mounted, and the agent is told
  // where (--status-token-file).
  bool status_token = false;
};

// A job's gang port when the operator does not pin one: next to its rendezvous port (the one
// below for 65535), so that jobs whose pods share a network (hostNetwork, a local node) and
// hold different rendezvous ports do not meet on one gang port either.
inline int GangPort(int rendezvous_port) {
  return rendezvous_port < 65535 ? rendezvous_port + 1 : rendezvous_port - 1;
}

inline constexpr const char* kShmVolume = "spawnpoint-shm";
inline constexpr const char* kAgentVolume = "spawnpoint-agent";
inline constexpr const char* kAgentMountPath = "/spawnpoint";
inline constexpr const char* kAgentInstallContainer = "spawnpoint-agent-install";
// The job's Secret (JobSecretName), mounted read-only in the trainer container: the gang
// token (in place) and the status token, one file each.
inline constexpr const char* kTokensVolume = "spawnpoint-tokens";
inline constexpr const char* kTokensMountPath = "/var/run/spawnpoint/tokens";
inline constexpr const char* kGangTokenKey = "gang";
inline constexpr const char* kStatusTokenKey = "status";

// The controller reference to `owner` (a TrainingJob object with metadata.uid).
nlohmann::json ControllerReference(const nlohmann::json& owner);

// The name of the container that runs the ranks (the spec's trainer).
std::string TrainerContainerName(const api::TrainingJob& job);
std::string MasterAddr(const api::TrainingJob& job, const PodSettings& settings);
std::string AgentPath(const api::TrainingJob& job, const PodSettings& settings);

// The job's agents restart their gang in place: restartPolicy.mode InPlace and nodes > 1.
bool RestartsInPlace(const api::TrainingJob& job);

// The job as the agent reads it (spec with defaults; metadata name and namespace only).
nlohmann::json JobForAgent(const api::TrainingJob& job);

nlohmann::json BuildService(const api::TrainingJob& job, const nlohmann::json& owner);
// The job's Secret (owned by `owner`): `gang_token` under kGangTokenKey and `status_token`
// under kStatusTokenKey, each only when not empty.
nlohmann::json BuildJobSecret(const api::TrainingJob& job, const nlohmann::json& owner,
                              const std::string& gang_token, const std::string& status_token);
// 32 random bytes from /dev/urandom, hex-encoded (common/random.h).
StatusOr<std::string> NewGangToken();

nlohmann::json BuildPod(const api::TrainingJob& job, const nlohmann::json& owner, int node,
                        int attempt, const PodSettings& settings);

}  // namespace spawnpoint::op
