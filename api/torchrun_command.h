// A trainer command that starts torchrun, understood. PyTorchJob manifests say
// `command: [torchrun, --nproc_per_node=8, train.py]` (or `python -m torch.distributed.run`,
// or `python -m torch.distributed.launch`); under spawnpoint the agent is the launcher, so
// such a command is turned into what torchrun would run in each rank slot
// (`python3 -u train.py args...`), and torchrun's flags are checked against the manifest
// (api/torchrun_spec.h). The table of flags and what each means here is in
// docs/kubernetes.md, "Coming from torchrun / PyTorchJob".
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace spawnpoint::api {

// One torchrun flag as the command gave it.
struct TorchrunFlag {
  std::string name;     // canonical, with underscores: "nproc_per_node"
  std::string value;    // "" for a switch (--standalone)
  std::string written;  // as written: "--nproc-per-node=8", "--nproc_per_node 8", "-r3"
  size_t index = 0;     // the element of command + args that holds the value (or the switch)
  // What it means for the job (set by the manifest check): "taken: ...", "agrees: ...",
  // "ignored: ...".
  std::string effect;
};

// What a torchrun command runs in each rank slot, and how it was written.
struct TorchrunLaunch {
  // "torchrun", "/opt/conda/bin/torchrun", "python3 -m torch.distributed.run",
  // "python -m torch.distributed.launch".
  std::string launcher;
  std::vector<std::string> original;  // command + args as written
  // The interpreter each rank runs (argv[0] of `python -m ...`; $PYTHON_EXEC when the
  // manifest sets it, as torchrun honours it); "python3" for a bare torchrun until the agent
  // reads torchrun's shebang (interpreter_from_launcher). Unused with no_python.
  std::string interpreter;
  bool interpreter_from_launcher = false;
  std::string launcher_program;  // argv[0]: the torchrun whose shebang names the interpreter
  std::string program;           // the script, the module (module) or the executable (no_python)
  bool module = false;           // -m/--module: `python -u -m program`
  bool no_python = false;        // --no_python: `program args...`
  std::vector<std::string> program_args;  // exactly as given to the script
  // torch.distributed.launch without --use_env passes each rank --local_rank=<local rank>
  // before the script's own arguments.
  bool local_rank_arg = false;
  std::vector<TorchrunFlag> flags;

  // What one rank runs, as torchrun would start it: [interpreter, -u, (-m,) program,
  // (--local_rank=N,) args...], or [program, args...] with no_python. `local_rank` is
  // needed only when local_rank_arg is set (nullopt leaves the argument out).
  std::vector<std::string> RankArgv(std::optional<int> local_rank = std::nullopt) const;
  // "train.py", "module pkg.train", "./train" (no_python).
  std::string What() const;
  // "torchrun in the command: the agent launches train.py itself, 8 ranks per node".
  std::string Summary(int ranks_per_node) const;
};

// Whether `argv` starts torchrun in one of its forms, and if so what it runs; nullopt when it
// does not. Flags in --flag=value and --flag value forms, dash and underscore spellings, and
// unique abbreviations (as torchrun's argparse takes them) are understood; a `--` ends
// torchrun's options, and one right after the script is dropped, as torchrun's argparse
// does. `env` is the trainer container's literal environment (for PYTHON_EXEC).
// Errors (an unknown flag, a missing value or script, --no_python with -m) are
// InvalidArgument; *bad_index is then the element of argv at fault.
StatusOr<std::optional<TorchrunLaunch>> ParseTorchrunCommand(const std::vector<std::string>& argv,
                                                             std::string_view python_exec,
                                                             size_t* bad_index);

// The interpreter a script's first lines name: "#!/opt/conda/bin/python3.10" ->
// "/opt/conda/bin/python3.10", "#!/usr/bin/env python3" -> "python3", and the
// "#!/bin/sh" + "'''exec' /path/python ..." trampoline pip writes for long paths; "" when
// `head` names no Python interpreter.
std::string PythonFromShebang(std::string_view head);

// Whether `program` names a Python interpreter (python, python3, python3.11, /usr/bin/python3).
bool IsPythonProgram(std::string_view program);

// A torchrun flag's whole-number value within [min, max] ("8", not "8x" or " 8"); nullopt
// otherwise.
std::optional<int64_t> ParseTorchrunNumber(std::string_view text, int64_t min, int64_t max);

}  // namespace spawnpoint::api
