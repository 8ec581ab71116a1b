#include "api/torchrun_job.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <map>
#include <optional>
#include <set>

#include "api/field_reader.h"
#include "api/torchrun_command.h"
#include "api/yaml_to_json.h"

namespace spawnpoint::api {
namespace {

using nlohmann::json;

// The manifest's trainer command, as error paths name its elements.
constexpr std::string_view kCommandPath = "spec.template.spec.containers[0].command[";

// "train.py" -> "train", module "pkg.train" -> "pkg-train": a DNS label of at most 52
// characters that starts with a letter, "torchrun" when nothing is left.
std::string NameFromProgram(const TorchrunLaunch& launch) {
  std::string base = launch.program.substr(launch.program.rfind('/') + 1);
  if (!launch.module && base.size() > 3 && base.substr(base.size() - 3) == ".py") {
    base.resize(base.size() - 3);
  }
  std::string name;
  for (char c : base) {
    const char lower = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const bool ok = (lower >= 'a' && lower <= 'z') || (lower >= '0' && lower <= '9');
    if (ok) {
      name += lower;
    } else if (!name.empty() && name.back() != '-') {
      name += '-';
    }
  }
  size_t first = name.find_first_of("abcdefghijklmnopqrstuvwxyz");
  name = first == std::string::npos ? "" : name.substr(first, 52);
  while (!name.empty() && name.back() == '-') name.pop_back();
  return name.empty() ? "torchrun" : name;
}

// One --spec KEY=VALUE, parsed.
struct SpecSet {
  std::vector<std::string> path;  // under spec
  json value;
};

StatusOr<SpecSet> ParseSpecSet(const std::string& text) {
  const size_t eq = text.find('=');
  const std::string usage =
      "expected KEY=VALUE, a field of the TrainingJob's spec (docs/trainingjob.md) and its "
      "value, e.g. --spec loader.workersPerRank=2";
  if (eq == std::string::npos || eq == 0) {
    return InvalidArgument("--spec " + text + ": " + usage);
  }
  std::string key = text.substr(0, eq);
  if (key.rfind("spec.", 0) == 0) key = key.substr(5);
  SpecSet set;
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    set.path.push_back(key.substr(start, dot == std::string::npos ? dot : dot - start));
    if (set.path.back().empty()) return InvalidArgument("--spec " + text + ": " + usage);
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (set.path.front() == "template") {
    return InvalidArgument("--spec " + text +
                           ": the trainer container is the torchrun command line; the ranks "
                           "inherit the agent's environment and working directory");
  }
  SP_ASSIGN_OR_RETURN(std::vector<YamlDocument> docs,
                      ParseYamlStream(text.substr(eq + 1), "--spec " + key));
  set.value = docs.empty() ? json(nullptr) : docs.front().value;
  return set;
}

Status Apply(const SpecSet& set, json* spec) {
  json* at = spec;
  for (size_t i = 0; i + 1 < set.path.size(); ++i) {
    json& next = (*at)[set.path[i]];
    if (next.is_null()) next = json::object();
    if (!next.is_object()) {
      return InvalidArgument("--spec: spec." + set.path[i] + " is set to a value, not an object");
    }
    at = &next;
  }
  (*at)[set.path.back()] = set.value;
  return Status::Ok();
}

bool Sets(const std::vector<SpecSet>& sets, const std::vector<std::string>& path) {
  return std::any_of(sets.begin(), sets.end(), [&](const SpecSet& s) { return s.path == path; });
}

// A flag's elements of argv: the value's alone (--flag=value, -r3, a switch), or the name's
// and the value's.
std::vector<size_t> Elements(const TorchrunFlag& flag, const std::vector<std::string>& argv) {
  if (argv[flag.index] == flag.written) return {flag.index};
  return {flag.index - 1, flag.index};
}

std::string Plural(int n, const std::string& one, const std::string& many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

// The command line's reading of the flags, before the manifest is decoded.
class Builder {
 public:
  Builder(std::vector<std::string> argv, const TorchrunMachine& machine)
      : argv_(std::move(argv)), machine_(machine) {}

  // Takes --node_rank, --master_addr, --master_port 0 out of the command and settles
  // --nproc_per_node on this machine (spec->gpusPerNode, or a CPU count in the command).
  Status Read(const TorchrunLaunch& launch, const std::vector<SpecSet>& sets, json* spec);
  // The manifest's command and, for each of its elements, the element of argv it came from.
  std::vector<std::string> Command(std::vector<size_t>* from) const;
  // The decoded launch told in the command line's terms: the original command, each flag
  // as written there, the ones taken out with what they do.
  void Restore(const std::vector<size_t>& from, TorchrunLaunch* launch) const;

  size_t bad() const { return bad_; }
  int node_rank() const { return node_rank_; }
  const std::string& master_addr() const { return master_addr_; }
  bool free_port() const { return free_port_; }
  bool port_given() const { return port_given_; }
  bool restarts_given() const { return restarts_given_; }
  const std::string& rdzv_endpoint() const { return rdzv_endpoint_; }
  const std::string& ranks() const { return ranks_; }

 private:
  Status Fail(const TorchrunFlag& flag, const std::string& what) {
    bad_ = flag.index;
    return InvalidArgument("torchrun's " + flag.written + (what[0] == ':' ? "" : " ") + what);
  }
  Status RanksPerNode(const TorchrunFlag* flag, json* spec);
  void Take(const TorchrunFlag& flag, std::string effect) {
    TorchrunFlag taken = flag;
    taken.effect = "taken: " + std::move(effect);
    taken_.push_back(std::move(taken));
    for (size_t i : Elements(flag, argv_)) removed_.insert(i);
  }

  const std::vector<std::string> argv_;  // "torchrun" + the command line's args
  const TorchrunMachine machine_;
  size_t bad_ = 0;
  std::set<size_t> removed_;               // elements taken out of the command
  std::map<size_t, std::string> rewrite_;  // element -> what the command holds instead
  std::map<size_t, std::string> note_;     // flag's element -> words added to its effect
  std::vector<TorchrunFlag> taken_;        // the flags taken out, with their effect
  int node_rank_ = -1;
  std::string master_addr_, rdzv_endpoint_;
  bool free_port_ = false, port_given_ = false, restarts_given_ = false;
  std::string ranks_;  // "2 CPU ranks (--nproc_per_node auto: no GPU found)"
};

Status Builder::Read(const TorchrunLaunch& launch, const std::vector<SpecSet>& sets, json* spec) {
  // --spec gpusPerNode or procsPerNode: the manifest's rules alone decide the ranks.
  const bool spec_decides = Sets(sets, {"gpusPerNode"}) || Sets(sets, {"procsPerNode"});
  bool nproc = false;
  for (const TorchrunFlag& flag : launch.flags) {
    if (flag.name == "node_rank") {
      std::optional<int64_t> n = ParseTorchrunNumber(flag.value, 0, kIntMax);
      if (!n) return Fail(flag, ": must be an integer >= 0 (this machine's node, 0 to nnodes-1)");
      if (node_rank_ >= 0 && node_rank_ != *n) {
        return Fail(flag, "contradicts --node_rank " + std::to_string(node_rank_));
      }
      node_rank_ = static_cast<int>(*n);
      Take(flag, "this agent runs node " + flag.value);
    } else if (flag.name == "master_addr") {
      if (flag.value.empty()) return Fail(flag, ": must be node 0's address");
      master_addr_ = flag.value;
      Take(flag, "MASTER_ADDR, where the ranks meet (node 0)");
    } else if (flag.name == "master_port") {
      port_given_ = true;
      if (flag.value == "0") {
        free_port_ = true;
        Take(flag, "a free port, chosen when the agent starts");
      }
    } else if (flag.name == "max_restarts") {
      restarts_given_ = true;
    } else if (flag.name == "rdzv_endpoint") {
      rdzv_endpoint_ = flag.value;
    } else if (flag.name == "nproc_per_node" && !spec_decides) {
      nproc = true;
      SP_RETURN_IF_ERROR(RanksPerNode(&flag, spec));
    }
  }
  if (!nproc && !spec_decides) return RanksPerNode(nullptr, spec);  // torchrun's default: 1
  return Status::Ok();
}

// torchrun's --nproc_per_node on this machine (torch 2.x's determine_local_world_size): a
// number, gpu (every GPU; an error without one), cpu (one per CPU), auto (gpu when there are
// GPUs, else cpu). A rank of a GPU machine gets a GPU of its own, so a number above the GPUs
// is an error; --gpu-backend none makes CPU ranks.
Status Builder::RanksPerNode(const TorchrunFlag* flag, json* spec) {
  const std::string value = flag ? flag->value : "1";
  const std::string how = flag ? " (" + flag->written + ")" : " (torchrun's default, 1)";
  const int gpus = machine_.gpus;
  auto cpu_ranks = [&](const std::string& why) {
    const std::string n = std::to_string(std::max(1, machine_.cpus));
    const std::string& element = argv_[flag->index];
    const size_t eq = element.find('=');
    rewrite_[flag->index] =
        element == flag->written && eq != std::string::npos ? element.substr(0, eq + 1) + n : n;
    note_[flag->index] = " (" + value + ": " + why + ")";
    ranks_ = Plural(std::max(1, machine_.cpus), "CPU rank", "CPU ranks") + " (" + flag->written +
             ": " + why + ")";
  };
  auto gpu_ranks = [&](int n) {
    (*spec)["gpusPerNode"] = n;
    ranks_ = Plural(n, "rank", "ranks") + ", one GPU each" + how;
  };
  if (value == "gpu" || (value == "auto" && gpus > 0)) {
    if (gpus == 0) {
      return Fail(*flag,
                  "asks for one rank per GPU, but the agent found no GPU on this machine "
                  "(--gpu-backend chooses how it looks)");
    }
    gpu_ranks(gpus);
  } else if (value == "cpu") {
    cpu_ranks("one per CPU the agent may use");
  } else if (value == "auto") {
    cpu_ranks("no GPU found, one rank per CPU the agent may use");
  } else if (std::optional<int64_t> n = ParseTorchrunNumber(value, 1, kIntMax)) {
    if (gpus == 0) {
      ranks_ = Plural(static_cast<int>(*n), "CPU rank", "CPU ranks") + how;
    } else if (*n > gpus) {
      return Fail(*flag, "asks for " + value + " ranks, but this machine has " +
                             Plural(gpus, "GPU", "GPUs") +
                             " and each rank gets its own: give at most " + std::to_string(gpus) +
                             " (or gpu), or --gpu-backend none for CPU ranks");
    } else {
      gpu_ranks(static_cast<int>(*n));
    }
  }
  // Anything else: the manifest's rules refuse it, naming what is allowed.
  return Status::Ok();
}

std::vector<std::string> Builder::Command(std::vector<size_t>* from) const {
  std::vector<std::string> command;
  for (size_t i = 0; i < argv_.size(); ++i) {
    if (removed_.count(i)) continue;
    auto it = rewrite_.find(i);
    command.push_back(it == rewrite_.end() ? argv_[i] : it->second);
    from->push_back(i);
  }
  return command;
}

void Builder::Restore(const std::vector<size_t>& from, TorchrunLaunch* launch) const {
  for (TorchrunFlag& flag : launch->flags) {
    const bool apart = flag.written != launch->original[flag.index];
    flag.index = from[flag.index];
    flag.written = apart ? argv_[flag.index - 1] + " " + argv_[flag.index] : argv_[flag.index];
    auto note = note_.find(flag.index);
    if (note != note_.end()) flag.effect += note->second;
  }
  launch->flags.insert(launch->flags.end(), taken_.begin(), taken_.end());
  std::stable_sort(launch->flags.begin(), launch->flags.end(),
                   [](const TorchrunFlag& a, const TorchrunFlag& b) { return a.index < b.index; });
  launch->original = argv_;
}

}  // namespace

StatusOr<TorchrunJob> TorchrunJobFromCommandLine(const TorchrunCommandLine& line,
                                                 const TorchrunMachine& machine, size_t* bad_arg) {
  *bad_arg = line.args.size();
  std::vector<std::string> argv = {"torchrun"};
  argv.insert(argv.end(), line.args.begin(), line.args.end());
  // An element of argv as the command line's index (argv[0] is the "torchrun" added here).
  auto at = [&](size_t i) { return i == 0 ? line.args.size() : std::min(i - 1, line.args.size()); };
  size_t bad = 0;
  StatusOr<std::optional<TorchrunLaunch>> parsed =
      ParseTorchrunCommand(argv, machine.python_exec, &bad);
  if (!parsed.ok()) {
    *bad_arg = line.args.empty() ? 0 : at(bad);
    return parsed.status();
  }
  const TorchrunLaunch& launch = **parsed;

  std::vector<SpecSet> sets;
  for (const std::string& text : line.spec_sets) {
    SP_ASSIGN_OR_RETURN(SpecSet set, ParseSpecSet(text));
    sets.push_back(std::move(set));
  }
  json spec = json::object();
  Builder builder(argv, machine);
  if (Status s = builder.Read(launch, sets, &spec); !s.ok()) {
    *bad_arg = at(builder.bad());
    return s;
  }
  // torchrun restarts nothing unless told (--max_restarts defaults to 0).
  if (!builder.restarts_given()) spec["restartPolicy"]["maxRestarts"] = 0;
  for (const SpecSet& set : sets) SP_RETURN_IF_ERROR(Apply(set, &spec));

  std::vector<size_t> from;
  json container = {{"name", "trainer"}, {"command", builder.Command(&from)}};
  if (!machine.python_exec.empty()) {
    container["env"] = json::array({{{"name", "PYTHON_EXEC"}, {"value", machine.python_exec}}});
  }
  spec["template"] = {{"spec", {{"containers", json::array({container})}}}};
  TorchrunJob out;
  out.manifest = {{"apiVersion", kApiVersion},
                  {"kind", kKind},
                  {"metadata", {{"name", line.name.empty() ? NameFromProgram(launch) : line.name}}},
                  {"spec", spec}};

  StatusOr<TrainingJob> job = TrainingJobFromJson(out.manifest);
  if (!job.ok()) {
    // "spec.template.spec.containers[0].command[3]: torchrun's ..." names an element of the
    // command line; any other path is a field --spec set (or --job's name).
    std::string message = job.status().message();
    if (message.rfind(kCommandPath, 0) == 0) {
      const size_t close = message.find("]: ");
      const size_t element = std::stoul(message.substr(kCommandPath.size()));
      *bad_arg = element < from.size() ? at(from[element]) : line.args.size();
      return InvalidArgument(message.substr(close + 3));
    }
    return InvalidArgument(message.rfind("metadata.name", 0) == 0 ? "--job: " + message
                                                                  : "--spec: " + message);
  }
  out.job = std::move(job).value();
  TrainerContainer& trainer = out.job.spec.trainer;
  builder.Restore(from, &*trainer.torchrun);
  if (trainer.torchrun->interpreter_from_launcher && !machine.torchrun_python.empty()) {
    trainer.torchrun->interpreter = machine.torchrun_python;
    trainer.command = trainer.torchrun->RankArgv();
  }

  const TrainingJobSpec& s = out.job.spec;
  const std::string nodes = std::to_string(s.nodes);
  if (s.nodes > 1 && builder.node_rank() < 0) {
    return InvalidArgument(
        "the job spans " + nodes +
        " nodes and --node_rank is not given: torchrun runs one node per machine, so give each "
        "machine's agent its --node_rank (0 to " +
        std::to_string(s.nodes - 1) +
        ") and --master_addr (node 0's address); spawnpoint does not run torchrun's "
        "rendezvous. To run every node on this machine, write a TrainingJob with spec.nodes: " +
        nodes + " and use `spawnpoint-agent run -f` (docs/torchrun.md)");
  }
  if (builder.node_rank() >= s.nodes) {
    return InvalidArgument("torchrun's --node_rank " + std::to_string(builder.node_rank()) +
                           " must be below the number of nodes, " + nodes + " (--nnodes)");
  }
  if (s.nodes > 1 && !builder.rdzv_endpoint().empty() && builder.master_addr().empty()) {
    return InvalidArgument("torchrun's --rdzv_endpoint " + builder.rdzv_endpoint() +
                           " is torchrun's rendezvous, which the agents do not run: the ranks "
                           "meet at node 0, so give --master_addr (node 0's address) and, if "
                           "its default 29500 is taken, --master_port");
  }
  if (s.nodes > 1 && builder.free_port()) {
    return InvalidArgument(
        "torchrun's --master_port 0 asks for a free port, which each machine "
        "would choose for itself: with " +
        nodes + " nodes give every machine the same --master_port");
  }
  out.node_rank = builder.node_rank();
  out.master_addr = builder.master_addr();
  std::string port;
  if (builder.free_port() ||
      (s.nodes == 1 && !builder.port_given() && !Sets(sets, {"rendezvous", "port"}))) {
    out.master_port = 0;
    port = "rendezvous on a free port";
  } else {
    port = "rendezvous port " + std::to_string(s.rendezvous_port);
  }
  std::string ranks = builder.ranks().empty()
                          ? Plural(RanksPerNode(s), "rank", "ranks") + " per node (--spec)"
                          : builder.ranks();
  out.summary = "torchrun command line: " + ranks + ", backend " +
                BackendName(EffectiveBackend(s)) + ", " + port + ", maxRestarts " +
                std::to_string(s.restart_policy.max_restarts) +
                (builder.restarts_given() ? "" : " (torchrun's default)");
  if (s.nodes > 1) {
    out.summary += "; node " + std::to_string(out.node_rank) + " of " + nodes;
  }
  return out;
}

}  // namespace spawnpoint::api
