#include "api/torchrun_spec.h"

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "api/torchrun_command.h"

namespace spawnpoint::api {
namespace {

using nlohmann::json;

// Who fixed a value: the manifest ("spec.procsPerNode: 8") or a flag taken before
// ("--nnodes=2"); empty while only the default holds it, so a flag may take it.
struct Fixed {
  std::string by;
  bool fixed() const { return !by.empty(); }
};

bool Present(const json& object, std::string_view key) {
  if (!object.is_object()) return false;
  auto it = object.find(std::string(key));
  return it != object.end() && !it->is_null();
}

// The path of the trainer container, as Decoder::DecodeTemplate chose it (it has checked
// that template.spec.containers is a non-empty list).
FieldPath TrainerPath(const json& spec_json, const FieldPath& spec_path) {
  const json& containers = spec_json["template"]["spec"]["containers"];
  size_t index = 0;
  for (size_t i = 0; i < containers.size(); ++i) {
    auto name = containers[i].find("name");
    if (name != containers[i].end() && name->is_string() && *name == "trainer") {
      index = i;
      break;
    }
  }
  return (spec_path / "template" / "spec" / "containers").Index(index);
}

// Checks one flag against the spec and takes it in; sets flag->effect.
class FlagCheck {
 public:
  FlagCheck(const json& spec_json, TrainingJobSpec* spec, std::string who)
      : spec_(spec), who_(std::move(who)) {
    auto at = [&](const char* key, std::string text) {
      return Present(spec_json, key) ? Fixed{std::move(text)} : Fixed{};
    };
    nodes_ = at("nodes", "spec.nodes: " + std::to_string(spec->nodes));
    procs_ = at("procsPerNode", "spec.procsPerNode: " + std::to_string(spec->procs_per_node));
    if (Present(spec_json, "restartPolicy") && Present(spec_json["restartPolicy"], "maxRestarts")) {
      restarts_.by =
          "spec.restartPolicy.maxRestarts: " + std::to_string(spec->restart_policy.max_restarts);
    }
    if (Present(spec_json, "rendezvous") && Present(spec_json["rendezvous"], "port")) {
      port_.by = "spec.rendezvous.port: " + std::to_string(spec->rendezvous_port);
    }
  }

  // An error message for the flag, or "" with flag->effect set.
  std::string Check(TorchrunFlag* flag);

 private:
  std::string Contradicts(const TorchrunFlag& flag, const std::string& what) {
    return who_ + "'s " + flag.written + " contradicts " + what;
  }
  std::string RanksPerNode(TorchrunFlag* flag);
  std::string Nodes(TorchrunFlag* flag);
  // A number the spec holds in *field (fixed by `fixed`): agree, take, or contradict.
  std::string Number(TorchrunFlag* flag, int64_t min, int64_t max, Fixed* fixed, int* field,
                     const std::string& what);

