// runPolicy.cleanPodPolicy: which pods go when the job finishes. None keeps every pod (and
// the service); Running deletes the pods still Pending or Running (ranks that would hold
// GPUs) and keeps finished ones for their logs; All deletes every pod. The service is
// deleted unless the policy is None. Pure; thread-safe.
#pragma once

#include <nlohmann/json.hpp>

#include "api/training_job.h"

namespace spawnpoint::op {

bool DeletePodWhenFinished(api::CleanPodPolicy policy, const nlohmann::json& pod);
bool DeleteServiceWhenFinished(api::CleanPodPolicy policy);

}  // namespace spawnpoint::op
