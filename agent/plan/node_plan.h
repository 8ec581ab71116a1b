// The node plan: what `spawnpoint-agent run` will start on one node of a TrainingJob,
// computed without starting anything (so `spawnpoint-agent plan` prints exactly what
// `run` does). Per rank: argv, environment (torchrun's names, device and loader
// variables), visible GPUs and CPU set. Pure function of its inputs; thread-safe.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/devices/assignment.h"
#include "agent/devices/gpu_backend.h"
#include "agent/devices/topology.h"
#include "api/training_job.h"
#include "common/status.h"

namespace spawnpoint::agent {

struct PlanRequest {
  const api::TrainingJob* job = nullptr;
  int node_rank = 0;
  int nnodes = 0;  // 0: the job's spec.nodes
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: the job's spec.rendezvous.port
  int restart_count = 0;
  int max_restarts = -1;  // what TORCHELASTIC_MAX_RESTARTS says; -1: the job's
  std::map<std::string, std::string> base_env;  // the agent's own environment
  std::vector<devices::GpuDevice> gpus;
  std::string gpu_backend = "none";
  devices::CpuTopology cpus;
  // The directory holding the Python start-up shim (sitecustomize.py); prepended to
  // PYTHONPATH when the trainer is a Python interpreter. Empty: no shim, and so no agent
  // pool of Python loader workers.
  std::string python_shim_dir;
  // Where per-rank loader pool directories go (<pool_root>/rank-<r>); empty: no pools.
  std::string pool_root;
  // Whether the trainer's program contains the loader's worker entry point, so it can be
  // started as its own loader worker (workerCommand empty).
  bool trainer_embeds_loader = false;
};

// The loader worker pool the agent runs for one rank (persistent across rank restarts).
struct PoolPlan {
  int workers = 0;  // processes spawned
  // Python pools: a DataLoader asking for more workers grows the pool up to this many
  // (at least `workers`): max(8, CPUs of the node).
  int max_workers = 0;
  bool auto_workers = false;  // the rank's Loader picks how many to use (the knee); C++ only
  std::vector<std::string> argv;
  std::vector<std::string> env;  // the rank's, without its identity (it must never rendezvous)
  std::string dir;
  // Python loader workers (python -m spawnpoint_rank.worker with the rank's interpreter),
  // which the rank reaches through the agent's per-rank service at service_socket.
  bool python = false;
  std::string service_socket;  // empty unless python
};

// Whether argv starts a Python interpreter (python, python3, python3.11, /usr/bin/python3).
bool IsPythonCommand(const std::vector<std::string>& argv);

// The script a Python command runs ("python -u -W ignore train.py --lr 1" -> "train.py"), as
// the interpreter's own option parsing finds it; "" for -c, -m, stdin or no script.
std::string PythonScriptOf(const std::vector<std::string>& argv);
// Where in `argv` that script is; nullopt when PythonScriptOf says "".
std::optional<size_t> PythonScriptIndex(const std::vector<std::string>& argv);

struct RankPlan {
  int rank = 0;
  int local_rank = 0;
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;   // the complete environment of the rank
  std::vector<std::string> spawnpoint_env;  // names the agent set (for the plan output)
  std::string working_dir;
  devices::RankDevices devices;
  std::optional<PoolPlan> pool;
  std::string pool_skipped;  // why a job asking for loader workers gets no agent pool

  std::vector<std::string> EnvList() const;  // "NAME=value"
};

struct NodePlan {
  std::string job_name;
  std::string job_namespace;
  int node_rank = 0;
  int nnodes = 1;
  int ranks_per_node = 1;
  int world_size = 1;
  std::string master_addr;
  int master_port = 0;
  std::string backend;
  std::string gpu_backend;
  int restart_count = 0;
  // The trainer's command started torchrun: the ranks run what it would (the job's
  // spec.trainer.torchrun); shown as "rewrittenFrom" in the plan.
  std::optional<api::TorchrunLaunch> torchrun;
  std::vector<RankPlan> ranks;
};

StatusOr<NodePlan> MakeNodePlan(const PlanRequest& request);

// The plan as JSON; `full_env` includes inherited variables, otherwise only the ones the
// agent and the manifest set.
nlohmann::json NodePlanToJson(const NodePlan& plan, bool full_env);

// The process environment as a map.
std::map<std::string, std::string> CurrentEnvironment();

}  // namespace spawnpoint::agent
