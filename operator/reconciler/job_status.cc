#include "operator/reconciler/job_status.h"

namespace spawnpoint::op {

using nlohmann::json;

JobStatus JobStatus::FromJson(const json& s) {
  JobStatus st;
  if (!s.is_object()) return st;
  st.phase = s.value("phase", "");
  for (const auto& c : s.value("conditions", json::array())) {
    if (!c.is_object()) continue;
    Condition cond;
    cond.type = c.value("type", "");
    cond.status = c.value("status", "");
    cond.observed_generation = c.value("observedGeneration", int64_t{0});
    cond.last_transition_time = c.value("lastTransitionTime", "");
    cond.reason = c.value("reason", "");
    cond.message = c.value("message", "");
    if (!cond.type.empty()) st.conditions.push_back(std::move(cond));
  }
  st.observed_generation = s.value("observedGeneration", int64_t{0});
  st.world_size = s.value("worldSize", 0);
  st.gpus = s.value("gpus", 0);
  st.restarts = s.value("restarts", 0);
  st.evictions = s.value("evictions", 0);
  if (s.contains("gangAttempt") && s["gangAttempt"].is_number_integer()) {
    st.gang_attempt = s["gangAttempt"].get<int>();
  }
  st.start_time = s.value("startTime", "");
  st.completion_time = s.value("completionTime", "");
  json nodes = s.value("nodes", json::object());
  if (nodes.is_object()) {
    st.nodes.pending = nodes.value("pending", 0);
    st.nodes.running = nodes.value("running", 0);
    st.nodes.succeeded = nodes.value("succeeded", 0);
    st.nodes.failed = nodes.value("failed", 0);
  }
  if (s.contains("lastFailure") && s["lastFailure"].is_object()) st.last_failure = s["lastFailure"];
  if (s.contains("lastEviction") && s["lastEviction"].is_object()) {
    st.last_eviction = s["lastEviction"];
  }
  if (s.contains("utilisation") && s["utilisation"].is_object()) st.utilisation = s["utilisation"];
  if (s.contains("stall") && s["stall"].is_object()) st.stall = s["stall"];
  if (s.contains("straggler") && s["straggler"].is_object()) st.straggler = s["straggler"];
  return st;
}

json JobStatus::ToJson() const {
  json s = json::object();
  if (!phase.empty()) s["phase"] = phase;
  json conds = json::array();
  for (const auto& c : conditions) {
    json j = {{"type", c.type}, {"status", c.status}};
    if (c.observed_generation > 0) j["observedGeneration"] = c.observed_generation;
    if (!c.last_transition_time.empty()) j["lastTransitionTime"] = c.last_transition_time;
    if (!c.reason.empty()) j["reason"] = c.reason;
    if (!c.message.empty()) j["message"] = c.message;
    conds.push_back(std::move(j));
  }
  if (!conds.empty()) s["conditions"] = std::move(conds);
  if (observed_generation > 0) s["observedGeneration"] = observed_generation;
  s["worldSize"] = world_size;
  s["gpus"] = gpus;
  s["restarts"] = restarts;
  if (evictions > 0) s["evictions"] = evictions;
  if (gang_attempt) s["gangAttempt"] = *gang_attempt;
  if (!start_time.empty()) s["startTime"] = start_time;
  if (!completion_time.empty()) s["completionTime"] = completion_time;
  s["nodes"] = {{"pending", nodes.pending},
                {"running", nodes.running},
                {"succeeded", nodes.succeeded},
                {"failed", nodes.failed}};
  if (last_failure.is_object()) s["lastFailure"] = last_failure;
  if (last_eviction.is_object()) s["lastEviction"] = last_eviction;
  if (utilisation.is_object()) s["utilisation"] = utilisation;
  if (stall.is_object()) s["stall"] = stall;
  if (straggler.is_object()) s["straggler"] = straggler;
  return s;
}

const Condition* JobStatus::Find(const std::string& type) const {
  for (const auto& c : conditions) {
    if (c.type == type) return &c;
  }
  return nullptr;
}

bool JobStatus::IsTrue(const std::string& type) const {
  const Condition* c = Find(type);
  return c != nullptr && c->status == "True";
}

bool JobStatus::Finished() const {
  return IsTrue(condition::kSucceeded) || IsTrue(condition::kFailed);
}

bool JobStatus::SetCondition(const std::string& type, bool status, const std::string& reason,
                             const std::string& message, int64_t generation,
                             const std::string& now) {
  const std::string value = status ? "True" : "False";
  for (auto& c : conditions) {
    if (c.type != type) continue;
    bool transition = c.status != value;
    c.status = value;
    if (transition) c.last_transition_time = now;
    c.reason = reason;
    c.message = message;
    c.observed_generation = generation;
    return transition;
  }
  conditions.push_back({type, value, generation, now, reason, message});
  return true;
}

}  // namespace spawnpoint::op
