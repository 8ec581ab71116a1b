#include "operator/reconciler/pod_group.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>

#include "operator/common/names.h"
#include "operator/common/object.h"

namespace spawnpoint::op {
namespace {

using nlohmann::json;

// A quantity in milli-units ("500m" → 500, "2" → 2000, "1Gi" → 1073741824000); nullopt when
// it is not one (the API server rejected such a pod already).
std::optional<int64_t> Milli(const json& value) {
  std::string text = value.is_string() ? value.get<std::string>() : value.dump();
  if (!text.empty() && text.back() == 'm') {
    StatusOr<int64_t> milli = api::ParseQuantity(text.substr(0, text.size() - 1));
    if (!milli.ok()) return std::nullopt;
    return *milli;
  }
  // Without a suffix, "0.5" is 500m: scale by the exponent, not after rounding.
  bool plain = !text.empty() && text.find_first_not_of("0123456789.+") == std::string::npos;
  StatusOr<int64_t> scaled = api::ParseQuantity(plain ? text + "e3" : text);
  if (!scaled.ok()) return std::nullopt;
  if (plain) return *scaled;
  if (*scaled > std::numeric_limits<int64_t>::max() / 1000) return std::nullopt;
  return *scaled * 1000;
}

std::string FormatMilli(int64_t milli) {
  return milli % 1000 == 0 ? std::to_string(milli / 1000) : std::to_string(milli) + "m";
}

// One container's requests in milli-units: requests, and limits where a request is missing.
std::map<std::string, int64_t> ContainerRequests(const json& container) {
  std::map<std::string, int64_t> out;
  if (!container.is_object()) return out;
  json resources = container.value("resources", json::object());
  if (!resources.is_object()) return out;
  for (const char* kind : {"limits", "requests"}) {  // requests win over limits
    json list = resources.value(kind, json::object());
    if (!list.is_object()) continue;
    for (const auto& [name, quantity] : list.items()) {
      if (std::optional<int64_t> milli = Milli(quantity)) out[name] = *milli;
    }
  }
  return out;
}

std::map<std::string, int64_t> PodRequestsMilli(const json& pod) {
  const json spec = pod.value("spec", json::object());
  std::map<std::string, int64_t> sum;
  for (const auto& c : spec.value("containers", json::array())) {
    for (const auto& [name, milli] : ContainerRequests(c)) sum[name] += milli;
  }
  for (const auto& c : spec.value("initContainers", json::array())) {
    for (const auto& [name, milli] : ContainerRequests(c)) sum[name] = std::max(sum[name], milli);
  }
  return sum;
}

}  // namespace

bool UsesVolcano(const api::TrainingJob& job) {
  return job.spec.scheduling.gang == api::GangScheduler::kVolcano;
}

void ApplyGangScheduling(const api::TrainingJob& job, const json& owner, json& pod) {
  const api::SchedulingSpec& s = job.spec.scheduling;
  json& metadata = pod["metadata"];
  json& spec = pod["spec"];
  if (!s.priority_class_name.empty()) spec["priorityClassName"] = s.priority_class_name;
  const std::string group = GangGroupName(job.name, UidOf(owner));
  switch (s.gang) {
    case api::GangScheduler::kNone:
      return;
    case api::GangScheduler::kVolcano:
      spec["schedulerName"] = kVolcanoSchedulerName;
      metadata["annotations"][kVolcanoGroupAnnotation] = group;
      return;
    case api::GangScheduler::kKueue:
      metadata["labels"][api::kKueueQueueLabel] = s.queue;
      metadata["labels"][kKueuePodGroupLabel] = group;
      metadata["annotations"][kKueueGroupTotalAnnotation] = std::to_string(job.spec.nodes);
      return;
  }
}

json PodRequests(const json& pod) {
  json out = json::object();
  for (const auto& [name, milli] : PodRequestsMilli(pod)) out[name] = FormatMilli(milli);
  return out;
}

json GangRequests(const json& pod, int pods) {
  json out = json::object();
  for (const auto& [name, milli] : PodRequestsMilli(pod)) out[name] = FormatMilli(milli * pods);
  return out;
}

json BuildPodGroup(const api::TrainingJob& job, const json& owner, const PodSettings& settings) {
  const api::SchedulingSpec& s = job.spec.scheduling;
  // Every pod of the gang asks the same (only names and ranks differ between them).
  json min_resources =
      GangRequests(BuildPod(job, owner, /*node=*/0, /*attempt=*/0, settings), job.spec.nodes);
  json spec = {{"minMember", job.spec.nodes}, {"queue", s.queue}};
  if (!min_resources.empty()) spec["minResources"] = min_resources;
  if (!s.priority_class_name.empty()) spec["priorityClassName"] = s.priority_class_name;
  return {{"apiVersion", kVolcanoApiVersion},
          {"kind", "PodGroup"},
          {"metadata",
           {{"name", GangGroupName(job.name, UidOf(owner))},
            {"namespace", job.namespace_},
            {"labels", {{kJobNameLabel, job.name}}},
            {"ownerReferences", json::array({ControllerReference(owner)})}}},
          {"spec", spec}};
}

}  // namespace spawnpoint::op
