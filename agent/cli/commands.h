// The agent's commands. Each returns the process exit code: 0 success; 2 bad input
// (manifest, flags), nothing started; 1 the environment cannot run the job (no GPU,
// /dev/shm too small), nothing started; otherwise the failing rank's code (128+signal for
// a signal), or 128+signal when the agent itself was stopped.
#pragma once

#include "agent/cli/options.h"
#include "agent/supervisor/signals.h"

namespace spawnpoint::agent {

int PlanCommand(const AgentOptions& options);
int RunCommand(const AgentOptions& options, SignalWatcher* signals);

}  // namespace spawnpoint::agent
