#include "operator/policy/success_policy.h"

#include <set>

#include "operator/common/object.h"

namespace spawnpoint::op {

bool AttemptSucceeded(const std::vector<const nlohmann::json*>& pods, int nodes) {
  std::set<int> succeeded;
  for (const auto* pod : pods) {
    int node = NodeRankOf(*pod);
    if (node < 0 || node >= nodes || IsTerminating(*pod)) continue;
    if (PodPhase(*pod) == "Succeeded") succeeded.insert(node);
  }
  return static_cast<int>(succeeded.size()) == nodes;
}

}  // namespace spawnpoint::op
