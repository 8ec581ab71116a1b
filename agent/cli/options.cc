#include "agent/cli/options.h"

#include "common/flags.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iterator>
#include <map>

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

// The flags that set one field from their value, shared by ParseAgentArgs and ToArgs so
// the two cannot drift apart. Flags with rules of their own (-f, --termination-log,
// --gpu-backend, --metrics-addr) are handled beside the tables in both.
struct StringFlag {
  const char* name;
  std::string AgentOptions::*field;
};
struct IntFlag {
  const char* name;
  int AgentOptions::*field;
  long long min, max;
};
struct SecondsFlag {
  const char* name;
  std::chrono::milliseconds AgentOptions::*field;
};
constexpr StringFlag kStringFlags[] = {
    {"--file", &AgentOptions::file},
    {"--job-env", &AgentOptions::job_env},
    {"--job", &AgentOptions::job_name},
    {"--master-addr", &AgentOptions::master_addr},
    {"--status-file", &AgentOptions::status_file},
    {"--nvml-library", &AgentOptions::nvml_library},
    {"--sysfs-root", &AgentOptions::sysfs_root},
    {"--shm-path", &AgentOptions::shm_path},
    {"--cgroup-memory-events", &AgentOptions::memory_events},
    {"--gang", &AgentOptions::gang_addr},
    {"--gang-token-file", &AgentOptions::gang_token_file},
    {"--status-token-file", &AgentOptions::status_token_file},
};
constexpr IntFlag kIntFlags[] = {
    {"--node-rank", &AgentOptions::node_rank, 0, 100000},
    {"--nnodes", &AgentOptions::nnodes, 1, 100000},
    {"--master-port", &AgentOptions::master_port, 0, 65535},
    {"--restart-count", &AgentOptions::restart_count, 0, 1000000},
    {"--max-restarts", &AgentOptions::max_restarts, 0, 1000000},
};
constexpr SecondsFlag kSecondsFlags[] = {
    {"--grace-period", &AgentOptions::grace_period},
    {"--status-interval", &AgentOptions::status_interval},
    {"--gang-join-timeout", &AgentOptions::gang_join_timeout},
};

// In `torchrun`, the agent's flags that torchrun has too (its dashed spellings) are
// torchrun's, and the flags that name a manifest have no place.
constexpr std::string_view kTorchrunOwnedFlags[] = {"--nnodes", "--node-rank", "--master-addr",
                                                    "--master-port", "--max-restarts"};
constexpr std::string_view kManifestFlags[] = {"-f", "--file", "--job-env"};
// The agent's flags that take no value; --termination-log, --gpu-backend and --metrics-addr
// are valued ones with rules of their own.
constexpr std::string_view kSwitches[] = {"--full-env", "--dcgm-compatible-names"};
constexpr std::string_view kSpecialValued[] = {"--termination-log", "--gpu-backend",
                                               "--metrics-addr"};

template <typename List>
bool In(const List& list, std::string_view name) {
  return std::find(std::begin(list), std::end(list), name) != std::end(list);
}

bool IsAgentFlag(std::string_view name) {
  for (const StringFlag& f : kStringFlags) {
    if (name == f.name) return true;
  }
  for (const IntFlag& f : kIntFlags) {
    if (name == f.name) return true;
  }
  for (const SecondsFlag& f : kSecondsFlags) {
    if (name == f.name) return true;
  }
  return name == "-f" || In(kSwitches, name) || In(kSpecialValued, name);
}

}  // namespace

bool IsTorchrunAgentFlag(const std::string& arg) {
  const std::string name = SplitFlag(arg).name;
  if (name == "--plan" || name == "--spec") return true;
  return IsAgentFlag(name) && !In(kTorchrunOwnedFlags, name) && !In(kManifestFlags, name);
}

std::string AgentUsage() {
  return R"(usage: spawnpoint-agent COMMAND [flags]

Runs a TrainingJob's ranks on this node as spawned (never forked) processes.

commands:
  run  -f FILE    run this node's share of the job (every node's, locally, when the job
                  has several nodes and --node-rank is not given)
  plan -f FILE    print, as JSON, what run would start: argv, the program it execs
                  (resolved on PATH), environment, devices and CPU set per rank; warns
                  when a Python rank's interpreter cannot import torch; starts no rank
  torchrun [FLAGS] [TORCHRUN FLAGS] SCRIPT [ARGS]
                  run a torchrun command line as its job, no manifest: the one-word change
                  from `torchrun ...` (docs/torchrun.md). The agent's own flags come first;
                  --nnodes, --node-rank, --master-addr, --master-port and --max-restarts
                  are torchrun's there. Ranks run $PYTHON_EXEC, else the interpreter on
                  the first line of `torchrun` on PATH, else python3. Also:
                    --plan               print run's plan (as plan does) instead of running
                    --job NAME           the job's name (default: the script's)
                    --spec KEY=VALUE     a spec field (docs/trainingjob.md), repeatable:
                                         --spec loader.workersPerRank=2
  version         print the version

