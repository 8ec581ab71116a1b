// A ResourceQuota's refusal of the job's pods (issue 41). The API server answers a create the
// namespace's quota cannot hold with 403 Forbidden, "pods \"x\" is forbidden: exceeded quota:
// gpu-quota, requested: requests.nvidia.com/gpu=3, used: requests.nvidia.com/gpu=3, limited:
// requests.nvidia.com/gpu=4". That is a state of the job, not a failure: the condition
// QuotaExceeded (with the API server's words), a warning event, phase Pending, no restart; the
// create is tried again when a ResourceQuota of the namespace changes (the controller watches
// them: a raise, or another job's pods freeing their share) and, in case that was missed, after
// QuotaRetryDelay. Before a whole gang is created, one dry-run create of a
// pod that asks for all of it (QuotaProbe) asks the quota at once, so that a gang it cannot
// hold is never half made (the half would hold its share and its agents time out waiting for
// the rest). Pure; thread-safe.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "common/clock.h"
#include "common/status.h"

namespace spawnpoint::op {

// When to try a refused create again: the job was refused for `refused_for` without a break;
// a quarter of that, at least `first` and at most `max` (5 s for the first 20 s, then backing
// off to 60 s at the defaults). `max` >= `first`.
struct QuotaRetry {
  Clock::Duration first = std::chrono::seconds(5);
  Clock::Duration max = std::chrono::seconds(60);
};
Clock::Duration QuotaRetryDelay(Clock::Duration refused_for, const QuotaRetry& retry);

// The API server refused a create for a ResourceQuota ("exceeded quota").
bool IsQuotaDenial(const Status& s);

// A pod asking for what `pods` pods like `pod` ask in all: `pod`'s metadata name `name`, its
// namespace and priority class (quota scopes), one container with requests and limits equal to
// that sum, no labels (no admission webhook takes it for one of the job's pods). For a dry-run
// create only.
nlohmann::json QuotaProbe(const nlohmann::json& pod, int pods, const std::string& name);

}  // namespace spawnpoint::op
