// The reconciler's steps for a gang scheduler (reconciler.h, pod_group.h): under Volcano the
// job's PodGroup exists before any of its pods is created, stays while the job runs (a
// recreated gang and a lost pod's replacement join it again), and goes when the job stops
// needing the cluster (Succeeded, Failed, Suspended): an empty PodGroup that Volcano takes
// back into its queue (phase Inqueue) would hold its minResources from other gangs. Under Kueue
// a job whose pods wait, gated, for admission is Queued (admission_policy.h).
#include "operator/common/names.h"
#include "operator/common/object.h"
#include "operator/policy/admission_policy.h"
#include "operator/reconciler/pod_group.h"
#include "operator/reconciler/reconcile_context.h"

namespace spawnpoint::op {
namespace {

bool PodsReleased(const std::string& phase) {
  return phase == phase::kSucceeded || phase == phase::kFailed || phase == phase::kSuspended;
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

bool Reconciler::AdmissionStep(Context& c) {
  if (c.job.spec.scheduling.gang != api::GangScheduler::kKueue) return false;
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
  if (c.SetCondition(condition::kQueued, true, "WaitingForAdmission", check.message)) {
    c.Event(EventType::kNormal, "Queued", check.message);
  }
  c.ClearCondition(condition::kRunning, "WaitingForAdmission", check.message);
  return true;
}

}  // namespace spawnpoint::op
