#include "tests/apiserver/faults.h"

#include <chrono>
#include <ctime>

namespace spawnpoint::kubetest {
namespace {

using json = nlohmann::json;

// Compact form → JSON: values that look like numbers or booleans become such.
StatusOr<json> ParseCompact(const std::string& spec) {
  json rules = json::array();
  size_t i = 0;
  while (i <= spec.size()) {
    size_t semi = spec.find(';', i);
    if (semi == std::string::npos) semi = spec.size();
    std::string rule_text = spec.substr(i, semi - i);
    i = semi + 1;
    if (rule_text.find_first_not_of(" \t") == std::string::npos) continue;
    json rule = json::object();
    size_t j = 0;
    while (j <= rule_text.size()) {
      size_t comma = rule_text.find(',', j);
      if (comma == std::string::npos) comma = rule_text.size();
      std::string field = rule_text.substr(j, comma - j);
      j = comma + 1;
      if (field.empty()) continue;
      size_t eq = field.find('=');
      if (eq == std::string::npos) {
        return InvalidArgument("fault spec: \"" + field + "\" is not key=value");
      }
      std::string k = field.substr(0, eq), v = field.substr(eq + 1);
      if (v == "true" || v == "false") {
        rule[k] = v == "true";
      } else {
        char* end = nullptr;
        double d = std::strtod(v.c_str(), &end);
        if (!v.empty() && end && *end == '\0') {
          if (v.find('.') == std::string::npos) {
            rule[k] = static_cast<int64_t>(d);
          } else {
            rule[k] = d;
          }
        } else {
          rule[k] = v;
        }
      }
    }
    rules.push_back(rule);
  }
  return json{{"rules", rules}};
}

bool Matches(const std::string& pattern, const std::string& value) {
  return pattern == "*" || pattern == value;
}

std::string NowMillis() {
  auto now = std::chrono::system_clock::now();
  std::time_t tt = std::chrono::system_clock::to_time_t(now);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()) % 1000;
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[40];
  strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  char out[48];
  snprintf(out, sizeof(out), "%s.%03dZ", buf, static_cast<int>(ms.count()));
  return out;
}

}  // namespace

json FaultRule::ToJson() const {
  json j = {{"id", id},     {"verb", verb}, {"resource", resource}, {"namespace", ns},
            {"name", name}, {"rate", rate}, {"count", count},       {"fired", fired}};
  if (code) j["code"] = code;
  if (code == 429) j["retryAfter"] = retry_after;
  if (latency_ms) j["latencyMs"] = latency_ms;
  if (cut_after_events >= 0) {
    j["cutAfterEvents"] = cut_after_events;
    j["midLine"] = mid_line;
  }
  return j;
}

std::string FaultDecision::Describe() const {
  std::string s;
  if (code) s += "code=" + std::to_string(code);
  if (latency_ms)
    s += std::string(s.empty() ? "" : ",") + "latencyMs=" + std::to_string(latency_ms);
  if (cut_after_events >= 0) {
    s += std::string(s.empty() ? "" : ",") + "cutAfterEvents=" + std::to_string(cut_after_events) +
         (mid_line ? ",midLine" : "");
  }
  return s;
}

Status Faults::Add(const std::string& spec) {
  std::string trimmed = spec.substr(std::min(spec.size(), spec.find_first_not_of(" \t\n")));
  if (!trimmed.empty() && (trimmed[0] == '{' || trimmed[0] == '[')) {
    json j = json::parse(trimmed, nullptr, false);
    if (j.is_discarded()) return InvalidArgument("fault spec: not valid JSON");
    return AddJson(j);
  }
  auto parsed = ParseCompact(spec);
  if (!parsed.ok()) return parsed.status();
  return AddJson(*parsed);
}

