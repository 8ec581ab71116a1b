#include "api/torchrun_command.h"

#include <algorithm>
#include <charconv>
#include <cctype>

namespace spawnpoint::api {
namespace {

// torchrun's options (torch 1.13 to 2.x): canonical name (underscores), whether it takes a
// value, its one-letter form, and whether only torch.distributed.launch has it.
struct FlagSpec {
  std::string_view name;
  bool takes_value;
  char short_name;
  bool launch_only;
};

constexpr FlagSpec kFlags[] = {
    {"nnodes", true, 0, false},
    {"nproc_per_node", true, 0, false},
    {"rdzv_backend", true, 0, false},
    {"rdzv_endpoint", true, 0, false},
    {"rdzv_id", true, 0, false},
    {"rdzv_conf", true, 0, false},
    {"standalone", false, 0, false},
    {"max_restarts", true, 0, false},
    {"monitor_interval", true, 0, false},
    {"start_method", true, 0, false},
    {"role", true, 0, false},
    {"module", false, 'm', false},
    {"no_python", false, 0, false},
    {"run_path", false, 0, false},
    {"log_dir", true, 0, false},
    {"redirects", true, 'r', false},
    {"tee", true, 't', false},
    {"local_ranks_filter", true, 0, false},
    {"node_rank", true, 0, false},
    {"master_addr", true, 0, false},
    {"master_port", true, 0, false},
    {"local_addr", true, 0, false},
    {"logs_specs", true, 0, false},
    {"use_env", false, 0, true},
};

enum class Launcher { kTorchrun, kRun, kLaunch };

std::string Base(std::string_view path) {
  size_t slash = path.rfind('/');
  return std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
}

std::string Underscored(std::string_view s) {
  std::string out(s);
  std::replace(out.begin(), out.end(), '-', '_');
  return out;
}

// The flag `name` (underscored, without dashes) stands for: exact, or the one flag it is an
// abbreviation of (argparse takes unique prefixes).
const FlagSpec* FindFlag(std::string_view name, Launcher launcher) {
  const FlagSpec* prefix_match = nullptr;
  int prefix_matches = 0;
  for (const FlagSpec& flag : kFlags) {
    if (flag.launch_only && launcher != Launcher::kLaunch) continue;
    if (flag.name == name) return &flag;
    if (!name.empty() && flag.name.substr(0, name.size()) == name) {
      prefix_match = &flag;
      ++prefix_matches;
    }
  }
  return prefix_matches == 1 ? prefix_match : nullptr;
}

Status Bad(size_t index, size_t* bad_index, const std::string& what) {
  *bad_index = index;
  return InvalidArgument(what);
}

// Where torchrun's own arguments start in `argv`, which launcher it is, and the interpreter
// that runs it; nullopt when argv does not start torchrun.
struct LauncherAt {
  Launcher launcher;
  size_t first_arg;
  std::string launcher_text;
  std::string interpreter;  // "" for a bare torchrun
};

std::optional<LauncherAt> FindLauncher(const std::vector<std::string>& argv) {
  if (argv.empty()) return std::nullopt;
  if (Base(argv[0]) == "torchrun") return LauncherAt{Launcher::kTorchrun, 1, argv[0], ""};
  if (!IsPythonProgram(argv[0])) return std::nullopt;
  // The interpreter's own options, up to -m MODULE or the script.
  for (size_t i = 1; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "--" || arg == "-" || arg.empty()) return std::nullopt;
    if (arg[0] != '-') {
      // `python3 /usr/bin/torchrun ...`
      if (Base(arg) != "torchrun") return std::nullopt;
      return LauncherAt{Launcher::kTorchrun, i + 1, argv[0] + " " + arg, argv[0]};
    }
    if (arg[1] == '-') {
      if (arg == "--check-hash-based-pycs") {
        ++i;
        continue;
      }
      return std::nullopt;  // --help, --version: no script runs
    }
    for (size_t j = 1; j < arg.size(); ++j) {
      const char c = arg[j];
      if (c == 'c') return std::nullopt;
      if (c == 'W' || c == 'X') {
        if (j + 1 == arg.size()) ++i;
        break;
      }
      if (c != 'm') continue;
      std::string module;
      size_t next = i + 1;
      if (j + 1 < arg.size()) {
        module = arg.substr(j + 1);
      } else if (i + 1 < argv.size()) {
        module = argv[i + 1];
        next = i + 2;
      }
      const std::string text = argv[0] + " -m " + module;
      if (module == "torch.distributed.run") return LauncherAt{Launcher::kRun, next, text, argv[0]};
      if (module == "torch.distributed.launch") {
        return LauncherAt{Launcher::kLaunch, next, text, argv[0]};
      }
      return std::nullopt;
    }
  }
  return std::nullopt;
}

}  // namespace

