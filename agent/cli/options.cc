#include "agent/cli/options.h"

#include "common/flags.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <type_traits>

#include "metrics/server.h"

namespace spawnpoint::agent {
namespace {

StatusOr<std::chrono::milliseconds> ParseSeconds(const std::string& flag,
                                                 const std::string& value) {
  try {
    size_t used = 0;
    double s = std::stod(value, &used);
    if (used == value.size() && s >= 0 && s <= 86400) {
      return std::chrono::milliseconds(std::llround(s * 1000));
    }
  } catch (...) {
  }
  return InvalidArgument(flag + ": expected seconds (a number from 0 to 86400), got \"" + value +
                         "\"");
}

// "2.5" for 2500 ms: exact to the millisecond, as ParseSeconds reads it back.
std::string FormatSeconds(std::chrono::milliseconds ms) {
  char buf[32];
  snprintf(buf, sizeof(buf), "%lld.%03lld", static_cast<long long>(ms.count() / 1000),
           static_cast<long long>(ms.count() % 1000));
  return buf;
}

}  // namespace

std::string AgentUsage() {
  return R"(usage: spawnpoint-agent COMMAND [flags]

Runs a TrainingJob's ranks on this node as spawned (never forked) processes.

commands:
  run  -f FILE    run this node's share of the job (every node's, locally, when the job
                  has several nodes and --node-rank is not given)
  plan -f FILE    print, as JSON, what run would start: argv, environment, devices and
                  CPU set per rank; starts nothing
  version         print the version

flags:
  -f, --file FILE            the TrainingJob manifest (YAML or JSON)
  --job-env VAR              read the manifest from environment variable VAR instead
                             of a file (what the operator gives its pods)
  --job NAME                 which TrainingJob, when FILE has several
  --node-rank R              this node's rank (0..nodes-1)
  --nnodes N                 number of nodes (default: spec.nodes)
  --master-addr A            rendezvous address (default 127.0.0.1)
  --master-port P            rendezvous port (default spec.rendezvous.port; 0 picks a free one)
  --grace-period SECONDS     SIGTERM to SIGKILL grace for stopping ranks (default 30)
  --status-interval SECONDS  how often the status line is printed (default 10)
  --status-file PATH         also write the status, with every rank's loader statistics,
                             as JSON to PATH at each status interval and at the end
  --termination-log PATH     where the failure is written for Kubernetes
                             (default /dev/termination-log, written only if it exists)
  --max-restarts N           override spec.restartPolicy.maxRestarts
  --restart-count N          attempts already made (sets TORCHELASTIC_RESTART_COUNT)
  --gpu-backend KIND         auto | nvml | amd | none (default auto)
  --nvml-library PATH        the NVML library to load (default libnvidia-ml.so.1)
  --sysfs-root DIR           sysfs to read GPUs and NUMA topology from (default /sys)
  --shm-path DIR             the shared-memory mount to check (default /dev/shm)
  --cgroup-memory-events F   cgroup v2 memory.events, to recognise OOM kills
  --metrics-addr HOST:PORT   serve /metrics, /status, /healthz and /readyz there
                             (default :9400; "off" or "" serves nothing)
  --dcgm-compatible-names    also export GPU metrics under DCGM exporter's names
  --full-env                 plan: include the inherited environment
  -h, --help                 this text
)";
}

