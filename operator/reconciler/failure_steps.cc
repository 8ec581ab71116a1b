// The reconciler's failure and restart steps (reconciler.h): a failed pod of the attempt ends it
// (the first failure named, the collective errors of its peers taken as its consequences), and
// the restart policy restarts the gang after its backoff or fails the job. In place the agents
// restart the gang themselves (in_place.cc), and ActOnFailure decides only when they give up.
#include "operator/common/names.h"
#include "operator/common/object.h"
#include "operator/policy/failure_policy.h"
#include "operator/policy/restart_policy.h"
#include "operator/policy/stall_policy.h"
#include "operator/reconciler/reconcile_context.h"

namespace spawnpoint::op {
namespace {

// How long after a peer's collective failure the pod of the rank that died may take to end
// (its agent stops the rank's pools and writes its termination message first).
constexpr auto kCollectiveSettle = std::chrono::seconds(10);

}  // namespace

bool Reconciler::FailureStep(Context& c) {
  std::vector<PodFailure> failures;
  const std::string trainer = TrainerContainerName(c.job);
  bool others_run = false;
  for (const json* pod : c.CurrentPods()) {
    const std::string phase = PodPhase(*pod);
    others_run = others_run || (phase != "Failed" && phase != "Succeeded");
    if (phase != "Failed") continue;
    failures.push_back(ClassifyPodFailure(*pod, trainer, c.job.spec.restart_policy));
  }
  if (failures.empty()) return false;
  // A collective timeout or error is what a dying rank's peers see, and a peer's pod often
  // ends first (its agent reports at once; the dying rank's agent may still be stopping):
  // while every failure is such a one and another pod still runs, wait a moment after the
  // first for the failure they are the consequences of (FirstFailure then names it).
  if (others_run && std::all_of(failures.begin(), failures.end(), [](const PodFailure& f) {
        return f.reason == "CollectiveTimeout" || f.reason == "CollectiveError";
      })) {
    std::optional<WallTime> first;
    for (const PodFailure& f : failures) {
      std::optional<WallTime> at = ParseTime(f.failed_at.empty() ? f.finished_at : f.failed_at);
      if (at && (!first || *at < *first)) first = at;
    }
    if (first && c.now < *first + kCollectiveSettle) {
      c.RequeueAfter(*first + kCollectiveSettle - c.now);
      return true;
    }
  }
  ActOnFailure(c, FirstFailure(failures));
  return true;
}

void Reconciler::ActOnFailure(Context& c, const PodFailure& first, bool may_restart,
                              const std::string& verdict, const std::string& verdict_message) {
  const api::RestartPolicy& policy = c.job.spec.restart_policy;
  // The restart schedule: at once after a healthy run, backing off while attempts keep
  // failing quickly (the count of the previous failure is in status.lastFailure).
  const Clock::Duration ran = AttemptRan(c.CurrentPods(), c.now);
  int quick_before = 0;
  if (c.status.last_failure.is_object()) {
    const json& previous = c.status.last_failure;
    quick_before = previous.contains("quickFailures") && previous["quickFailures"].is_number()
                       ? previous["quickFailures"].get<int>()
                       : c.status.restarts;  // written before the schedule: as many as restarts
  }
  const int quick = api::QuickFailuresAfter(policy, quick_before, ran);
  RestartDecision decision = DecideRestart(first, policy, c.status.restarts, quick);
  if (!may_restart && decision.restart) {  // the agents gave up: their verdict stands
    decision = {false, verdict, first.Describe() + " (" + verdict_message + ")"};
  }
  json last = first.ToJson();
  last["attempt"] = c.status.restarts;
  last["time"] = FormatTime(c.now, /*millis=*/true);
  last["ranSeconds"] = std::chrono::duration_cast<std::chrono::seconds>(ran).count();
  last["quickFailures"] = quick;
  c.status.last_failure = last;
  c.Event(EventType::kWarning, "NodeFailed", first.Describe());
  c.log.Warning("attempt failed", {{"attempt", c.status.restarts},
                                   {"node", first.node},
                                   {"rank", first.rank},
                                   {"exitCode", first.exit_code},
                                   {"reason", first.reason},
                                   {"retryable", first.retryable ? "true" : "false"},
                                   {"decision", decision.restart ? "restart" : "fail"}});
  ApplyStall(c, DecideStallAfterFailure(c.status.stall, first, decision.restart, c.status.restarts,
                                        c.now_text));
  if (!decision.restart) {
    Fail(c, decision.reason, decision.message);
    return;
  }
  c.status.restarts += 1;
  if (c.in_place) c.status.gang_attempt = c.status.restarts;  // a new gang of pods
  c.status.phase = phase::kRestarting;
  c.SetCondition(condition::kRestarting, true, decision.reason, decision.message);
  c.ClearCondition(condition::kRunning, "GangFailed", first.Describe());
  c.Event(EventType::kWarning, "Restarting", decision.message);
  c.RequeueAfter(RestartBackoff(policy, quick));
}

// After a failure the next gang waits out the backoff (none after a healthy run), counted
// from lastFailure.time.
bool Reconciler::BackoffElapsed(Context& c) {
  if (c.status.restarts == 0) return true;
  // Restarts made in place: the agents waited out the schedule; a lost pod comes back at once.
  if (c.in_place && c.status.GangAttempt() < c.status.restarts) return true;
  for (const auto& pod : c.pods) {
    if (AttemptOf(pod) == c.status.restarts) return true;  // this attempt is already under way
  }
  std::optional<WallTime> failed_at;
  int quick = c.status.restarts + 1;  // a failure recorded before the schedule: the old doubling
  if (c.status.last_failure.is_object()) {
    const json& last = c.status.last_failure;
    failed_at = ParseTime(last.value("time", ""));
    if (last.contains("quickFailures") && last["quickFailures"].is_number()) {
      quick = last["quickFailures"].get<int>();
    }
  }
  Clock::Duration wait = RestartWaitRemaining(c.job.spec.restart_policy, quick, failed_at, c.now);
  if (wait <= Clock::Duration::zero()) return true;
  c.status.phase = phase::kRestarting;
  c.RequeueAfter(wait);
  return false;
}

}  // namespace spawnpoint::op
