// Reads the agents of every running job on an interval and keeps, per job, the latest
// status.utilisation (with the slowest rank's ratio, slowestRankRatio), stall reading
// (JobStall) and straggler reading (JobStraggler) for the reconciler, which writes them with
// the rest of the status, so there is still one status write per reconcile. After each round
// it asks for the jobs it read to be reconciled. Reads are sequential with a short timeout
// each; failures end up in utilisation.error. Thread-safe.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "api/stall_policy.h"
#include "operator/common/wall_clock.h"
#include "operator/reconciler/reconciler.h"
#include "operator/utilisation/agent_status.h"
#include "operator/utilisation/periodic_thread.h"

namespace spawnpoint::op {

// A running job and its pods that have an IP.
struct RunningJob {
  std::string ns;
  std::string name;
  std::vector<std::pair<std::string, std::string>> pods;        // name, podIP
  double straggler_ratio = api::StallPolicy{}.straggler_ratio;  // spec.stallPolicy's
  nlohmann::json straggler = nullptr;  // status.straggler: the straggler named so far, or null
  std::string token;  // the job's status token (its agents' log lines); "" for none
};

struct UtilisationOptions {
  Clock::Duration interval = std::chrono::seconds(30);
  int port = 9400;
};

class UtilisationPoller : public UtilisationSource {
 public:
  UtilisationPoller(AgentStatusReader* reader, const WallClock* clock, UtilisationOptions options,
                    std::function<std::vector<RunningJob>()> running_jobs,
                    std::function<void(const std::string& ns, const std::string& name)> on_read);
  ~UtilisationPoller() override;  // Stop()

  // Polls every interval on its own thread (sleeping on the WallClock's Clock).
  void Start();
  void Stop();
  // One round, on the caller's thread.
  void PollOnce();

  std::optional<nlohmann::json> Latest(const std::string& ns, const std::string& name) override;
  std::optional<StallReading> LatestStall(const std::string& ns, const std::string& name) override;
  std::optional<StragglerReading> LatestStraggler(const std::string& ns,
                                                  const std::string& name) override;

 private:
  AgentStatusReader* const reader_;
  const WallClock* const clock_;
  const UtilisationOptions options_;
  const std::function<std::vector<RunningJob>()> running_jobs_;
  const std::function<void(const std::string&, const std::string&)> on_read_;

  std::mutex mu_;
  std::map<std::string, nlohmann::json> latest_;              // guarded by mu_
  std::map<std::string, StallReading> latest_stall_;          // guarded by mu_
  std::map<std::string, StragglerReading> latest_straggler_;  // guarded by mu_
  PeriodicThread thread_;                                     // last: stopped first
};

}  // namespace spawnpoint::op
