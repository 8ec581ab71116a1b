#include "agent/plan/node_plan.h"

#include <unistd.h>

#include <algorithm>

#include "agent/loader/contract.h"

extern char** environ;

namespace spawnpoint::agent {
namespace {

std::string Bool(bool b) { return b ? "1" : "0"; }

// What a loader worker must not inherit from its rank: with these it could join the
// process group or the rendezvous store.
bool IsRankIdentity(const std::string& name) {
  static const char* kNames[] = {
      "RANK",        "LOCAL_RANK", "WORLD_SIZE",      "LOCAL_WORLD_SIZE", "GROUP_RANK",
      "NODE_RANK",   "ROLE_RANK",  "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "MASTER_ADDR",
      "MASTER_PORT", "NNODES"};
  for (const char* n : kNames) {
    if (name == n) return true;
  }
  return name.rfind("TORCHELASTIC_", 0) == 0;
}

std::string JoinComma(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ",") + item;
  return out;
}

// The agent-owned pool of one rank, or nullopt with the reason in `skipped`.
std::optional<PoolPlan> PlanPool(const PlanRequest& request,
                                 const std::vector<std::string>& command, const RankPlan& rank,
                                 std::string* skipped) {
  const api::LoaderSpec& loader = request.job->spec.loader;
  if (loader.workers_per_rank == 0 || request.pool_root.empty()) return std::nullopt;
  // A Python trainer without a workerCommand: Python loader workers, which its
  // DataLoaders reach through the agent's per-rank service.
  const bool python = loader.worker_command.empty() && IsPythonCommand(command);
  if (python) {
    if (!loader.python_pool) {
      *skipped =
          "loader.pythonPool is false: the DataLoader spawns its own workers (through the shim)";
      return std::nullopt;
    }
    if (request.python_shim_dir.empty()) {
      *skipped = "no Python shim shipped with this agent";
      return std::nullopt;
    }
  } else if (loader.worker_command.empty() && !request.trainer_embeds_loader) {
    *skipped =
        "the trainer program has no spawnpoint loader worker entry point "
        "(spawnpoint::loader::RunWorkerIfRequested); set loader.workerCommand, or "
        "loader.workersPerRank: 0";
    return std::nullopt;
  }
  PoolPlan pool;
  pool.python = python;
  const int cpus = static_cast<int>(std::max<size_t>(1, rank.devices.cpus.size()));
  // Under auto a Python pool has min(8, CPUs) workers, as the shim resolves "auto", and
  // the DataLoader uses them all: no knee to pick.
  pool.auto_workers = !loader.workers_per_rank.has_value() && !python;
  pool.workers = loader.workers_per_rank ? *loader.workers_per_rank : std::min(8, cpus);
  // PyTorch starts exactly the workers a DataLoader asks for, and which worker builds a
  // batch decides its random draws: a Python pool grows to what the code asks, within the
  // node's CPUs (at least 8 per rank, as torch would fork them anyway).
  pool.max_workers =
      python ? std::max({pool.workers, 8, static_cast<int>(request.cpus.AllCpus().size())}) : 0;
  if (python) {
    pool.argv = {command[0], "-m", "spawnpoint_rank.worker"};
  } else {
    pool.argv = loader.worker_command.empty() ? command : loader.worker_command;
  }
  pool.dir = request.pool_root + "/rank-" + std::to_string(rank.rank);
  for (const auto& [k, v] : rank.env) {
    // A Python worker sees its rank's identity, as torch's own workers inherit it (a dataset
    // may shard by RANK); not the restart count, which its rank's restarts outlive. A C++
    // worker is the trainer's program in worker mode: no identity, so it never takes
    // itself for a rank.
    if (k == "OMP_NUM_THREADS" || k == "TORCHELASTIC_RESTART_COUNT") continue;
    if (IsRankIdentity(k) && !python) continue;
    // A Python worker behaves as stock torch (a DataLoader built inside a dataset is
    // stock); PYTHONPATH still holds the shim's directory, for spawnpoint_rank. Its
    // SPAWNPOINT_LOADER_PRELOAD and _MAIN are the job's, set below.
    if (python && (k == "SPAWNPOINT_SHIM" || k == "SPAWNPOINT_LOADER_PRELOAD" ||
                   k == "SPAWNPOINT_LOADER_MAIN")) {
      continue;
    }
    pool.env.push_back(k + "=" + v);
  }
  // A worker is one of many processes on the rank's CPUs: one thread each.
  pool.env.push_back("OMP_NUM_THREADS=1");
  if (python) {
    pool.env.push_back("SPAWNPOINT_LOADER_PRELOAD=" + JoinComma(loader.preload_modules));
    // For the "__main__" entry: the script whose leading imports the workers preload (the
    // workers start in the agent's directory, the rank in its working directory).
    std::string script = PythonScriptOf(command);
    if (!script.empty() && script[0] != '/' && !rank.working_dir.empty()) {
      script = rank.working_dir + "/" + script;
    }
    if (!script.empty()) pool.env.push_back("SPAWNPOINT_LOADER_MAIN=" + script);
    pool.service_socket = loader::ServiceSocketPath(pool.dir);
  }
  return pool;
}

// The modules a Python pool's workers import first, as their environment says.
std::vector<std::string> PreloadOf(const PoolPlan& pool) {
  static const std::string kPrefix = "SPAWNPOINT_LOADER_PRELOAD=";
  std::vector<std::string> modules;
  for (const auto& kv : pool.env) {
    if (kv.rfind(kPrefix, 0) != 0) continue;
    size_t start = kPrefix.size();
    while (start < kv.size()) {
      size_t comma = std::min(kv.find(',', start), kv.size());
      modules.push_back(kv.substr(start, comma - start));
      start = comma + 1;
    }
  }
  return modules;
}

}  // namespace

