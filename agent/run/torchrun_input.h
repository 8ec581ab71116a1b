// The job of `spawnpoint-agent torchrun`: its torchrun command line made a TrainingJob on this
// machine (api/torchrun_job.h), with the machine read here (the GPUs the GPU backend finds,
// the CPUs the agent may use, $PYTHON_EXEC, the interpreter on `torchrun`'s first line).
// Reads the machine and says what it decided; starts nothing. Thread-safe apart from what
// the GPU backend says of itself.
#pragma once

#include "agent/cli/options.h"
#include "api/training_job.h"
#include "common/status.h"

namespace spawnpoint::agent {

// o->torchrun's job. Sets o->node_rank, o->master_addr and o->master_port from torchrun's
// --node_rank, --master_addr and its port rule (a free port for one node). Says in two
// lines what each rank runs (with the flags it ignores) and what this machine decided.
// InvalidArgument for bad input, naming the flag (one of the agent's own flags among
// torchrun's: where it goes); a GPU backend that fails to open is its own error.
StatusOr<api::TrainingJob> LoadTorchrunJob(AgentOptions* o);

}  // namespace spawnpoint::agent
