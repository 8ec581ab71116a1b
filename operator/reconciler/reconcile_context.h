// The state of one reconcile (reconciler.h): the job and its children as read, the status
// being computed, and what the steps decided (events, requeue, the first error). Internal to
// operator/reconciler/; one reconcile's own, never shared between threads.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "api/training_job.h"
#include "operator/common/object.h"
#include "operator/reconciler/job_status.h"
#include "operator/reconciler/reconciler.h"

namespace spawnpoint::op {

using nlohmann::json;

struct Reconciler::Context {
  json object;  // the job as read from the cache
  api::TrainingJob job;
  JobStatus status;  // being computed; starts as read
  json old_status;   // as read, normalised through JobStatus
  std::vector<json> pods;
  std::optional<json> service;
  std::set<std::string> deleted;  // pods deleted by this reconcile
  WallTime now;
  std::string now_text;
  int64_t generation = 0;
  Logger log;
  std::string pending_message;  // a pod stuck Pending, for the Running condition
  // Events about status transitions, recorded once the status write succeeded.
  std::vector<std::tuple<EventType, std::string, std::string>> events;
  std::optional<Clock::Duration> requeue_after;
  Status error;
  // The job is gone, or could not be confirmed live: end without a status write.
  bool abandoned = false;
  std::optional<bool> live;  // JobIsLive, asked at most once
  // restartPolicy.mode InPlace with several nodes: the agents restart the gang in place.
  bool in_place = false;
  // In place: what the agents said last (GangSource), and whether this reconcile recorded an
  // in-place restart (its Restarting phase is written before the gang is called running).
  std::optional<GangReading> gang;
  bool restarted_in_place = false;
  bool job_secret_ready = false;  // the job's Secret exists (created by this reconcile or before)
  bool pod_group_ready = false;   // gang volcano: the PodGroup exists (created now or before)

  void RequeueAfter(Clock::Duration d) {
    if (d < Clock::Duration::zero()) d = Clock::Duration::zero();
    if (!requeue_after || d < *requeue_after) requeue_after = d;
  }
  void Event(EventType type, std::string reason, std::string message) {
    events.emplace_back(type, std::move(reason), std::move(message));
  }
  void KeepError(const Status& s) {
    if (error.ok() && !s.ok()) error = s;
  }
  // Whether `pod` belongs to the current gang: the attempt in status.restarts, or in place
  // any attempt since the gang was created (the pods stay across in-place restarts).
  bool OfCurrentGang(const json& pod) const {
    return in_place ? AttemptOf(pod) >= status.GangAttempt() : AttemptOf(pod) == status.restarts;
  }
  // Pods of the current gang that are not going away.
  std::vector<const json*> CurrentPods() const {
    std::vector<const json*> out;
    for (const auto& p : pods) {
      if (!OfCurrentGang(p) || IsTerminating(p) || deleted.count(NameOf(p))) continue;
      out.push_back(&p);
    }
    return out;
  }
  bool SetCondition(const char* type, bool value, const std::string& reason,
                    const std::string& message) {
    return status.SetCondition(type, value, reason, message, generation, now_text);
  }
  // Sets a condition to False only if it was ever set (no clutter of never-true conditions).
  void ClearCondition(const char* type, const std::string& reason, const std::string& message) {
    if (status.Find(type) != nullptr) SetCondition(type, false, reason, message);
  }
};

}  // namespace spawnpoint::op