bool IsPythonCommand(const std::vector<std::string>& argv) {
  if (argv.empty()) return false;
  std::string base = argv[0].substr(argv[0].rfind('/') + 1);
  if (base.rfind("python", 0) != 0) return false;
  // python, python3, python3.11, pythonw; not "python-config" or "pythonista".
  return base.find_first_not_of("0123456789.", 6) == std::string::npos || base == "pythonw";
}

std::string PythonScriptOf(const std::vector<std::string>& argv) {
  const std::optional<size_t> i = PythonScriptIndex(argv);
  return i ? argv[*i] : "";
}

std::optional<size_t> PythonScriptIndex(const std::vector<std::string>& argv) {
  if (!IsPythonCommand(argv)) return std::nullopt;
  for (size_t i = 1; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "--") {
      if (i + 1 < argv.size() && argv[i + 1] != "-") return i + 1;
      return std::nullopt;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      if (arg == "-") return std::nullopt;
      return i;
    }
    // --check-hash-based-pycs MODE takes a value; --help and the like run nothing.
    if (arg[1] == '-') {
      if (arg == "--check-hash-based-pycs") {
        ++i;
        continue;
      }
      return std::nullopt;
    }
    // A cluster of one-letter options ("-uB"); -c and -m end the options and run no script,
    // -W and -X take the rest of the cluster or the next argument as their value.
    for (size_t j = 1; j < arg.size(); ++j) {
      const char c = arg[j];
      if (c == 'c' || c == 'm') return std::nullopt;
      if (c == 'W' || c == 'X') {
        if (j + 1 == arg.size()) ++i;
        break;
      }
      if (c == 'h' || c == 'V' || c == '?') return std::nullopt;
    }
  }
  return std::nullopt;
}