Status Faults::AddJson(const json& spec) {
  json rules = spec.is_array() ? spec : spec.value("rules", json::array());
  if (!rules.is_array()) return InvalidArgument("fault spec: \"rules\" must be an array");
  std::vector<FaultRule> parsed;
  static const std::vector<std::string> kKnown = {
      "verb",           "resource", "namespace", "name", "code", "retryAfter", "latencyMs",
      "cutAfterEvents", "midLine",  "count",     "rate", "id",   "fired"};
  for (const auto& r : rules) {
    if (!r.is_object()) return InvalidArgument("fault spec: every rule must be an object");
    for (const auto& [k, v] : r.items()) {
      if (std::find(kKnown.begin(), kKnown.end(), k) == kKnown.end()) {
        return InvalidArgument("fault spec: unknown field \"" + k + "\"");
      }
    }
    FaultRule rule;
    try {
      rule.verb = r.value("verb", "*");
      rule.resource = r.value("resource", "*");
      rule.ns = r.value("namespace", "*");
      rule.name = r.value("name", "*");
      rule.code = r.value("code", 0);
      rule.retry_after = r.value("retryAfter", 1);
      rule.latency_ms = r.value("latencyMs", 0);
      rule.cut_after_events = r.value("cutAfterEvents", -1);
      rule.mid_line = r.value("midLine", false);
      rule.count = r.value("count", static_cast<int64_t>(-1));
      rule.rate = r.value("rate", 1.0);
    } catch (const json::exception& e) {
      return InvalidArgument(std::string("fault spec: a field has the wrong type: ") + e.what());
    }
    if (rule.code == 0 && rule.latency_ms == 0 && rule.cut_after_events < 0) {
      return InvalidArgument("fault spec: a rule needs code, latencyMs or cutAfterEvents");
    }
    if (rule.code != 0 && (rule.code < 400 || rule.code > 599)) {
      return InvalidArgument("fault spec: code " + std::to_string(rule.code) +
                             " is not an HTTP error code");
    }
    if (rule.rate < 0 || rule.rate > 1) return InvalidArgument("fault spec: rate must be in [0,1]");
    parsed.push_back(rule);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (spec.is_object() && spec.contains("seed") && spec["seed"].is_number_integer()) {
    rng_.seed(spec["seed"].get<uint64_t>());
  }
  for (auto& r : parsed) {
    r.id = next_id_++;
    rules_.push_back(r);
  }
  return Status::Ok();
}

void Faults::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.clear();
}

json Faults::ToJson() const {
  std::lock_guard<std::mutex> lock(mu_);
  json rules = json::array();
  for (const auto& r : rules_) rules.push_back(r.ToJson());
  return {{"rules", rules}};
}

FaultDecision Faults::Decide(const std::string& verb, const std::string& resource,
                             const std::string& ns, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  FaultDecision d;
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  for (auto& r : rules_) {
    if (!Matches(r.verb, verb) || !Matches(r.resource, resource) || !Matches(r.ns, ns) ||
        !Matches(r.name, name)) {
      continue;
    }
    if (r.count == 0) continue;
    // A rule whose action is already decided by an earlier rule does not consume a count.
    bool wants_code = r.code != 0 && d.code == 0;
    bool wants_cut = r.cut_after_events >= 0 && d.cut_after_events < 0 && verb == "watch";
    bool wants_latency = r.latency_ms > 0;
    if (!wants_code && !wants_cut && !wants_latency) continue;
    if (r.rate < 1.0 && coin(rng_) >= r.rate) continue;
    if (r.count > 0) --r.count;
    ++r.fired;
    d.rule_ids.push_back(r.id);
    if (wants_code) {
      d.code = r.code;
      d.retry_after = r.retry_after;
    }
    if (wants_cut) {
      d.cut_after_events = r.cut_after_events;
      d.mid_line = r.mid_line;
    }
    d.latency_ms += r.latency_ms;
  }
  return d;
}

json RequestRecord::ToJson() const {
  json j = {{"seq", seq},
            {"time", time},
            {"method", method},
            {"verb", verb},
            {"path", path},
            {"query", query},
            {"code", code},
            {"userAgent", user_agent},
            {"durationMs", duration_ms},
            {"user", user},
            {"allowed", allowed}};
  if (!reason.empty()) j["reason"] = reason;
  if (!resource.empty()) {
    j["group"] = group;
    j["version"] = version;
    j["resource"] = resource;
  }
  if (!subresource.empty()) j["subresource"] = subresource;
  if (!ns.empty()) j["namespace"] = ns;
  if (!name.empty()) j["name"] = name;
  if (!fault.empty()) j["fault"] = fault;
  return j;
}

void RequestLog::Add(RequestRecord record) {
  std::lock_guard<std::mutex> lock(mu_);
  record.seq = next_seq_++;
  if (record.time.empty()) record.time = NowMillis();
  records_.push_back(std::move(record));
  while (records_.size() > capacity_) records_.pop_front();
}

json RequestLog::ToJson(uint64_t since) const {
  std::lock_guard<std::mutex> lock(mu_);
  json items = json::array();
  for (const auto& r : records_) {
    if (r.seq > since) items.push_back(r.ToJson());
  }
  return {{"requests", items}};
}

void RequestLog::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  records_.clear();
}

}  // namespace spawnpoint::kubetest
