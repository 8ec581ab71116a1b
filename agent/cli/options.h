// Command-line options of spawnpoint-agent, and the way back: ParseAgentArgs reads them,
// ToArgs writes them (how the local multi-node mode starts its node agents), and
// ParseAgentArgs(ToArgs(o)) == o for every o ParseAgentArgs returns. Pure functions;
// thread-safe. Parse errors are one line naming the flag and what is allowed (exit 2).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "common/status.h"

namespace spawnpoint::agent {

enum class AgentCommand { kRun, kPlan, kHelp, kVersion };

struct AgentOptions {
  AgentCommand command = AgentCommand::kHelp;
  std::string file;
  // --job-env VAR: the manifest is the value of environment variable VAR instead of a file
  // (how the operator hands a pod its job).
  std::string job_env;
  std::string job_name;  // --job: which TrainingJob of a multi-document file
  int node_rank = -1;    // -1: not given
  int nnodes = 0;        // 0: the job's
  std::string master_addr;
  int master_port = -1;  // -1: the job's rendezvous.port; 0: pick a free port
  int restart_count = 0;
  int max_restarts = -1;  // -1: the job's
  std::chrono::milliseconds grace_period{30'000};
  std::chrono::milliseconds status_interval{10'000};
  std::string status_file;  // JSON status rewritten every status interval; empty: none
  std::string termination_log = "/dev/termination-log";
  bool termination_log_explicit = false;
  std::string gpu_backend = "auto";
  std::string nvml_library;
  std::string sysfs_root = "/sys";
  std::string shm_path = "/dev/shm";
  std::string memory_events = "/sys/fs/cgroup/memory.events";
  bool full_env = false;  // plan: print the inherited environment too
  // /metrics, /status, /healthz, /readyz (agent/status/agent_endpoint.h); "" or "off": none.
  // Loopback by default: a local `run` is nobody else's business. The operator gives a pod's
  // agent its address explicitly (the pod network's port, read by the operator).
  std::string metrics_addr = "127.0.0.1:9400";
  bool dcgm_compatible_names = false;  // also export DCGM exporter's GPU metric names
  // --gang HOST:PORT: the in-place gang of a job spanning several agents (agent/gang/);
  // "": none (the operator recreates the gang, or this agent runs every node).
  std::string gang_addr;
  std::string gang_token_file;  // the job's token (Secret), required with --gang
  // --gang: how long an agent waits for every node at the gang's barrier, for a lost
  // coordinator to come back and for the coordinator's verdict, before it gives up
  // (GangStartTimeout, NodeLost).
  std::chrono::milliseconds gang_join_timeout{120'000};
  // The job's status token (Secret): /status serves log lines to readers that send it, and
  // on loopback (agent/status/status_access.h). "": loopback only.
  std::string status_token_file;
  // `torchrun`: the job is a torchrun command line instead of a manifest (run, or plan with
  // --plan): torchrun's flags, the script and its arguments, as given after the agent's own
  // flags (api/torchrun_job.h). Empty for run and plan.
  std::vector<std::string> torchrun;
  std::vector<std::string> spec_sets;  // torchrun: --spec KEY=VALUE, in order

  bool operator==(const AgentOptions&) const = default;
};

StatusOr<AgentOptions> ParseAgentArgs(const std::vector<std::string>& args);
std::string AgentUsage();

// Whether `arg` ("--status-file", "--metrics-addr=:9400") is one of the agent's own flags that
// `torchrun` takes before torchrun's flags.
bool IsTorchrunAgentFlag(const std::string& arg);

// The arguments (command first, without the program) that ParseAgentArgs turns back into
// `o`: the command and every flag whose value differs from the default.
std::vector<std::string> ToArgs(const AgentOptions& o);

}  // namespace spawnpoint::agent
