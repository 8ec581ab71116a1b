// The agent's commands. Each returns the process exit code, as agent/run/exit_codes.h
// tables it: 0 success; 1 the job failed (the rank's own code and cause are in the
// termination log) or this machine cannot run it; 2 bad input (flags, manifest, manifest
// file, command), nothing started; 128+N when the agent itself was stopped by signal N.
#pragma once

#include "agent/cli/options.h"
#include "agent/supervisor/signals.h"

namespace spawnpoint::agent {

int PlanCommand(const AgentOptions& options);
int RunCommand(const AgentOptions& options, SignalWatcher* signals);

}  // namespace spawnpoint::agent
