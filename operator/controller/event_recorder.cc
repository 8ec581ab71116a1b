#include "operator/controller/event_recorder.h"

#include <cstdio>

#include "operator/common/names.h"
#include "operator/common/object.h"

namespace spawnpoint::op {

using nlohmann::json;

json MakeEvent(const json& involved, EventType type, const std::string& reason,
               const std::string& message, const std::string& name, const std::string& now,
               const std::string& instance, const std::string& component) {
  // The API limits an event message to 1 KiB.
  std::string text = message.size() > 1024 ? message.substr(0, 1021) + "..." : message;
  return {{"apiVersion", "v1"},
          {"kind", "Event"},
          {"metadata", {{"name", name}, {"namespace", NamespaceOf(involved)}}},
          {"involvedObject",
           {{"apiVersion", involved.value("apiVersion", "")},
            {"kind", involved.value("kind", "")},
            {"name", NameOf(involved)},
            {"namespace", NamespaceOf(involved)},
            {"uid", UidOf(involved)},
            {"resourceVersion", Str(involved, "/metadata/resourceVersion"_json_pointer)}}},
          {"reason", reason},
          {"message", text},
          {"type", type == EventType::kWarning ? "Warning" : "Normal"},
          {"firstTimestamp", now},
          {"lastTimestamp", now},
          {"count", 1},
          {"source", {{"component", component}}},
          {"reportingComponent", "spawnpoint.dev/" + component},
          {"reportingInstance", instance}};
}

std::string EventName(const json& involved, WallTime now, uint64_t seq) {
  char suffix[48];
  snprintf(suffix, sizeof suffix, ".%llx%04llx",
           static_cast<unsigned long long>(now.time_since_epoch().count()),
           static_cast<unsigned long long>(seq & 0xffff));
  return NameOf(involved) + suffix;
}

EventRecorder::EventRecorder(kube::Client* client, const WallClock* clock, std::string instance,
                             Logger log, size_t max_pending)
    : client_(client),
      clock_(clock),
      instance_(std::move(instance)),
      log_(std::move(log)),
      max_pending_(max_pending) {
  thread_ = std::thread([this] { Loop(); });
}

EventRecorder::~EventRecorder() { Stop(); }

void EventRecorder::Record(const json& involved, EventType type, const std::string& reason,
                           const std::string& message) {
  const WallTime now = clock_->Now();
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) return;
  if (pending_.size() >= max_pending_) {
    ++dropped_;
    return;
  }
  pending_.push_back(MakeEvent(involved, type, reason, message, EventName(involved, now, seq_++),
                               FormatTime(now), instance_));
  cv_.notify_one();
}

void EventRecorder::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    pending_.clear();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int64_t EventRecorder::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

void EventRecorder::Loop() {
  while (true) {
    json event;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
      if (stop_) return;
      event = std::move(pending_.front());
      pending_.pop_front();
    }
    auto created = client_->Create(kube::resources::Events(), event);
    if (!created.ok()) {
      log_.Debug("event not recorded",
                 {{"reason", event.value("reason", "")}, {"error", created.status().message()}});
    }
  }
}

}  // namespace spawnpoint::op
