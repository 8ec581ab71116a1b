// What the agent learns before it starts anything: the job (from a file or an environment
// variable), this node's GPUs and CPUs, whether the trainer can be its own loader worker;
// and the plan request built from them. Nothing here starts a process. Thread-safe apart
// from what the GPU backend says of itself.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "agent/cli/options.h"
#include "agent/devices/gpu_backend.h"
#include "agent/devices/topology.h"
#include "agent/plan/node_plan.h"
#include "api/training_job.h"
#include "common/status.h"

namespace spawnpoint::agent {

// The job the options name (-f FILE or --job-env VAR, and --job NAME); InvalidArgument
// for anything wrong with it, a Python script that is not there included (CheckScript,
// agent/run/preflight.h). A bare `torchrun` in its command gets the interpreter of
// torchrun's shebang line when torchrun is readable here (api/torchrun_command.h).
StatusOr<api::TrainingJob> LoadJob(const AgentOptions& o);

// The GPU backend the job needs: "none" for a CPU-only job (NVML is not even loaded), else
// the one --gpu-backend selects.
StatusOr<std::unique_ptr<devices::GpuBackend>> OpenGpuBackend(const AgentOptions& o,
                                                              const api::TrainingJob& job);

struct NodeFacts {
  api::TrainingJob job;
  std::string gpu_backend;  // the backend's Describe()
  std::vector<devices::GpuDevice> gpus;
  devices::CpuTopology cpus;
  bool trainer_embeds_loader = false;
  std::shared_ptr<devices::GpuBackend> backend;  // kept open: the metrics sample the GPUs
};

// Discovers the node through `backend` and the options' sysfs root.
StatusOr<NodeFacts> DiscoverNode(const AgentOptions& o, api::TrainingJob job,
                                 std::shared_ptr<devices::GpuBackend> backend);

// The nodes of the job: --nnodes, else spec.nodes.
int NodeCount(const AgentOptions& o, const api::TrainingJob& job);
// --master-port, else spec.rendezvous.port; 0 picks a free port now.
StatusOr<int> RendezvousPort(const AgentOptions& o, const api::TrainingJob& job);
// A TCP port free on loopback now (another process may take it before it is used).
StatusOr<int> FreePort();
// 127.0.0.0/8, ::1 or localhost: a rendezvous nothing outside this machine can reach.
bool IsLoopbackAddress(const std::string& addr);
// --master-addr, else 127.0.0.1.
std::string MasterAddress(const AgentOptions& o);

PlanRequest MakeRequest(const AgentOptions& o, const NodeFacts& n, int node_rank, int restart_count,
                        int master_port, const std::string& pool_root = "");

// The command must be runnable before anything starts: a typo fails now, not per rank.
Status CheckCommand(const RankPlan& rank);

// When every node runs on this machine, each node agent gets its own share of the CPUs
// (as its affinity), so the nodes' ranks do not oversubscribe the cores between them.
std::vector<std::vector<int>> SplitCpusAcrossNodes(const std::vector<int>& cpus, int nnodes);

}  // namespace spawnpoint::agent