flags:
  -f, --file FILE            the TrainingJob manifest (YAML or JSON); `run FILE` works too
  --job-env VAR              read the manifest from environment variable VAR instead
                             of a file (what the operator gives its pods)
  --job NAME                 which TrainingJob, when FILE has several
  --node-rank R              this node's rank (0..nodes-1)
  --nnodes N                 number of nodes (default: spec.nodes)
  --master-addr A            rendezvous address (default 127.0.0.1)
  --master-port P            rendezvous port (default spec.rendezvous.port; 0 picks a free one)
  --grace-period SECONDS     SIGTERM to SIGKILL grace for stopping ranks (default 30)
  --status-interval SECONDS  how often the status line is printed (default 10)
  --status-file PATH         also write the status document to PATH: byte for byte what
                             /status serves (fields: docs/status.md), replaced atomically
                             whenever it changes and at the end with the final phase
  --termination-log PATH     where the failure is written for Kubernetes
                             (default /dev/termination-log, written only if it exists)
  --max-restarts N           override spec.restartPolicy.maxRestarts
  --restart-count N          attempts already made (sets TORCHELASTIC_RESTART_COUNT)
  --gang HOST:PORT           restart the gang of a job spanning several agents in place:
                             node 0's agent coordinates on PORT (listening on every
                             interface), the others reach it at HOST:PORT; the job's
                             maxRestarts is its whole budget (docs/trainingjob.md)
  --gang-token-file PATH     the job's gang token (needed with --gang): connections to the
                             coordinator without it are refused
  --gang-join-timeout SECONDS
                             with --gang: how long to wait for every node at the gang's
                             barrier (then GangStartTimeout), for a lost coordinator to
                             come back and for its verdict (then NodeLost); default 120
  --status-token-file PATH   the job's status token: /status serves log lines, tracebacks
                             and stacks only to readers that send "Authorization: Bearer
                             TOKEN" (the operator) or connect from loopback; others get
                             the rest of the document (docs/status.md)
  --gpu-backend KIND         auto | nvml | amd | none (default auto)
  --nvml-library PATH        the NVML library to load (default libnvidia-ml.so.1)
  --sysfs-root DIR           sysfs to read GPUs and NUMA topology from (default /sys)
  --shm-path DIR             the shared-memory mount to check (default /dev/shm)
  --cgroup-memory-events F   cgroup v2 memory.events, to recognise OOM kills
  --metrics-addr HOST:PORT   serve /metrics, /status, /healthz and /readyz there
                             (default 127.0.0.1:9400, this machine only; :9400 for
                             every interface; "off" or "" serves nothing)
  --dcgm-compatible-names    also export GPU metrics under DCGM exporter's names
  --full-env                 plan: include the inherited environment
  -h, --help                 this text

exit codes:
  0      the job succeeded
  1      the job failed: a rank failed and was not restarted (the rank's own exit code,
         signal and cause are in the termination log and on the last line); or this
         machine cannot run it (no GPU, an unhealthy GPU, /dev/shm too small, the
         rendezvous port in use); nothing started
  2      bad input: flags, the manifest or its file, the trainer command or its script;
         nothing started
  128+N  the agent itself was stopped by signal N (SIGTERM: 143, SIGINT: 130)
)";
}