std::vector<std::string> RankPlan::EnvList() const {
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

std::map<std::string, std::string> CurrentEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

StatusOr<NodePlan> MakeNodePlan(const PlanRequest& request) {
  const api::TrainingJob& job = *request.job;
  const api::TrainingJobSpec& spec = job.spec;
  NodePlan plan;
  plan.job_name = job.name;
  plan.job_namespace = job.namespace_;
  plan.nnodes = request.nnodes > 0 ? request.nnodes : spec.nodes;
  plan.node_rank = request.node_rank;
  if (plan.node_rank < 0 || plan.node_rank >= plan.nnodes) {
    return InvalidArgument("--node-rank " + std::to_string(plan.node_rank) +
                           " is out of range: the job has " + std::to_string(plan.nnodes) +
                           " nodes (0.." + std::to_string(plan.nnodes - 1) + ")");
  }
  plan.ranks_per_node = api::RanksPerNode(spec);
  plan.world_size = plan.ranks_per_node * plan.nnodes;
  plan.master_addr = request.master_addr;
  plan.master_port = request.master_port > 0 ? request.master_port : spec.rendezvous_port;
  plan.backend = api::BackendName(api::EffectiveBackend(spec));
  plan.gpu_backend = request.gpu_backend;
  plan.restart_count = request.restart_count;
  plan.torchrun = spec.trainer.torchrun;

  SP_ASSIGN_OR_RETURN(
      std::vector<devices::RankDevices> assigned,
      devices::AssignRanks(request.gpus, request.cpus, plan.ranks_per_node, spec.gpus_per_node,
                           spec.gpu_assignment, request.gpu_backend));

  std::vector<std::string> command = spec.trainer.command;
  command.insert(command.end(), spec.trainer.args.begin(), spec.trainer.args.end());
  if (command.empty()) {
    return InvalidArgument(job.source + ": the trainer container has no command or args");
  }

  const int max_restarts =
      request.max_restarts >= 0 ? request.max_restarts : spec.restart_policy.max_restarts;
  for (int local = 0; local < plan.ranks_per_node; ++local) {
    RankPlan r;
    r.local_rank = local;
    r.rank = plan.node_rank * plan.ranks_per_node + local;
    // torch.distributed.launch without --use_env gives each rank --local_rank=N.
    const auto& torchrun = spec.trainer.torchrun;
    r.argv = torchrun && torchrun->local_rank_arg ? torchrun->RankArgv(local) : command;
    r.working_dir = spec.trainer.working_dir;
    r.devices = assigned[local];

    std::map<std::string, std::string> own;  // what the manifest and the agent set
    for (const auto& e : spec.trainer.env) own[e.name] = e.value;
    const bool user_omp = own.count("OMP_NUM_THREADS") || request.base_env.count("OMP_NUM_THREADS");

    std::map<std::string, std::string> set = {
        {"RANK", std::to_string(r.rank)},
        {"LOCAL_RANK", std::to_string(local)},
        {"WORLD_SIZE", std::to_string(plan.world_size)},
        {"LOCAL_WORLD_SIZE", std::to_string(plan.ranks_per_node)},
        {"GROUP_RANK", std::to_string(plan.node_rank)},
        {"NODE_RANK", std::to_string(plan.node_rank)},
        {"GROUP_WORLD_SIZE", std::to_string(plan.nnodes)},
        {"ROLE_RANK", std::to_string(r.rank)},
        {"ROLE_WORLD_SIZE", std::to_string(plan.world_size)},
        {"ROLE_NAME", "default"},
        {"NNODES", std::to_string(plan.nnodes)},
        {"MASTER_ADDR", plan.master_addr},
        {"MASTER_PORT", std::to_string(plan.master_port)},
        {"TORCHELASTIC_RESTART_COUNT", std::to_string(plan.restart_count)},
        {"TORCHELASTIC_MAX_RESTARTS", std::to_string(max_restarts)},
        {"TORCHELASTIC_RUN_ID", job.namespace_ + "/" + job.name},
        {"SPAWNPOINT_JOB_NAME", job.name},
        {"SPAWNPOINT_JOB_NAMESPACE", job.namespace_},
        {"SPAWNPOINT_BACKEND", plan.backend},
        {"SPAWNPOINT_LOADER_WORKERS",
         spec.loader.workers_per_rank ? std::to_string(*spec.loader.workers_per_rank) : "auto"},
        {"SPAWNPOINT_LOADER_PREFETCH_FACTOR", std::to_string(spec.loader.prefetch_factor)},
        {"SPAWNPOINT_LOADER_PERSISTENT_WORKERS", Bool(spec.loader.persistent_workers)},
        {"SPAWNPOINT_LOADER_PIN_MEMORY", Bool(spec.loader.pin_memory)},
        {"SPAWNPOINT_LOADER_TIMEOUT_SECONDS", std::to_string(spec.loader.timeout_seconds)},
        {"SPAWNPOINT_LOADER_SEED", std::to_string(spec.loader.seed)},
        {"SPAWNPOINT_LOADER_START_METHOD", spec.loader.start_method},
        {"SPAWNPOINT_LOADER_CPUS", std::to_string(r.devices.cpus.size())},
    };
    if (!user_omp)
      set["OMP_NUM_THREADS"] = std::to_string(std::max<size_t>(1, r.devices.cpus.size()));
    for (const auto& [k, v] : devices::DeviceEnvironment(r.devices)) set[k] = v;
    if (!request.python_shim_dir.empty() && IsPythonCommand(command)) {
      // The shim makes DataLoader workers spawned and persistent; it chains to any
      // PYTHONPATH the manifest or the environment already had.
      std::string existing = own.count("PYTHONPATH") ? own.at("PYTHONPATH")
                             : request.base_env.count("PYTHONPATH")
                                 ? request.base_env.at("PYTHONPATH")
                                 : "";
      set["PYTHONPATH"] = request.python_shim_dir + (existing.empty() ? "" : ":" + existing);
      set["SPAWNPOINT_SHIM"] = "1";
    }

    r.env = request.base_env;
    for (const auto& [k, v] : own) r.env[k] = v;
    for (const auto& [k, v] : set) {
      r.env[k] = v;
      own[k] = v;
    }
    r.pool = PlanPool(request, command, r, &r.pool_skipped);
    if (r.pool) {
      r.env["SPAWNPOINT_LOADER_POOL_DIR"] = own["SPAWNPOINT_LOADER_POOL_DIR"] = r.pool->dir;
      if (r.pool->python) {
        // SPAWNPOINT_LOADER_WORKERS stays as the job says: the shim resolves "auto" itself.
        r.env["SPAWNPOINT_LOADER_SERVICE"] = own["SPAWNPOINT_LOADER_SERVICE"] =
            r.pool->service_socket;
      } else {
        r.env["SPAWNPOINT_LOADER_WORKERS"] = own["SPAWNPOINT_LOADER_WORKERS"] =
            std::to_string(r.pool->workers);
      }
      if (r.pool->auto_workers) {
        r.env["SPAWNPOINT_LOADER_AUTO_WORKERS"] = own["SPAWNPOINT_LOADER_AUTO_WORKERS"] = "1";
      }
    }
    for (const auto& [k, v] : own) r.spawnpoint_env.push_back(k);
    plan.ranks.push_back(std::move(r));
  }
  return plan;
}

nlohmann::json NodePlanToJson(const NodePlan& plan, bool full_env) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : plan.ranks) {
    nlohmann::json env = nlohmann::json::object();
    if (full_env) {
      for (const auto& [k, v] : r.env) env[k] = v;
    } else {
      for (const auto& k : r.spawnpoint_env) env[k] = r.env.at(k);
    }
    nlohmann::json gpus = nlohmann::json::array();
    for (const auto& g : r.devices.visible) {
      gpus.push_back(
          {{"index", g.index},
           {"uuid", g.uuid},
           {"pciBusId", g.pci_bus_id},
           {"name", g.name},
           {"vendor", g.vendor},
           {"numaNode", g.numa_node},
           // 0: NVML gave no total (an error it answered); unknown, not "no memory".
           {"memoryTotalBytes", g.memory_total_bytes > 0 ? nlohmann::json(g.memory_total_bytes)
                                                         : nlohmann::json(nullptr)}});
    }
    nlohmann::json rank = {{"rank", r.rank},
                           {"localRank", r.local_rank},
                           {"argv", r.argv},
                           {"env", env},
                           {"devices", gpus},
                           {"cpus", r.devices.cpus},
                           {"numaNode", r.devices.numa_node}};
    if (!r.devices.visible.empty()) rank["deviceOrdinal"] = r.devices.device_ordinal;
    if (!r.working_dir.empty()) rank["workingDir"] = r.working_dir;
    if (r.pool) {
      rank["loaderPool"] = {{"workers", r.pool->workers},
                            {"auto", r.pool->auto_workers},
                            {"argv", r.pool->argv},
                            {"dir", r.pool->dir}};
      if (r.pool->python) {
        rank["loaderPool"]["python"] = true;
        rank["loaderPool"]["maxWorkers"] = r.pool->max_workers;
        rank["loaderPool"]["service"] = r.pool->service_socket;
        rank["loaderPool"]["preload"] = PreloadOf(*r.pool);
      }
    } else if (!r.pool_skipped.empty()) {
      rank["loaderPool"] = {{"skipped", r.pool_skipped}};
    }
    ranks.push_back(rank);
  }
  nlohmann::json out = {{"job", plan.job_name},
                        {"namespace", plan.job_namespace},
                        {"nodeRank", plan.node_rank},
                        {"nnodes", plan.nnodes},
                        {"ranksPerNode", plan.ranks_per_node},
                        {"worldSize", plan.world_size},
                        {"masterAddr", plan.master_addr},
                        {"masterPort", plan.master_port},
                        {"backend", plan.backend},
                        {"gpuBackend", plan.gpu_backend},
                        {"restartCount", plan.restart_count},
                        {"ranks", ranks}};
  if (plan.torchrun) {
    nlohmann::json flags = nlohmann::json::array();
    for (const auto& f : plan.torchrun->flags) {
      flags.push_back({{"flag", f.written}, {"effect", f.effect}});
    }
    out["rewrittenFrom"] = {{"launcher", plan.torchrun->launcher},
                            {"command", plan.torchrun->original},
                            {"flags", flags},
                            {"summary", plan.torchrun->Summary(plan.ranks_per_node)}};
  }
  return out;
}

}  // namespace spawnpoint::agent
