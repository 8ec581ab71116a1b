// Records core/v1 Events about TrainingJobs (what `kubectl describe tj` shows) without ever
// blocking a reconcile: Record() queues, a background thread creates the Event objects
// through the client (which retries 429/5xx). A full queue drops the newest event and
// counts it. Names are unique (<job>.<hex wall nanoseconds><seq>). Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "operator/common/log.h"
#include "operator/common/names.h"
#include "operator/common/wall_clock.h"
#include "operator/kube/client.h"
#include "operator/reconciler/cluster.h"

namespace spawnpoint::op {

// The Event object (pure; for tests). `component` reports it (source.component and
// reportingComponent spawnpoint.dev/<component>).
nlohmann::json MakeEvent(const nlohmann::json& involved, EventType type, const std::string& reason,
                         const std::string& message, const std::string& name,
                         const std::string& now, const std::string& instance,
                         const std::string& component = kComponent);
// A unique Event name: <involved's name>.<hex wall nanoseconds><hex seq, 4 digits>.
std::string EventName(const nlohmann::json& involved, WallTime now, uint64_t seq);

class EventRecorder {
 public:
  EventRecorder(kube::Client* client, const WallClock* clock, std::string instance, Logger log,
                size_t max_pending = 2000);
  ~EventRecorder();  // Stop(): pending events are dropped

  void Record(const nlohmann::json& involved, EventType type, const std::string& reason,
              const std::string& message);
  void Stop();
  int64_t dropped() const;

 private:
  void Loop();

  kube::Client* const client_;
  const WallClock* const clock_;
  const std::string instance_;
  const Logger log_;
  const size_t max_pending_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<nlohmann::json> pending_;
  bool stop_ = false;
  uint64_t seq_ = 0;
  int64_t dropped_ = 0;
  std::thread thread_;
};

}  // namespace spawnpoint::op
