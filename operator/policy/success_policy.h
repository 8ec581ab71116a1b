// When an attempt has succeeded: every one of its `nodes` pods exists, is not being deleted
// and is in phase Succeeded (all ranks exited 0). One node finishing early is not success:
// the job is Succeeded only when no rank of the attempt still holds a GPU.
// Pure; thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

namespace spawnpoint::op {

// `pods` are the pods of the current attempt (any order, at most one per node).
bool AttemptSucceeded(const std::vector<const nlohmann::json*>& pods, int nodes);

}  // namespace spawnpoint::op