bool IsPythonProgram(std::string_view program) {
  std::string base = Base(program);
  if (base.rfind("python", 0) != 0) return false;
  // python, python3, python3.11; not "python-config".
  return base.find_first_not_of("0123456789.", 6) == std::string::npos;
}

StatusOr<std::optional<TorchrunLaunch>> ParseTorchrunCommand(const std::vector<std::string>& argv,
                                                             std::string_view python_exec,
                                                             size_t* bad_index) {
  std::optional<LauncherAt> at = FindLauncher(argv);
  if (!at) return std::optional<TorchrunLaunch>();
  TorchrunLaunch launch;
  launch.launcher = at->launcher_text;
  launch.original = argv;
  launch.launcher_program = argv[0];
  launch.interpreter_from_launcher = at->interpreter.empty() && python_exec.empty();
  launch.interpreter = !python_exec.empty()      ? std::string(python_exec)
                       : at->interpreter.empty() ? "python3"
                                                 : at->interpreter;
  const std::string who =
      at->launcher == Launcher::kLaunch ? "torch.distributed.launch" : "torchrun";

  bool ended_options = false;  // a `--` came before the script
  bool use_env = false, run_path = false;
  size_t no_python_at = 0, module_at = 0;
  size_t i = at->first_arg;
  for (; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "--") {
      ended_options = true;
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // the script
    const bool long_form = arg[1] == '-';
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq);
    const FlagSpec* spec = nullptr;
    if (long_form) {
      spec = FindFlag(Underscored(key.substr(2)), at->launcher);
    } else if (key.size() >= 2) {
      for (const FlagSpec& f : kFlags) {
        if (f.short_name == key[1]) spec = &f;
      }
      if (spec && !spec->takes_value && key.size() > 2) spec = nullptr;
    }
    if (key == "-h" || key == "--help") {
      return Bad(i, bad_index, who + "'s " + key + " prints its help and runs nothing");
    }
    if (spec == nullptr) {
      return Bad(i, bad_index,
                 "unknown " + who + " option " + key + " (a flag before the script is " + who +
                     "'s; put the script's own flags after the script)");
    }
    TorchrunFlag flag;
    flag.name = std::string(spec->name);
    flag.index = i;
    if (spec->takes_value) {
      if (eq != std::string::npos) {
        flag.value = arg.substr(eq + 1);
        flag.written = arg;
      } else if (!long_form && key.size() > 2) {  // -r3
        flag.value = key.substr(2);
        flag.written = arg;
      } else if (i + 1 < argv.size()) {
        flag.value = argv[i + 1];
        flag.written = arg + " " + argv[i + 1];
        flag.index = ++i;
      } else {
        return Bad(i, bad_index, who + "'s " + key + " needs a value");
      }
    } else {
      if (eq != std::string::npos) {
        return Bad(i, bad_index, who + "'s " + key + " is a switch and takes no value");
      }
      flag.written = arg;
      if (flag.name == "module") module_at = i + 1;
      if (flag.name == "no_python") no_python_at = i + 1;
      if (flag.name == "use_env") use_env = true;
      if (flag.name == "run_path") run_path = true;
    }
    launch.flags.push_back(std::move(flag));
  }
  if (i >= argv.size()) {
    return Bad(argv.size() - 1, bad_index,
               who + " is given no script to run (expected e.g. `" + launch.launcher +
                   " --nproc_per_node=8 train.py`)");
  }
  launch.program = argv[i];
  ++i;
  // torchrun's argparse swallows the first `--` when it directly follows the script.
  if (!ended_options && i < argv.size() && argv[i] == "--") ++i;
  launch.program_args.assign(argv.begin() + static_cast<std::ptrdiff_t>(i), argv.end());

  // --run_path runs the script in torchrun's interpreter, before --no_python and -m.
  launch.no_python = no_python_at > 0 && !run_path;
  launch.module = module_at > 0 && !run_path;
  if (launch.no_python && launch.module) {
    return Bad(std::max(no_python_at, module_at) - 1, bad_index,
               who + " cannot take both --no_python and -m/--module (it refuses them too)");
  }
  if (launch.no_python) launch.interpreter_from_launcher = false;
  launch.local_rank_arg = at->launcher == Launcher::kLaunch && !use_env;
  return std::optional<TorchrunLaunch>(std::move(launch));
}

