#include "operator/policy/kueue_pods.h"

#include <set>

#include "operator/common/names.h"
#include "operator/common/object.h"

namespace spawnpoint::op {

using nlohmann::json;

namespace {

constexpr std::string_view kEvictedPrefix = "WorkloadEvictedDueTo";

}  // namespace

bool KueueCountsActive(const json& pod) {
  const bool bound = !Str(pod, "/spec/nodeName"_json_pointer).empty();
  if (IsTerminating(pod) && !bound) return false;
  return PodPhase(pod) != "Failed";
}

std::string KueueEndedAt(const json& pod) {
  std::string latest;
  const json status = pod.value("status", json::object());
  for (const auto& cs : status.value("containerStatuses", json::array())) {
    const std::string at = Str(cs, "/state/terminated/finishedAt"_json_pointer);
    if (at > latest) latest = at;
  }
  return latest;
}

std::string KueuePodName(const std::string& job, int node, const std::vector<json>& pods) {
  std::set<std::string> taken;
  for (const auto& p : pods) taken.insert(NameOf(p));
  const std::string base = PodName(job, node);
  if (!taken.count(base)) return base;
  for (int n = 1;; ++n) {
    std::string name = base + "-" + std::to_string(n);
    if (!taken.count(name)) return name;
  }
}

std::optional<KueueStop> KueueStopped(const json& pod) {
  const json* c = FindCondition(pod, kKueueTerminationTarget);
  if (c == nullptr || c->value("status", "") != "True") return std::nullopt;
  KueueStop stop;
  stop.reason = c->value("reason", "");
  if (stop.reason.rfind(kEvictedPrefix, 0) == 0) stop.reason.erase(0, kEvictedPrefix.size());
  if (stop.reason.empty()) stop.reason = "Evicted";
  stop.message = c->value("message", "");
  stop.at = c->value("lastTransitionTime", "");
  return stop;
}

bool KueueWorkloadFinished(const json& workload) {
  const json* c = FindCondition(workload, "Finished");
  return c != nullptr && c->value("status", "") == "True";
}

std::string KueueWaitingReason(const json& workload) {
  for (const char* type : {"QuotaReserved", "Admitted"}) {
    const json* c = FindCondition(workload, type);
    if (c != nullptr && c->value("status", "") == "False" && !c->value("message", "").empty()) {
      return c->value("message", "");
    }
  }
  return "";
}

}  // namespace spawnpoint::op
