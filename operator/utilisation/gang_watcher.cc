#include "operator/utilisation/gang_watcher.h"

#include <set>

namespace spawnpoint::op {

using nlohmann::json;

std::optional<GangReading> ReadGang(const json& document, const std::string& ns,
                                    const std::string& name, const std::string& pod,
                                    const std::string& updated) {
  if (!document.is_object()) return std::nullopt;
  auto text = [&](const char* key) {
    return document.contains(key) && document[key].is_string() ? document[key].get<std::string>()
                                                               : std::string();
  };
  if (text("job") != name || (!text("namespace").empty() && text("namespace") != ns)) {
    return std::nullopt;
  }
  if (!document.contains("restarts") || !document["restarts"].is_number_integer()) {
    return std::nullopt;
  }
  GangReading r;
  r.restarts = document["restarts"].get<int>();
  r.phase = text("phase");
  r.last_failure = document.contains("lastFailure") && document["lastFailure"].is_object()
                       ? document["lastFailure"]
                       : json();
  r.pod = pod;
  r.updated = updated;
  return r;
}

GangWatcher::GangWatcher(AgentStatusReader* reader, const WallClock* clock,
                         GangWatchOptions options, std::function<std::vector<GangJob>()> jobs,
                         std::function<void(const std::string&, const std::string&)> on_change)
    : reader_(reader),
      clock_(clock),
      options_(options),
      jobs_(std::move(jobs)),
      on_change_(std::move(on_change)) {}

GangWatcher::~GangWatcher() { Stop(); }

void GangWatcher::Start() {
  thread_.Start(clock_->clock(), options_.interval, [this] { PollOnce(); });
}

void GangWatcher::Stop() { thread_.Stop(); }

void GangWatcher::PollOnce() {
  std::set<std::string> live;
  for (const GangJob& job : jobs_()) {
    const std::string key = job.ns + "/" + job.name;
    live.insert(key);
    std::optional<GangReading> reading;
    for (const auto& [pod, ip] : job.pods) {
      if (thread_.Stopping()) return;
      StatusOr<json> document = reader_->Read(ip, options_.port, job.token);
      if (!document.ok()) continue;
      reading =
          ReadGang(*document, job.ns, job.name, pod, FormatTime(clock_->Now(), /*millis=*/true));
      if (reading) break;
    }
    if (!reading) continue;  // the last reading stands until one succeeds
    bool changed = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = latest_.find(key);
      changed = it == latest_.end() || it->second.restarts != reading->restarts ||
                it->second.phase != reading->phase ||
                it->second.last_failure != reading->last_failure || it->second.pod != reading->pod;
      latest_[key] = *reading;
    }
    if (changed && on_change_) on_change_(job.ns, job.name);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = latest_.begin(); it != latest_.end();) {
    it = live.count(it->first) ? std::next(it) : latest_.erase(it);
  }
}

std::optional<GangReading> GangWatcher::LatestGang(const std::string& ns, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = latest_.find(ns + "/" + name);
  if (it == latest_.end()) return std::nullopt;
  return it->second;
}

}  // namespace spawnpoint::op
