#include "operator/policy/admission_policy.h"

#include <algorithm>
#include <set>

#include "operator/common/wall_clock.h"

namespace spawnpoint::op {

std::vector<std::string> KueueGates(const nlohmann::json& pod) {
  std::vector<std::string> out;
  const auto spec = pod.value("spec", nlohmann::json::object());
  for (const auto& gate : spec.value("schedulingGates", nlohmann::json::array())) {
    const std::string name = gate.is_object() ? gate.value("name", "") : "";
    if (name.rfind(kKueueGatePrefix, 0) == 0) out.push_back(name);
  }
  return out;
}

AdmissionCheck CheckAdmission(const std::vector<const nlohmann::json*>& pods, int nodes,
                              const std::string& queue) {
  AdmissionCheck check;
  if (static_cast<int>(pods.size()) < nodes) return check;  // Kueue admits whole groups
  int gated = 0;
  std::set<std::string> names;
  for (const auto* pod : pods) {
    std::vector<std::string> gates = KueueGates(*pod);
    if (gates.empty()) continue;
    ++gated;
    names.insert(gates.begin(), gates.end());
  }
  if (gated == 0) {
    check.admitted = true;
    return check;
  }
  check.waiting = true;
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  check.message = "waiting for admission by Kueue in queue " + queue + ": " +
                  std::to_string(gated) + " of " + std::to_string(pods.size()) + " pod" +
                  (pods.size() == 1 ? "" : "s") + " gated (" + list + ")";
  return check;
}

namespace {

// The Queued condition of a status object, or null.
const nlohmann::json* QueuedCondition(const nlohmann::json& status) {
  if (!status.is_object()) return nullptr;
  auto it = status.find("conditions");
  if (it == status.end() || !it->is_array()) return nullptr;
  for (const auto& c : *it) {
    if (c.is_object() && c.value("type", "") == "Queued") return &c;
  }
  return nullptr;
}

}  // namespace

std::optional<Clock::Duration> AdmissionWait(const nlohmann::json& before,
                                             const nlohmann::json& after) {
  const nlohmann::json* queued = QueuedCondition(before);
  const nlohmann::json* admitted = QueuedCondition(after);
  if (!queued || !admitted || queued->value("status", "") != "True" ||
      admitted->value("status", "") != "False") {
    return std::nullopt;
  }
  std::optional<WallTime> from = ParseTime(queued->value("lastTransitionTime", ""));
  std::optional<WallTime> to = ParseTime(admitted->value("lastTransitionTime", ""));
  if (!from || !to) return std::nullopt;
  return std::max<Clock::Duration>(Clock::Duration::zero(), *to - *from);
}

}  // namespace spawnpoint::op