StatusOr<AgentOptions> ParseAgentArgs(const std::vector<std::string>& args) {
  AgentOptions o;
  if (args.empty()) return InvalidArgument("missing command (run, plan, version); see --help");
  const std::string& cmd = args[0];
  if (cmd == "run") {
    o.command = AgentCommand::kRun;
  } else if (cmd == "plan") {
    o.command = AgentCommand::kPlan;
  } else if (cmd == "help" || cmd == "-h" || cmd == "--help") {
    o.command = AgentCommand::kHelp;
    return o;
  } else if (cmd == "version" || cmd == "--version") {
    o.command = AgentCommand::kVersion;
    return o;
  } else {
    return InvalidArgument("unknown command \"" + cmd + "\"; allowed: run, plan, version, help");
  }

  using Setter = std::function<Status(const std::string&, const std::string&)>;
  auto str = [](std::string* field) -> Setter {
    return [field](const std::string&, const std::string& v) {
      *field = v;
      return Status::Ok();
    };
  };
  auto integer = [](int* field, long long min, long long max) -> Setter {
    return [=](const std::string& flag, const std::string& v) {
      SP_ASSIGN_OR_RETURN(long long n, ParseIntFlag(flag, v, min, max));
      *field = static_cast<int>(n);
      return Status::Ok();
    };
  };
  auto seconds = [](std::chrono::milliseconds* field) -> Setter {
    return [=](const std::string& flag, const std::string& v) {
      SP_ASSIGN_OR_RETURN(*field, ParseSeconds(flag, v));
      return Status::Ok();
    };
  };
  const std::map<std::string, Setter> valued = {
      {"--file", str(&o.file)},
      {"-f", str(&o.file)},
      {"--job", str(&o.job_name)},
      {"--job-env", str(&o.job_env)},
      {"--node-rank", integer(&o.node_rank, 0, 100000)},
      {"--nnodes", integer(&o.nnodes, 1, 100000)},
      {"--master-addr", str(&o.master_addr)},
      {"--master-port", integer(&o.master_port, 0, 65535)},
      {"--restart-count", integer(&o.restart_count, 0, 1000000)},
      {"--max-restarts", integer(&o.max_restarts, 0, 1000000)},
      {"--grace-period", seconds(&o.grace_period)},
      {"--status-interval", seconds(&o.status_interval)},
      {"--status-file", str(&o.status_file)},
      {"--termination-log",
       [&](const std::string&, const std::string& v) {
         o.termination_log = v;
         o.termination_log_explicit = true;
         return Status::Ok();
       }},
      {"--gpu-backend",
       [&](const std::string& flag, const std::string& v) {
         if (v != "auto" && v != "nvml" && v != "amd" && v != "none") {
           return InvalidArgument(flag + ": expected auto, nvml, amd or none, got \"" + v + "\"");
         }
         o.gpu_backend = v;
         return Status::Ok();
       }},
      {"--nvml-library", str(&o.nvml_library)},
      {"--sysfs-root", str(&o.sysfs_root)},
      {"--shm-path", str(&o.shm_path)},
      {"--cgroup-memory-events", str(&o.memory_events)},
      {"--metrics-addr",
       [&](const std::string& flag, const std::string& v) {
         if (v != "off" && !v.empty()) {
           SP_RETURN_IF_ERROR(metrics::ParseListenAddress(v).status().WithPrefix(flag));
         }
         o.metrics_addr = v;
         return Status::Ok();
       }},
  };

  for (size_t i = 1; i < args.size(); ++i) {
    const FlagArg arg = SplitFlag(args[i]);
    const std::string& flag = arg.name;
    if (flag == "-h" || flag == "--help") {
      o.command = AgentCommand::kHelp;
      return o;
    }
    if (flag == "--full-env") {
      o.full_env = true;
      continue;
    }
    if (flag == "--dcgm-compatible-names") {
      o.dcgm_compatible_names = true;
      continue;
    }
    auto it = valued.find(flag);
    if (it == valued.end()) {
      return InvalidArgument("unknown flag \"" + flag + "\" for " + cmd + "; see --help");
    }
    SP_ASSIGN_OR_RETURN(std::string value, FlagValue(arg, args, &i));
    SP_RETURN_IF_ERROR(it->second(flag, value));
  }
  if (o.file.empty() && o.job_env.empty()) {
    return InvalidArgument(cmd + ": -f FILE is required (or --job-env VAR)");
  }
  if (!o.file.empty() && !o.job_env.empty()) {
    return InvalidArgument(cmd + ": give either -f FILE or --job-env VAR, not both");
  }
  if (o.nnodes > 0 && o.node_rank >= o.nnodes) {
    return InvalidArgument("--node-rank " + std::to_string(o.node_rank) +
                           " must be below --nnodes " + std::to_string(o.nnodes));
  }
  return o;
}

std::vector<std::string> ToArgs(const AgentOptions& o) {
  switch (o.command) {
    case AgentCommand::kHelp:
      return {"help"};
    case AgentCommand::kVersion:
      return {"version"};
    case AgentCommand::kRun:
    case AgentCommand::kPlan:
      break;
  }
  const AgentOptions d;
  std::vector<std::string> args = {o.command == AgentCommand::kRun ? "run" : "plan"};
  auto add = [&](const char* flag, const auto& value, const auto& default_value) {
    if (value == default_value) return;
    args.push_back(flag);
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>, std::string>) {
      args.push_back(value);
    } else if constexpr (std::is_same_v<std::decay_t<decltype(value)>, int>) {
      args.push_back(std::to_string(value));
    } else {
      args.push_back(FormatSeconds(value));
    }
  };
  add("--file", o.file, d.file);
  add("--job-env", o.job_env, d.job_env);
  add("--job", o.job_name, d.job_name);
  add("--node-rank", o.node_rank, d.node_rank);
  add("--nnodes", o.nnodes, d.nnodes);
  add("--master-addr", o.master_addr, d.master_addr);
  add("--master-port", o.master_port, d.master_port);
  add("--restart-count", o.restart_count, d.restart_count);
  add("--max-restarts", o.max_restarts, d.max_restarts);
  add("--grace-period", o.grace_period, d.grace_period);
  add("--status-interval", o.status_interval, d.status_interval);
  add("--status-file", o.status_file, d.status_file);
  if (o.termination_log_explicit) {
    args.insert(args.end(), {"--termination-log", o.termination_log});
  }
  add("--gpu-backend", o.gpu_backend, d.gpu_backend);
  add("--nvml-library", o.nvml_library, d.nvml_library);
  add("--sysfs-root", o.sysfs_root, d.sysfs_root);
  add("--shm-path", o.shm_path, d.shm_path);
  add("--cgroup-memory-events", o.memory_events, d.memory_events);
  add("--metrics-addr", o.metrics_addr, d.metrics_addr);
  if (o.full_env) args.push_back("--full-env");
  if (o.dcgm_compatible_names) args.push_back("--dcgm-compatible-names");
  return args;
}

}  // namespace spawnpoint::agent