  TrainingJobSpec* const spec_;
  const std::string who_;
  Fixed nodes_, procs_, restarts_, port_;
};

std::string FlagCheck::Check(TorchrunFlag* flag) {
  const std::string& name = flag->name;
  if (flag->value.find("$(") != std::string::npos) {
    flag->effect =
        "ignored: $(VAR) is the kubelet's expansion of the pod's environment; the agent sets "
        "torchrun's variables itself, from the spec";
    return "";
  }
  if (name == "nproc_per_node") return RanksPerNode(flag);
  if (name == "nnodes") return Nodes(flag);
  if (name == "standalone") {
    if (nodes_.fixed() && spec_->nodes != 1) {
      return Contradicts(*flag, nodes_.by + " (--standalone runs one node)");
    }
    spec_->nodes = 1;
    if (!nodes_.fixed()) nodes_.by = flag->written;
    flag->effect = "taken: one node (spec.nodes: 1); the agent runs the rendezvous";
    return "";
  }
  if (name == "max_restarts") {
    return Number(flag, 0, kIntMax, &restarts_, &spec_->restart_policy.max_restarts,
                  "gang restarts (spec.restartPolicy.maxRestarts)");
  }
  if (name == "master_port") {
    return Number(flag, 1, 65535, &port_, &spec_->rendezvous_port,
                  "MASTER_PORT (spec.rendezvous.port)");
  }
  if (name == "start_method") {
    if (flag->value != "spawn" && flag->value != "fork" && flag->value != "forkserver") {
      return who_ + "'s " + flag->written + ": must be spawn, fork or forkserver";
    }
    flag->effect = flag->value == "spawn"
                       ? "agrees: the agent starts every rank as a fresh process"
                       : "ignored: the agent starts every rank as a fresh process (spawn), "
                         "never by fork";
    return "";
  }
  if (name == "module") {
    flag->effect = "taken: each rank runs python -u -m MODULE";
  } else if (name == "no_python") {
    flag->effect = "taken: each rank runs the program itself, without an interpreter";
  } else if (name == "run_path") {
    flag->effect = "taken: each rank runs the script with the interpreter";
  } else if (name == "use_env") {
    flag->effect = "taken: no --local_rank argument; LOCAL_RANK is in the environment";
  } else if (name == "node_rank") {
    flag->effect =
        "ignored: each node's agent has its node rank from the operator (one pod per node), "
        "or --node-rank";
  } else if (name == "master_addr") {
    flag->effect =
        "ignored: MASTER_ADDR is node 0's pod (<job>-node-0.<job>), or --master-addr in a "
        "local run";
  } else if (name.rfind("rdzv_", 0) == 0) {
    flag->effect =
        "ignored: the agents form the gang themselves; the ranks meet at MASTER_ADDR:"
        "MASTER_PORT (node 0, spec.rendezvous.port), TORCHELASTIC_RUN_ID is namespace/name";
  } else if (name == "monitor_interval") {
    flag->effect = "ignored: the agent learns of a rank's exit at once (it waits on its ranks)";
  } else if (name == "role") {
    flag->effect = "ignored: ROLE_NAME is \"default\"";
  } else if (name == "local_addr") {
    flag->effect = "ignored: the node's address is its pod's";
  } else {  // log_dir, redirects, tee, local_ranks_filter, logs_specs
    flag->effect =
        "ignored: every rank's stdout and stderr go to the agent's (the container log), each "
        "line prefixed with its rank";
  }
  return "";
}

std::string FlagCheck::RanksPerNode(TorchrunFlag* flag) {
  const std::string& v = flag->value;
  const int gpus = spec_->gpus_per_node;
  if (v == "gpu" || (v == "auto" && gpus > 0)) {
    if (gpus == 0) {
      return who_ + "'s " + flag->written +
             " asks for one rank per GPU, but spec.gpusPerNode is 0 (CPU ranks); set "
             "spec.gpusPerNode to the GPUs each node has";
    }
    flag->effect = "agrees: one rank per GPU, spec.gpusPerNode: " + std::to_string(gpus);
    return "";
  }
  if (v == "cpu" || v == "auto") {
    if (gpus > 0) {
      return Contradicts(*flag, "spec.gpusPerNode: " + std::to_string(gpus) +
                                    " (one rank per CPU against one per GPU)");
    }
    if (!procs_.fixed()) {
      return who_ + "'s " + flag->written +
             " (one rank per CPU) needs spec.procsPerNode: the world size must be known "
             "before the pods start; set procsPerNode to the ranks each node runs";
    }
    flag->effect = "ignored: " + procs_.by + " fixes the ranks per node";
    return "";
  }
  std::optional<int64_t> n = ParseTorchrunNumber(v, 1, kIntMax);
  if (!n) {
    return who_ + "'s " + flag->written + ": must be a number >= 1, gpu, cpu or auto";
  }
  if (gpus > 0) {
    if (*n != gpus) {
      return Contradicts(*flag, "spec.gpusPerNode: " + std::to_string(gpus) +
                                    " (one rank per GPU); make them equal or drop the flag");
    }
    flag->effect = "agrees: one rank per GPU, spec.gpusPerNode: " + std::to_string(gpus);
    return "";
  }
  return Number(flag, 1, kIntMax, &procs_, &spec_->procs_per_node,
                "ranks per node (spec.procsPerNode)");
}

std::string FlagCheck::Nodes(TorchrunFlag* flag) {
  const std::string& v = flag->value;
  const size_t colon = v.find(':');
  if (colon == std::string::npos) {
    return Number(flag, 1, kIntMax, &nodes_, &spec_->nodes, "nodes (spec.nodes)");
  }
  std::optional<int64_t> min = ParseTorchrunNumber(v.substr(0, colon), 1, kIntMax);
  std::optional<int64_t> max = ParseTorchrunNumber(v.substr(colon + 1), 1, kIntMax);
  if (!min || !max || *min > *max) {
    return who_ + "'s " + flag->written + ": must be N or MIN:MAX with 1 <= MIN <= MAX";
  }
  if (*min == *max) {
    TorchrunFlag pinned = *flag;
    pinned.value = std::to_string(*min);
    std::string error = Number(&pinned, 1, kIntMax, &nodes_, &spec_->nodes, "nodes (spec.nodes)");
    flag->effect = pinned.effect;
    return error;
  }
  if (!nodes_.fixed()) {
    return who_ + "'s " + flag->written +
           " is an elastic range; spawnpoint runs a fixed gang of spec.nodes pods: set "
           "spec.nodes (" +
           std::to_string(*min) + ".." + std::to_string(*max) + ") or --nnodes=N";
  }
  if (spec_->nodes < *min || spec_->nodes > *max) {
    return Contradicts(*flag, nodes_.by + " (outside the range)");
  }
  flag->effect = "agrees: " + nodes_.by + " is within " + v + "; the gang stays at " +
                 std::to_string(spec_->nodes) + " nodes (no elastic resizing)";
  return "";
}

std::string FlagCheck::Number(TorchrunFlag* flag, int64_t min, int64_t max, Fixed* fixed,
                              int* field, const std::string& what) {
  std::optional<int64_t> n = ParseTorchrunNumber(flag->value, min, max);
  if (!n) {
    return who_ + "'s " + flag->written + ": must be an integer from " + std::to_string(min) +
           " to " + std::to_string(max);
  }
  if (fixed->fixed()) {
    if (*n != *field) return Contradicts(*flag, fixed->by + "; make them equal or drop the flag");
    flag->effect = "agrees: " + fixed->by;
    return "";
  }
  *field = static_cast<int>(*n);
  fixed->by = flag->written;
  flag->effect = "taken: " + std::to_string(*n) + " " + what;
  return "";
}

}  // namespace

Status ApplyTorchrunCommand(const json& spec_json, const FieldPath& spec_path,
                            TrainingJobSpec* spec, FieldReader* reader) {
  TrainerContainer& trainer = spec->trainer;
  std::vector<std::string> argv = trainer.command;
  argv.insert(argv.end(), trainer.args.begin(), trainer.args.end());
  const FieldPath container = TrainerPath(spec_json, spec_path);
  const size_t in_command = trainer.command.size();
  auto element = [&](size_t i) {
    return i < in_command ? (container / "command").Index(i)
                          : (container / "args").Index(i - in_command);
  };
  std::string python_exec;
  for (const EnvVar& var : trainer.env) {
    if (var.name == "PYTHON_EXEC") python_exec = var.value;
  }

  size_t bad = 0;
  StatusOr<std::optional<TorchrunLaunch>> parsed = ParseTorchrunCommand(argv, python_exec, &bad);
  if (!parsed.ok()) return reader->Fail(element(bad), parsed.status().message());
  if (!parsed->has_value()) return Status::Ok();
  TorchrunLaunch launch = std::move(**parsed);

  const std::string who = launch.launcher.find("torch.distributed.launch") != std::string::npos
                              ? "torch.distributed.launch"
                              : "torchrun";
  FlagCheck check(spec_json, spec, who);
  for (TorchrunFlag& flag : launch.flags) {
    std::string error = check.Check(&flag);
    if (!error.empty()) return reader->Fail(element(flag.index), error);
  }
  if (static_cast<int64_t>(spec->nodes) * RanksPerNode(*spec) > kIntMax) {
    return reader->Fail(
        element(launch.flags.empty() ? 0 : launch.flags.back().index),
        "the world size (nodes x ranks per node) must be <= " + std::to_string(kIntMax));
  }
  trainer.command = launch.RankArgv();
  trainer.args.clear();
  trainer.torchrun = std::move(launch);
  return Status::Ok();
}

}  // namespace spawnpoint::api
