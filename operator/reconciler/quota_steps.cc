// The reconciler's steps for a namespace's ResourceQuota (reconciler.h, quota_policy.h): before
// a whole gang is created one dry-run create asks whether the quota holds all of it; a refusal
// is the condition QuotaExceeded (and an event), looked at again after QuotaRetryDelay (and
// whenever the controller sees a ResourceQuota of the namespace change), never a failure; and a job
// the quota keeps without any pod counts toward its pending timeout from when the quota first
// refused it.
#include "operator/common/names.h"
#include "operator/policy/quota_policy.h"
#include "operator/reconciler/reconcile_context.h"

namespace spawnpoint::op {

bool Reconciler::QuotaHolds(Context& c) {
  json pod = BuildPod(c.job, c.object, /*node=*/0, c.status.restarts, options_.pods);
  Status s =
      cluster_->CheckPodCreate(QuotaProbe(pod, c.job.spec.nodes, c.job.name + "-quota-check"));
  if (!IsQuotaDenial(s)) return true;  // anything else: the creates themselves say it
  QuotaDenied(c, s.message());
  return false;
}

void Reconciler::QuotaDenied(Context& c, const std::string& api_message) {
  const std::string message = "the gang's " + std::to_string(c.job.spec.nodes) +
                              " pods do not fit the namespace's ResourceQuota (" + api_message +
                              "); tried again when a ResourceQuota there changes, and at least "
                              "every " +
                              FormatDuration(options_.quota_retry.max) + "; no restart counted";
  // Refused since the condition turned True (now, when this refusal turns it).
  const Condition* before = c.status.Find(condition::kQuotaExceeded);
  std::optional<WallTime> since;
  if (before && before->status == "True") since = ParseTime(before->last_transition_time);
  if (c.SetCondition(condition::kQuotaExceeded, true, "ExceededQuota", message)) {
    c.Event(EventType::kWarning, "QuotaExceeded", message);
    c.log.Warning("quota exceeded", {{"message", api_message}});
  }
  c.RequeueAfter(
      QuotaRetryDelay(since ? c.now - *since : Clock::Duration::zero(), options_.quota_retry));
}

void Reconciler::QuotaPendingStep(Context& c) {
  const Condition* quota = c.status.Find(condition::kQuotaExceeded);
  if (!c.CurrentPods().empty() || !quota || quota->status != "True") return;
  std::optional<WallTime> since = ParseTime(quota->last_transition_time);
  if (!since) return;
  if (c.now < *since + options_.pending_timeout) {
    c.RequeueAfter(*since + options_.pending_timeout - c.now);
    return;
  }
  c.pending_message = "no pod of attempt " + std::to_string(c.status.restarts) +
                      " could be created for " + FormatDuration(c.now - *since) + ": " +
                      quota->message;
}

}  // namespace spawnpoint::op
