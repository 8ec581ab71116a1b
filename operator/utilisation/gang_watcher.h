// Watches the gangs that restart in place (restartPolicy.mode InPlace, several nodes): every
// `interval` it reads, for each such job that is Running or Restarting, the /status document
// of its current pods' agents in node order (node 0's first: the coordinator's) and keeps the
// first one read as the job's GangReading (restarts, phase, lastFailure; reconciler.h). When a
// reading differs from the job's last one, the job is enqueued (on_change), so an in-place
// restart reaches status about `interval` plus one reconcile after the agents decided it.
// No API credentials in the training pods: the operator reads the agents over HTTP, as the
// utilisation poller does. Reads are sequential, each bounded by the reader's timeout; a
// document of another job (a shared address) is ignored. Thread-safe.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "operator/common/wall_clock.h"
#include "operator/reconciler/reconciler.h"
#include "operator/utilisation/agent_status.h"
#include "operator/utilisation/periodic_thread.h"

namespace spawnpoint::op {

// A job whose gang restarts in place and its current pods that have an IP, in node order.
struct GangJob {
  std::string ns;
  std::string name;
  std::vector<std::pair<std::string, std::string>> pods;  // name, podIP
  std::string token;  // the job's status token (its agents' log lines); "" for none
};

struct GangWatchOptions {
  Clock::Duration interval = std::chrono::milliseconds(500);
  int port = 9400;  // the agents' status port
};

// The reading `document` (an agent's /status) gives for job ns/name read from `pod` at
// `updated`; nullopt when it is not that job's document.
std::optional<GangReading> ReadGang(const nlohmann::json& document, const std::string& ns,
                                    const std::string& name, const std::string& pod,
                                    const std::string& updated);

class GangWatcher : public GangSource {
 public:
  GangWatcher(AgentStatusReader* reader, const WallClock* clock, GangWatchOptions options,
              std::function<std::vector<GangJob>()> jobs,
              std::function<void(const std::string& ns, const std::string& name)> on_change);
  ~GangWatcher() override;  // Stop()

  // Reads every interval on its own thread (sleeping on the WallClock's Clock).
  void Start();
  void Stop();
  // One round, on the caller's thread.
  void PollOnce();

  std::optional<GangReading> LatestGang(const std::string& ns, const std::string& name) override;

 private:
  AgentStatusReader* const reader_;
  const WallClock* const clock_;
  const GangWatchOptions options_;
  const std::function<std::vector<GangJob>()> jobs_;
  const std::function<void(const std::string&, const std::string&)> on_change_;

  std::mutex mu_;
  std::map<std::string, GangReading> latest_;  // guarded by mu_; by "ns/name"
  PeriodicThread thread_;                      // last: stopped first
};

}  // namespace spawnpoint::op
