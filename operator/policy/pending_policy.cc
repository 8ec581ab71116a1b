#include "operator/policy/pending_policy.h"

#include "operator/common/names.h"
#include "operator/common/object.h"
#include "operator/policy/admission_policy.h"

namespace spawnpoint::op {

std::string WhyPending(const nlohmann::json& pod) {
  const auto status = pod.value("status", nlohmann::json::object());
  for (const auto& c : status.value("conditions", nlohmann::json::array())) {
    if (c.value("type", "") == "PodScheduled" && c.value("status", "") == "False") {
      std::string m = c.value("message", "");
      return m.empty() ? c.value("reason", "Unschedulable") : m;
    }
  }
  for (const char* list : {"initContainerStatuses", "containerStatuses"}) {
    for (const auto& cs : status.value(list, nlohmann::json::array())) {
      if (!cs.contains("state") || !cs["state"].contains("waiting")) continue;
      const auto& w = cs["state"]["waiting"];
      std::string why = w.value("reason", "");
      std::string m = w.value("message", "");
      if (!why.empty() && why != "PodInitializing" && why != "ContainerCreating") {
        return cs.value("name", "") + ": " + why + (m.empty() ? "" : ": " + m);
      }
    }
  }
  return "not scheduled or started yet";
}

std::string GangPodsNotRunning(const std::vector<const nlohmann::json*>& gang, int nodes,
                               const std::string& job) {
  std::string out;
  for (int node = 0; node < nodes; ++node) {
    const nlohmann::json* found = nullptr;
    for (const auto* pod : gang) {
      if (NodeRankOf(*pod) == node) found = pod;
    }
    std::string why;
    if (found == nullptr) {
      why = PodName(job, node) + " (not created)";
    } else if (PodPhase(*found) == "Pending") {
      why = NameOf(*found) + " (Pending" + (IsTerminating(*found) ? ", being deleted" : "") + ": " +
            WhyPending(*found) + ")";
    } else {
      continue;
    }
    out += (out.empty() ? "" : ", ") + why;
  }
  return out;
}

PendingCheck CheckPending(const std::vector<const nlohmann::json*>& pods, Clock::Duration timeout,
                          WallTime now) {
  PendingCheck check;
  std::optional<WallTime> oldest;
  for (const auto* pod : pods) {
    if (IsTerminating(*pod)) continue;
    const std::string phase = PodPhase(*pod);
    if (phase != "Pending" && !phase.empty()) continue;
    if (!KueueGates(*pod).empty()) continue;  // waits for Kueue's admission, not the scheduler
    auto created = ParseTime(Str(*pod, "/metadata/creationTimestamp"_json_pointer));
    if (!created) continue;
    const auto since = std::chrono::duration_cast<Clock::Duration>(now - *created);
    if (since >= timeout) {
      if (!oldest || *created < *oldest) {
        oldest = created;
        check.stuck_pod = NameOf(*pod);
        check.message = "pod " + check.stuck_pod + " has been Pending for " +
                        FormatDuration(since) + ": " + WhyPending(*pod);
      }
    } else {
      const auto left = timeout - since;
      if (!check.recheck_after || left < *check.recheck_after) check.recheck_after = left;
    }
  }
  return check;
}

}  // namespace spawnpoint::op