StatusOr<AgentOptions> ParseAgentArgs(const std::vector<std::string>& args) {
  AgentOptions o;
  if (args.empty()) {
    return InvalidArgument("missing command (run, plan, torchrun, version); see --help");
  }
  const std::string& cmd = args[0];
  const bool torchrun = cmd == "torchrun";
  if (cmd == "run" || torchrun) {
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
    return InvalidArgument("unknown command \"" + cmd +
                           "\"; allowed: run, plan, torchrun, version, help");
  }

  using Setter = std::function<Status(const std::string&, const std::string&)>;
  std::map<std::string, Setter> valued;
  for (const StringFlag& f : kStringFlags) {
    valued[f.name] = [&o, f](const std::string&, const std::string& v) {
      o.*f.field = v;
      return Status::Ok();
    };
  }
  for (const IntFlag& f : kIntFlags) {
    valued[f.name] = [&o, f](const std::string& flag, const std::string& v) {
      SP_ASSIGN_OR_RETURN(long long n, ParseIntFlag(flag, v, f.min, f.max));
      o.*f.field = static_cast<int>(n);
      return Status::Ok();
    };
  }
  for (const SecondsFlag& f : kSecondsFlags) {
    valued[f.name] = [&o, f](const std::string& flag, const std::string& v) {
      SP_ASSIGN_OR_RETURN(o.*f.field, ParseSeconds(flag, v));
      return Status::Ok();
    };
  }
  valued["-f"] = valued["--file"];
  valued["--termination-log"] = [&](const std::string&, const std::string& v) {
    o.termination_log = v;
    o.termination_log_explicit = true;
    return Status::Ok();
  };
  valued["--gpu-backend"] = [&](const std::string& flag, const std::string& v) {
    if (v != "auto" && v != "nvml" && v != "amd" && v != "none") {
      return InvalidArgument(flag + ": expected auto, nvml, amd or none, got \"" + v + "\"");
    }
    o.gpu_backend = v;
    return Status::Ok();
  };
  valued["--metrics-addr"] = [&](const std::string& flag, const std::string& v) {
    if (v != "off" && !v.empty()) {
      SP_RETURN_IF_ERROR(metrics::ParseListenAddress(v).status().WithPrefix(flag));
    }
    o.metrics_addr = v;
    return Status::Ok();
  };

  if (torchrun) {
    valued["--spec"] = [&](const std::string&, const std::string& v) {
      o.spec_sets.push_back(v);
      return Status::Ok();
    };
  }

  for (size_t i = 1; i < args.size(); ++i) {
    const FlagArg arg = SplitFlag(args[i]);
    const std::string& flag = arg.name;
    if (torchrun && flag != "-h" && flag != "--help") {
      if (flag == "--plan") {
        o.command = AgentCommand::kPlan;
        continue;
      }
      if (In(kManifestFlags, flag)) {
        return InvalidArgument(flag +
                               ": torchrun makes the job from torchrun's flags, without a "
                               "manifest; `run -f FILE` runs a manifest");
      }
      if (!IsTorchrunAgentFlag(flag)) {  // torchrun's flags (or the script) from here on
        o.torchrun.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
        break;
      }
    }
    if (!torchrun && flag == "--spec") {
      return InvalidArgument(
          "--spec is for torchrun (spawnpoint-agent torchrun --spec KEY=VALUE ...); a "
          "manifest sets its fields under spec:");
    }
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
    if (it == valued.end() && !flag.empty() && flag[0] != '-') {
      // `run job.yaml`: the manifest given as it is everywhere else, without -f.
      if (!o.file.empty()) {
        return InvalidArgument("two manifests for " + cmd + ": \"" + o.file + "\" and \"" + flag +
                               "\"; give one (one file may hold several documents)");
      }
      o.file = args[i];
      continue;
    }
    if (it == valued.end()) {
      return InvalidArgument("unknown flag \"" + flag + "\" for " + cmd + "; see --help");
    }
    SP_ASSIGN_OR_RETURN(std::string value, FlagValue(arg, args, &i));
    SP_RETURN_IF_ERROR(it->second(flag, value));
  }
  if (torchrun) {
    if (o.torchrun.empty()) {
      return InvalidArgument(
          "torchrun: expected torchrun's flags and the script after the agent's flags, e.g. "
          "spawnpoint-agent torchrun --nproc_per_node 2 train.py");
    }
    if (!o.gang_addr.empty() && o.gang_token_file.empty()) {
      return InvalidArgument(
          "--gang needs --gang-token-file: the gang channel takes only the agents of the job");
    }
    return o;
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
  if (!o.gang_addr.empty()) {
    const size_t colon = o.gang_addr.rfind(':');
    const std::string port = colon == std::string::npos ? "" : o.gang_addr.substr(colon + 1);
    if (colon == 0 || port.empty() || port.find_first_not_of("0123456789") != std::string::npos ||
        std::stoll(port.substr(0, 6)) < 1 || std::stoll(port.substr(0, 6)) > 65535) {
      return InvalidArgument("--gang: expected HOST:PORT (port 1-65535), got \"" + o.gang_addr +
                             "\"");
    }
    if (o.gang_token_file.empty()) {
      return InvalidArgument(
          "--gang needs --gang-token-file: the gang channel takes only the "
          "agents of the job");
    }
    if (o.node_rank < 0) {
      return InvalidArgument("--gang needs --node-rank: which node of the gang this agent runs");
    }
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
  std::vector<std::string> args;
  if (o.torchrun.empty()) {
    args.push_back(o.command == AgentCommand::kRun ? "run" : "plan");
  } else {
    args.push_back("torchrun");
    if (o.command == AgentCommand::kPlan) args.push_back("--plan");
  }
  for (const StringFlag& f : kStringFlags) {
    if (o.*f.field != d.*f.field) args.insert(args.end(), {f.name, o.*f.field});
  }
  for (const IntFlag& f : kIntFlags) {
    if (o.*f.field != d.*f.field) args.insert(args.end(), {f.name, std::to_string(o.*f.field)});
  }
  for (const SecondsFlag& f : kSecondsFlags) {
    if (o.*f.field != d.*f.field) args.insert(args.end(), {f.name, FormatSeconds(o.*f.field)});
  }
  if (o.termination_log_explicit) args.insert(args.end(), {"--termination-log", o.termination_log});
  if (o.gpu_backend != d.gpu_backend) args.insert(args.end(), {"--gpu-backend", o.gpu_backend});
  if (o.metrics_addr != d.metrics_addr) args.insert(args.end(), {"--metrics-addr", o.metrics_addr});
  if (o.full_env) args.push_back("--full-env");
  if (o.dcgm_compatible_names) args.push_back("--dcgm-compatible-names");
  for (const std::string& set : o.spec_sets) args.insert(args.end(), {"--spec", set});
  args.insert(args.end(), o.torchrun.begin(), o.torchrun.end());
  return args;
}

}  // namespace spawnpoint::agent
