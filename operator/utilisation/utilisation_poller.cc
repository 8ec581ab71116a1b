#include "operator/utilisation/utilisation_poller.h"

#include <cmath>
#include <set>

namespace spawnpoint::op {

UtilisationPoller::UtilisationPoller(
    AgentStatusReader* reader, const WallClock* clock, UtilisationOptions options,
    std::function<std::vector<RunningJob>()> running_jobs,
    std::function<void(const std::string&, const std::string&)> on_read)
    : reader_(reader),
      clock_(clock),
      options_(options),
      running_jobs_(std::move(running_jobs)),
      on_read_(std::move(on_read)) {}

UtilisationPoller::~UtilisationPoller() { Stop(); }

void UtilisationPoller::Start() {
  thread_.Start(clock_->clock(), options_.interval, [this] { PollOnce(); });
}

void UtilisationPoller::Stop() { thread_.Stop(); }

void UtilisationPoller::PollOnce() {
  std::vector<RunningJob> jobs = running_jobs_();
  std::set<std::string> live;
  for (const auto& job : jobs) {
    const std::string key = job.ns + "/" + job.name;
    live.insert(key);
    std::vector<PodReading> readings;
    for (const auto& [pod, ip] : job.pods) {
      if (thread_.Stopping()) return;
      readings.push_back({pod, reader_->Read(ip, options_.port, job.token)});
    }
    if (readings.empty()) continue;
    const std::string updated = FormatTime(clock_->Now());
    nlohmann::json utilisation = AggregateUtilisation(readings, updated);
    std::optional<nlohmann::json> stall = JobStall(readings);
    nlohmann::json previous = job.straggler;  // this poller's last verdict, else the status's
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = latest_straggler_.find(key);
      if (it != latest_straggler_.end()) previous = it->second.straggler;
    }
    std::optional<JobStragglerReading> straggler =
        JobStraggler(readings, job.straggler_ratio, previous);
    if (straggler && straggler->slowest_ratio > 0) {
      utilisation["slowestRankRatio"] = std::round(straggler->slowest_ratio * 1000.0) / 1000.0;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      latest_[key] = std::move(utilisation);
      if (stall) {
        latest_stall_[key] = StallReading{std::move(*stall), updated};
      } else {
        latest_stall_.erase(key);
      }
      if (straggler) {
        latest_straggler_[key] = StragglerReading{std::move(straggler->straggler), updated};
      } else {
        latest_straggler_.erase(key);
      }
    }
    if (on_read_) on_read_(job.ns, job.name);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = latest_.begin(); it != latest_.end();) {
    it = live.count(it->first) ? std::next(it) : latest_.erase(it);
  }
  for (auto it = latest_stall_.begin(); it != latest_stall_.end();) {
    it = live.count(it->first) ? std::next(it) : latest_stall_.erase(it);
  }
  for (auto it = latest_straggler_.begin(); it != latest_straggler_.end();) {
    it = live.count(it->first) ? std::next(it) : latest_straggler_.erase(it);
  }
}

std::optional<nlohmann::json> UtilisationPoller::Latest(const std::string& ns,
                                                        const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = latest_.find(ns + "/" + name);
  if (it == latest_.end()) return std::nullopt;
  return it->second;
}

std::optional<StallReading> UtilisationPoller::LatestStall(const std::string& ns,
                                                           const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = latest_stall_.find(ns + "/" + name);
  if (it == latest_stall_.end()) return std::nullopt;
  return it->second;
}

std::optional<StragglerReading> UtilisationPoller::LatestStraggler(const std::string& ns,
                                                                   const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = latest_straggler_.find(ns + "/" + name);
  if (it == latest_straggler_.end()) return std::nullopt;
  return it->second;
}

}  // namespace spawnpoint::op
