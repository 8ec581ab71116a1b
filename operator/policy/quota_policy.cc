#include "operator/policy/quota_policy.h"

#include <algorithm>

#include "operator/common/object.h"
#include "operator/reconciler/pod_group.h"

namespace spawnpoint::op {

using nlohmann::json;

bool IsQuotaDenial(const Status& s) {
  return s.code() == StatusCode::kForbidden &&
         s.message().find("exceeded quota") != std::string::npos;
}

Clock::Duration QuotaRetryDelay(Clock::Duration refused_for, const QuotaRetry& retry) {
  return std::clamp<Clock::Duration>(refused_for / 4, retry.first, retry.max);
}

json QuotaProbe(const json& pod, int pods, const std::string& name) {
  const json spec = pod.value("spec", json::object());
  const json requests = GangRequests(pod, pods);
  std::string image = "quota-check";
  for (const auto& c : spec.value("containers", json::array())) {
    if (c.is_object() && c.contains("image") && c["image"].is_string()) {
      image = c["image"];
      break;
    }
  }
  json container = {{"name", "quota-check"}, {"image", image}};
  if (!requests.empty()) container["resources"] = {{"requests", requests}, {"limits", requests}};
  json probe_spec = {{"restartPolicy", "Never"}, {"containers", json::array({container})}};
  if (spec.contains("priorityClassName"))
    probe_spec["priorityClassName"] = spec["priorityClassName"];
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", NamespaceOf(pod)}}},
          {"spec", probe_spec}};
}

}  // namespace spawnpoint::op
