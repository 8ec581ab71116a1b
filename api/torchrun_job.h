// A TrainingJob from a torchrun command line: what `spawnpoint-agent torchrun [torchrun's
// flags] script.py args` runs. The flags become the manifest they amount to on this machine
// (its GPUs and CPUs settle --nproc_per_node), which is decoded as any manifest is, so each
// flag gets the decision api/torchrun_spec.h makes for a manifest's command (taken, agrees,
// refused, ignored); the flags only a command line can honour (--node_rank, --master_addr,
// --master_port 0) come back for the agent's options. docs/torchrun.md is the user's view.
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/training_job.h"
#include "common/status.h"

namespace spawnpoint::api {

// What the machine offers the ranks, as the agent found it.
struct TorchrunMachine {
  int gpus = 0;  // GPUs the agent's GPU backend found
  int cpus = 1;  // CPUs the agent may use (its affinity)
  // The ranks' interpreter, as torchrun's own (sys.executable) would be: $PYTHON_EXEC (which
  // torchrun honours too), else the one on the first line of `torchrun` on PATH, else python3.
  std::string python_exec;      // "" when unset
  std::string torchrun_python;  // "" when no torchrun is found or its first line names none
};

struct TorchrunCommandLine {
  // torchrun's flags, the script (the module with -m, the program with --no_python) and the
  // script's own arguments, as given.
  std::vector<std::string> args;
  std::string name;  // the job's name; "": from the script ("train.py" -> "train")
  // --spec KEY=VALUE: spec fields the flags cannot say ("loader.workersPerRank=2"); VALUE
  // means what it means in a manifest (YAML: 2, auto, true, [a, b]).
  std::vector<std::string> spec_sets;
};

struct TorchrunJob {
  TrainingJob job;
  nlohmann::json manifest;  // the TrainingJob the command line amounts to, before defaults
  int node_rank = -1;       // --node_rank; -1 when not given (one node)
  std::string master_addr;  // --master_addr; "" when not given (127.0.0.1)
  // 0: a free port, chosen when the agent starts (one node without --master_port, or
  // --master_port 0); -1: spec.rendezvous.port (--master_port P, or torchrun's 29500 when
  // the job spans nodes).
  int master_port = -1;
  // One line: what this machine decided (ranks and their kind, the port, the restarts).
  std::string summary;
};

// Errors are InvalidArgument naming the flag (or --spec) and what is allowed; *bad_arg is
// then the element of line.args at fault, line.args.size() when no element is.
StatusOr<TorchrunJob> TorchrunJobFromCommandLine(const TorchrunCommandLine& line,
                                                 const TorchrunMachine& machine, size_t* bad_arg);

}  // namespace spawnpoint::api
