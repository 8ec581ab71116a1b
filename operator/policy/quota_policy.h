// A ResourceQuota's refusal of the job's pods (issue 41). The API server answers a create the
// namespace's quota cannot hold with 403 Forbidden, "pods \"x\" is forbidden: exceeded quota:
// gpu-quota, requested: requests.nvidia.com/gpu=3, used: requests.nvidia.com/gpu=3, limited:
// requests.nvidia.com/gpu=4". That is a state of the job, not a failure: the condition
// QuotaExceeded (with the API server's words), a warning event, phase Pending, the create tried
// again every kQuotaRetry, no restart. Before a whole gang is created, one dry-run create of a
// pod that asks for all of it (QuotaProbe) asks the quota at once, so that a gang it cannot
// hold is never half made (the half would hold its share and its agents time out waiting for
// the rest). Pure; thread-safe.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace spawnpoint::op {

inline constexpr std::chrono::seconds kQuotaRetry{5};

// The API server refused a create for a ResourceQuota ("exceeded quota").
bool IsQuotaDenial(const Status& s);

// A pod asking for what `pods` pods like `pod` ask in all: `pod`'s metadata name `name`, its
// namespace and priority class (quota scopes), one container with requests and limits equal to
// that sum, no labels (no admission webhook takes it for one of the job's pods). For a dry-run
// create only.
nlohmann::json QuotaProbe(const nlohmann::json& pod, int pods, const std::string& name);

}  // namespace spawnpoint::op
