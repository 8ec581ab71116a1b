#include "operator/utilisation/agent_status.h"

#include <cmath>
#include <cstdint>

#include "api/straggler.h"
#include "operator/http/http_get.h"
#include "operator/policy/stall_policy.h"

namespace spawnpoint::op {

using nlohmann::json;

StatusOr<json> HttpAgentStatusReader::Read(const std::string& pod_ip, int port,
                                           const std::string& token) {
  SP_ASSIGN_OR_RETURN(HttpGetResponse response, HttpGet(pod_ip, port, "/status", timeout_, token));
  if (response.code != 200) {
    return Unavailable("GET /status answered " + std::to_string(response.code));
  }
  json doc = json::parse(response.body, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) return Internal("GET /status: the body is not a JSON object");
  return doc;
}

namespace {

// A fraction in [0, 1] from either a fraction or a percentage.
std::optional<double> Fraction(const json& v) {
  if (!v.is_number()) return std::nullopt;
  double d = v.get<double>();
  if (!std::isfinite(d) || d < 0) return std::nullopt;
  return d > 1.0 ? d / 100.0 : d;
}

}  // namespace

json AggregateUtilisation(const std::vector<PodReading>& readings, const std::string& updated) {
  double gpu_sum = 0, stall_sum = 0, samples = 0;
  int gpus = 0, ranks = 0, ok = 0;
  bool any_samples = false;
  std::string errors;
  int failed = 0;
  for (const auto& r : readings) {
    if (!r.status.ok()) {
      if (++failed <= 2) {
        errors += (errors.empty() ? "" : "; ") + r.pod + ": " + r.status.status().message();
      }
      continue;
    }
    ++ok;
    const json& doc = *r.status;
    for (const auto& g : doc.value("gpus", json::array())) {
      if (!g.is_object()) continue;
      auto u = g.contains("utilisation") ? Fraction(g["utilisation"])
                                         : Fraction(g.value("utilization", json()));
      if (u) {
        gpu_sum += *u;
        ++gpus;
      }
    }
    for (const auto& rank : doc.value("loader", json::array())) {
      if (!rank.is_object() || !rank.contains("stats") || !rank["stats"].is_object()) continue;
      if (rank.contains("up") && rank["up"].is_boolean() && !rank["up"].get<bool>()) continue;
      const json& stats = rank["stats"];
      if (auto stall = Fraction(stats.value("dataStall", json()))) {
        stall_sum += *stall;
        ++ranks;
      }
      if (stats.contains("samplesPerSecond") && stats["samplesPerSecond"].is_number()) {
        samples += stats["samplesPerSecond"].get<double>();
        any_samples = true;
      }
    }
  }
  json out = {{"pods", ok}, {"updated", updated}};
  auto round3 = [](double v) { return std::round(v * 1000.0) / 1000.0; };
  if (gpus > 0) out["gpu"] = round3(gpu_sum / gpus);
  if (ranks > 0) out["dataStall"] = round3(stall_sum / ranks);
  if (any_samples) out["samplesPerSecond"] = std::round(samples * 10.0) / 10.0;
  if (failed > 0) {
    if (failed > 2) errors += "; and " + std::to_string(failed - 2) + " more";
    out["error"] = errors;
  }
  return out;
}

std::optional<json> JobStall(const std::vector<PodReading>& readings) {
  json best;
  bool all_read = true;
  auto silent = [](const json& s) {
    return s.contains("silentSeconds") && s["silentSeconds"].is_number()
               ? s["silentSeconds"].get<double>()
               : 0.0;
  };
  auto rank = [](const json& s) {
    return s.contains("rank") && s["rank"].is_number_integer() ? s["rank"].get<int64_t>()
                                                               : INT64_MAX;
  };
  for (const auto& r : readings) {
    if (!r.status.ok()) {
      all_read = false;
      continue;
    }
    const json& doc = *r.status;
    if (!doc.contains("stall") || !doc["stall"].is_object()) continue;
    const json& stall = doc["stall"];
    if (best.is_null() || silent(stall) > silent(best) ||
        (silent(stall) == silent(best) && rank(stall) < rank(best))) {
      best = stall;
      best["pod"] = r.pod;  // the pod read; the agent may know only its host's name
    }
  }
  if (best.is_null() && !all_read) return std::nullopt;
  return best;
}

std::optional<JobStragglerReading> JobStraggler(const std::vector<PodReading>& readings,
                                                double ratio, const json& previous) {
  struct Rank {
    int64_t rank;
    std::string pod;
  };
  std::vector<Rank> ranks;
  std::vector<double> busy;
  for (const auto& r : readings) {
    if (!r.status.ok()) return std::nullopt;
    const json& doc = *r.status;
    if (!doc.contains("progress") || !doc["progress"].is_array()) continue;
    for (const auto& p : doc["progress"]) {
      if (!p.is_object() || !p.contains("rank") || !p["rank"].is_number_integer() ||
          !p.contains("busySeconds") || !p["busySeconds"].is_number()) {
        continue;
      }
      const double b = p["busySeconds"].get<double>();
      if (!std::isfinite(b) || b < 0) continue;
      ranks.push_back({p["rank"].get<int64_t>(), r.pod});
      busy.push_back(b);
    }
  }
  JobStragglerReading out;
  out.straggler = nullptr;
  std::optional<api::StragglerJudgement> j = api::JudgeSlowest(busy);
  if (!j) return out;
  out.slowest_ratio = j->ratio;
  const Rank& slowest = ranks[j->index];
  json candidate = {{"rank", slowest.rank},
                    {"pod", slowest.pod},
                    {"ratio", j->ratio},
                    {"busySeconds", j->busy_seconds},
                    {"peersBusySeconds", j->peers_busy_seconds},
                    {"windowSteps", api::kStragglerWindowSteps}};
  const bool named = SameStraggler(previous, candidate);
  if (!api::IsStraggler(*j, ratio, named)) return out;
  candidate["message"] = DescribeStraggler(candidate);
  out.straggler = std::move(candidate);
  return out;
}

}  // namespace spawnpoint::op
