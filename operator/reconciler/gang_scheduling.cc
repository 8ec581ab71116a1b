// The reconciler's steps for a gang scheduler (reconciler.h, pod_group.h): under Volcano the
// job's PodGroup exists before any of its pods is created, stays while the job runs (a
// recreated gang and a lost pod's replacement join it again), and goes when the job stops
// needing the cluster (Succeeded, Failed, Suspended): an empty PodGroup that Volcano takes
// back into its queue (phase Inqueue) would hold its minResources from other gangs. Under Kueue
// a job whose pods wait, gated, for admission is Queued (admission_policy.h), with Kueue's
// reason from its Workload; a gang Kueue evicts is recreated without spending a restart; a
// replacement pod never reuses a name Kueue still holds and waits until Kueue lets go of its
// predecessor; a failed job's group is ended so that Kueue frees its quota (kueue_pods.h).
#include <algorithm>

#include "operator/common/names.h"
#include "operator/common/object.h"
#include "operator/policy/admission_policy.h"
#include "operator/policy/kueue_pods.h"
#include "operator/reconciler/pod_group.h"
#include "operator/reconciler/reconcile_context.h"

namespace spawnpoint::op {
namespace {

bool PodsReleased(const std::string& phase) {
  return phase == phase::kSucceeded || phase == phase::kFailed || phase == phase::kSuspended;
}

bool UsesKueue(const api::TrainingJob& job) {
  return job.spec.scheduling.gang == api::GangScheduler::kKueue;
}

// While the job waits for admission, Kueue's own word is read again this often (Workloads are
// not watched).
constexpr auto kKueueReasonRefresh = std::chrono::seconds(10);

bool HasFinalizer(const json& object, const std::string& name) {
  const json meta = object.value("metadata", json::object());
  for (const auto& f : meta.value("finalizers", json::array())) {
    if (f.is_string() && f.get<std::string>() == name) return true;
  }
  return false;
}

}  // namespace

bool Reconciler::EnsurePodGroup(Context& c) {
  if (!UsesVolcano(c.job) || c.pod_group_ready) return true;
  json group = BuildPodGroup(c.job, c.object, options_.pods);
  StatusOr<json> created = cluster_->CreatePodGroup(group);
  if (!created.ok() && created.status().code() != StatusCode::kAlreadyExists) {
    c.KeepError(created.status());
    return false;  // no pod before its group: Volcano would schedule it alone
  }
  if (created.ok()) {
    c.log.Info("created PodGroup", {{"podGroup", NameOf(group)},
                                    {"minMember", c.job.spec.nodes},
                                    {"queue", c.job.spec.scheduling.queue}});
  }
  c.pod_group_ready = true;
  return true;
}

bool Reconciler::ReleasePodGroup(Context& c) {
  if (!UsesVolcano(c.job) || !PodsReleased(c.status.phase) ||
      PodsReleased(c.old_status.value("phase", ""))) {
    return true;
  }
  const std::string name = GangGroupName(c.job.name, UidOf(c.object));
  Status s = cluster_->DeletePodGroup(c.job.namespace_, name);
  if (!s.ok() && s.code() != StatusCode::kNotFound) {
    c.KeepError(s);
    return false;
  }
  if (s.ok()) c.log.Info("deleted PodGroup", {{"podGroup", name}, {"phase", c.status.phase}});
  return true;
}

void Reconciler::KueueEvictionStep(Context& c) {
  if (!UsesKueue(c.job)) return;
  const json& last = c.status.last_eviction;
  const std::string seen = last.is_object() ? last.value("at", "") : "";
  std::optional<KueueStop> stop;
  for (const auto& pod : c.pods) {
    if (!c.OfCurrentGang(pod)) continue;
    std::optional<KueueStop> s = KueueStopped(pod);
    if (!s || s->at <= seen) continue;  // recorded already (the pods stay while Kueue holds them)
    if (!stop || s->at > stop->at) stop = s;
  }
  if (!stop) return;
  c.status.evictions += 1;
  c.status.last_eviction = {{"reason", stop->reason},
                            {"message", stop->message},
                            {"at", stop->at},
                            {"attempt", c.status.restarts},
                            {"time", FormatTime(c.now, /*millis=*/true)}};
  const std::string message =
      "Kueue evicted the gang (" + stop->reason + "): " + stop->message +
      "; its pods are recreated and wait for admission again (not a restart: " +
      std::to_string(c.status.restarts) + " of " +
      std::to_string(c.job.spec.restart_policy.max_restarts) + " used)";
  c.status.phase = phase::kQueued;
  c.SetCondition(condition::kQueued, true, stop->reason, message);
  c.ClearCondition(condition::kRunning, stop->reason, message);
  c.Event(EventType::kWarning, stop->reason == "Preempted" ? "Preempted" : "Evicted", message);
  c.log.Warning("evicted by Kueue", {{"reason", stop->reason},
                                     {"message", stop->message},
                                     {"evictions", c.status.evictions},
                                     {"restarts", c.status.restarts}});
  for (const auto& pod : c.pods) {  // Kueue deletes them too
    if (c.OfCurrentGang(pod) && !IsTerminating(pod)) DeletePod(c, pod, "evicted by Kueue");
  }
}

bool Reconciler::KueueNodeCovered(const Context& c, int node) const {
  const std::vector<const json*> pods = c.CurrentPods();
  return std::any_of(pods.begin(), pods.end(),
                     [node](const json* pod) { return NodeRankOf(*pod) == node; });
}

bool Reconciler::KueueGroupEnded(Context& c) {
  if (!c.CurrentPods().empty()) return false;  // not a whole new gang
  StatusOr<json> workload =
      cluster_->GetKueueWorkload(c.job.namespace_, GangGroupName(c.job.name, UidOf(c.object)));
  // None (or unreadable: Kueue then says so itself).
  if (!workload.ok() || !KueueWorkloadFinished(*workload)) return false;
  c.log.Info("waiting for Kueue's finished Workload of the job's last gang to go",
             {{"workload", NameOf(*workload)}});
  return true;
}

std::string Reconciler::KueueNewPodName(const Context& c, int node) const {
  for (const auto& pod : c.pods) {
    if (NodeRankOf(pod) != node) continue;
    // Deleted by this reconcile: the view still shows it as it was.
    const bool going = IsTerminating(pod) || c.deleted.count(NameOf(pod));
    if (KueueCountsActive(pod) && (going || !c.OfCurrentGang(pod))) return "";
    // Ended only just now: Kueue may not have seen it yet.
    std::optional<WallTime> ended = ParseTime(KueueEndedAt(pod));
    if (!KueueCountsActive(pod) && ended && c.now < *ended + kKueueSettle) return "";
  }
  return KueuePodName(c.job.name, node, c.pods);
}

bool Reconciler::ReleaseKueueGroup(Context& c) {
  const bool ends = c.status.phase == phase::kFailed || c.status.phase == phase::kSuspended;
  if (!UsesKueue(c.job) || !ends || PodsReleased(c.old_status.value("phase", ""))) {
    return true;
  }
  int marked = 0;
  for (const auto& pod : c.pods) {
    if (!HasFinalizer(pod, kKueueFinalizer) ||
        AnnotationOf(pod, kKueueRetriableAnnotation) == "false") {
      continue;
    }
    Status s = cluster_->AnnotatePod(c.job.namespace_, NameOf(pod), UidOf(pod),
                                     {{kKueueRetriableAnnotation, "false"}});
    if (s.code() == StatusCode::kForbidden) {
      // Not granted (the chart's scheduling.kueue): the status still says Failed; Kueue keeps
      // the quota until the pods are deleted.
      c.log.Warning(
          "could not end the Kueue group: its quota stays reserved until the job's "
          "pods are deleted (grant patch on pods: the chart's scheduling.kueue)",
          {{"error", s.message()}});
      return true;
    }
    if (!s.ok() && s.code() != StatusCode::kNotFound && s.code() != StatusCode::kConflict) {
      c.KeepError(s);
      return false;
    }
    if (s.ok()) ++marked;
  }
  if (marked > 0) {
    c.log.Info("ended the Kueue group: its quota is freed once no pod runs",
               {{"pods", marked}, {"group", GangGroupName(c.job.name, UidOf(c.object))}});
  }
  return true;
}

bool Reconciler::AdmissionStep(Context& c) {
  if (!UsesKueue(c.job)) return false;
  AdmissionCheck check =
      CheckAdmission(c.CurrentPods(), c.job.spec.nodes, c.job.spec.scheduling.queue);
  if (!check.waiting) {
    if (!c.status.IsTrue(condition::kQueued)) return false;
    if (!check.admitted) {
      // A queued group not whole in this view (a pod not yet in the cache, or replaced) has
      // not been admitted: it stays Queued until the view says which.
      c.status.phase = phase::kQueued;
      return true;
    }
    const std::string message = "admitted by Kueue in queue " + c.job.spec.scheduling.queue;
    c.SetCondition(condition::kQueued, false, "Admitted", message);
    c.Event(EventType::kNormal, "Admitted", message);
    return false;
  }
  c.status.phase = phase::kQueued;
  // Kueue's own word on why (no quota, ...), from the group's Workload.
  std::string message = check.message;
  StatusOr<json> workload =
      cluster_->GetKueueWorkload(c.job.namespace_, GangGroupName(c.job.name, UidOf(c.object)));
  if (workload.ok()) {
    const std::string why = KueueWaitingReason(*workload);
    if (!why.empty()) message += "; Kueue: " + why;
  } else if (workload.status().code() != StatusCode::kNotFound) {
    c.log.Debug("could not read the Kueue Workload", {{"error", workload.status().message()}});
  }
  c.RequeueAfter(kKueueReasonRefresh);
  // An evicted gang waiting again keeps the eviction's reason.
  std::string reason = "WaitingForAdmission";
  const Condition* queued = c.status.Find(condition::kQueued);
  const json& evicted = c.status.last_eviction;
  if (queued && queued->status == "True" && evicted.is_object() &&
      queued->reason == evicted.value("reason", "")) {
    reason = queued->reason;
    message = "evicted by Kueue (" + reason + ": " + evicted.value("message", "") + "), " + message;
  }
  if (c.SetCondition(condition::kQueued, true, reason, message)) {
    c.Event(EventType::kNormal, "Queued", message);
  }
  c.ClearCondition(condition::kRunning, reason, message);
  return true;
}

}  // namespace spawnpoint::op
