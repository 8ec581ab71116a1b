#include "operator/policy/clean_pod_policy.h"

#include "operator/common/object.h"

namespace spawnpoint::op {

bool DeletePodWhenFinished(api::CleanPodPolicy policy, const nlohmann::json& pod) {
  if (IsTerminating(pod)) return false;
  switch (policy) {
    case api::CleanPodPolicy::kNone:
      return false;
    case api::CleanPodPolicy::kAll:
      return true;
    case api::CleanPodPolicy::kRunning: {
      const std::string phase = PodPhase(pod);
      return phase != "Succeeded" && phase != "Failed";
    }
  }
  return false;
}

bool DeleteServiceWhenFinished(api::CleanPodPolicy policy) {
  return policy != api::CleanPodPolicy::kNone;
}

}  // namespace spawnpoint::op
