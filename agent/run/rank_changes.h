// What the agent changes in a node's ranks, compared with the same command under torchrun:
// one line each, said once when the node starts (README.md, "What the agent changes"). A pure
// function of the node plan and the job; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "agent/plan/node_plan.h"
#include "api/training_job.h"

namespace spawnpoint::agent {

// The lines, without the job's name: CPU pinning and thread counts; for Python ranks the
// start method, the DataLoader defaults (injected and grown workers, the start method,
// persistence) and the standby ranks; the stall rule. Empty for a plan without ranks.
std::vector<std::string> RankChanges(const NodePlan& plan, const api::TrainingJob& job);

}  // namespace spawnpoint::agent