std::vector<std::string> TorchrunLaunch::RankArgv(std::optional<int> local_rank) const {
  std::vector<std::string> argv;
  if (!no_python) {
    argv = {interpreter, "-u"};
    if (module) argv.push_back("-m");
  }
  argv.push_back(program);
  if (local_rank_arg && local_rank) argv.push_back("--local_rank=" + std::to_string(*local_rank));
  argv.insert(argv.end(), program_args.begin(), program_args.end());
  return argv;
}

std::string TorchrunLaunch::What() const { return module ? "module " + program : program; }

std::string TorchrunLaunch::Summary(int ranks_per_node) const {
  std::string line = launcher + " in the command: the agent launches " + What() + " itself, " +
                     std::to_string(ranks_per_node) +
                     (ranks_per_node == 1 ? " rank per node" : " ranks per node");
  std::string ignored;
  for (const TorchrunFlag& flag : flags) {
    if (flag.effect.rfind("ignored", 0) != 0) continue;
    ignored += (ignored.empty() ? "" : ", ") + flag.written;
  }
  if (!ignored.empty()) line += "; ignored: " + ignored;
  return line;
}

std::string PythonFromShebang(std::string_view head) {
  if (head.substr(0, 2) != "#!") return "";
  auto line_of = [](std::string_view text) { return text.substr(0, text.find('\n')); };
  std::string_view first = line_of(head.substr(2));
  std::vector<std::string> words;
  std::string word;
  for (char c : first) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      if (!word.empty()) words.push_back(std::move(word));
      word.clear();
    } else {
      word += c;
    }
  }
  if (!word.empty()) words.push_back(std::move(word));
  if (words.empty()) return "";
  std::string program = words[0];
  if (Base(program) == "env") {
    program.clear();
    for (size_t i = 1; i < words.size() && program.empty(); ++i) {
      if (words[i][0] != '-') program = words[i];
    }
  }
  if (IsPythonProgram(program)) return program;
  // pip's trampoline for interpreter paths too long for a shebang:
  //   #!/bin/sh
  //   '''exec' "/very/long/path/bin/python3" "$0" "$@"
  if (Base(program) != "sh" && Base(program) != "bash") return "";
  size_t newline = head.find('\n');
  if (newline == std::string_view::npos) return "";
  std::string_view second = line_of(head.substr(newline + 1));
  constexpr std::string_view kExec = "'''exec' ";
  if (second.substr(0, kExec.size()) != kExec) return "";
  std::string_view rest = second.substr(kExec.size());
  std::string path;
  if (!rest.empty() && rest[0] == '"') {
    size_t close = rest.find('"', 1);
    if (close == std::string_view::npos) return "";
    path = rest.substr(1, close - 1);
  } else {
    path = rest.substr(0, rest.find(' '));
  }
  return IsPythonProgram(path) ? path : "";
}

std::optional<int64_t> ParseTorchrunNumber(std::string_view text, int64_t min, int64_t max) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || value < min || value > max) return std::nullopt;
  return value;
}

}  // namespace spawnpoint::api
