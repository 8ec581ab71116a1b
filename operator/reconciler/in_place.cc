// The reconciler's steps for restartPolicy.mode InPlace (reconciler.h): the pods' agents
// restart the gang themselves; the operator mirrors what they did, recreates a lost pod alone
// and ends the job when they give up.
#include <algorithm>

#include "operator/common/names.h"
#include "operator/common/object.h"
#include "operator/policy/failure_policy.h"
#include "operator/policy/kueue_pods.h"
#include "operator/policy/pending_policy.h"
#include "operator/policy/restart_policy.h"
#include "operator/policy/stall_policy.h"
#include "operator/reconciler/reconcile_context.h"

namespace spawnpoint::op {
namespace {

// After an in-place restart is written (phase Restarting), look again this soon.
constexpr Clock::Duration kInPlaceRecheck = std::chrono::milliseconds(250);
// A reading of the attempt in which a pod was lost says the gang runs again only when it was
// taken this long after the loss was recorded: by then the agents have seen the loss (the
// coordinator weighs an attempt's failures for a second before it decides).
constexpr auto kLossSettle = std::chrono::seconds(2);

}  // namespace

bool Reconciler::InPlaceFailureStep(Context& c) {
  // A pod of a gang that ran, being deleted by someone else (kubectl delete pod, an eviction, a
  // drained node): its loss is recorded now, while the view still shows which pod it is. Once
  // it is gone the job would read Pending and its replacement come back unexplained.
  const bool ran = c.status.phase == phase::kRunning || c.status.phase == phase::kRestarting;
  for (const auto& pod : c.pods) {
    if (!ran || c.restarted_in_place || !IsTerminating(pod) || c.deleted.count(NameOf(pod)) ||
        AttemptOf(pod) < c.status.GangAttempt() || PodPhase(pod) == "Succeeded" ||
        KueueStopped(pod)) {
      continue;
    }
    PodFailure deleted;
    deleted.node = NodeRankOf(pod);
    deleted.pod = NameOf(pod);
    deleted.reason = "PodDeleted";
    deleted.message = "the pod was deleted (by a user, an eviction or a drained node)";
    deleted.retryable = true;
    RecordLoss(c, deleted);
  }
  const std::string trainer = TrainerContainerName(c.job);
  const api::RestartPolicy& policy = c.job.spec.restart_policy;
  std::optional<std::pair<int, GangVerdict>> verdict;  // the lowest node's pod's
  std::optional<PodFailure> ended;
  std::vector<PodFailure> fatal;
  std::vector<std::pair<const json*, PodFailure>> lost;
  for (const json* pod : c.CurrentPods()) {
    if (PodPhase(*pod) != "Failed") continue;
    PodFailure f = ClassifyPodFailure(*pod, trainer, policy);
    if (std::optional<GangVerdict> v = GangVerdictOf(*pod, trainer)) {
      // Every agent exits with the gang's verdict; each states the failure of the node it
      // names, not its own.
      if (!verdict || NodeRankOf(*pod) < verdict->first) {
        f.node = v->node;
        f.pod = PodName(c.job.name, v->node);
        verdict = {NodeRankOf(*pod), *v};
        ended = f;
      }
    } else if (f.retryable) {
      lost.emplace_back(pod, f);  // evicted, its node lost, the agent killed: comes back alone
    } else {
      fatal.push_back(f);  // the agent could not run (bad input, a refused token, ...)
    }
  }
  for (const auto& [pod, f] : lost) {
    RecordLoss(c, f);
    DeletePod(c, *pod, "lost (" + f.reason + "): recreated alone");
  }
  if (verdict) {
    // The agents' count wins when it is ahead (the operator may not have read the last one);
    // each restart it had not read is an event all the same, as GangStep makes them.
    const int before = c.status.restarts;
    c.status.restarts = std::max(before, verdict->second.restarts);
    for (int n = before + 1; n <= c.status.restarts; ++n) {
      c.Event(EventType::kWarning, "Restarting",
              "restart " + std::to_string(n) + " of " +
                  std::to_string(c.job.spec.restart_policy.max_restarts) + " in place");
    }
    // NodeLost: a node never rejoined; GangStartTimeout: the gang's nodes never all met. The
    // gang is recreated as in Recreate mode, if the budget allows. Any other verdict ends the
    // job.
    const std::string& name = verdict->second.verdict;
    const bool recreate = name == "NodeLost" || name == "GangStartTimeout";
    if (recreate) ended->retryable = true;
    if (name == "GangStartTimeout") {
      // Which pods never ran says why: unschedulable, an image that does not pull, ...
      const std::string missing = GangPodsNotRunning(c.CurrentPods(), c.job.spec.nodes, c.job.name);
      ended->reason = name;
      ended->message = verdict->second.message +
                       (missing.empty() ? "; every pod was running: the agents could not reach "
                                          "node 0's on the gang port"
                                        : "; not running: " + missing);
    }
    ActOnFailure(c, *ended, recreate, name, verdict->second.message);
    return true;
  }
  if (!fatal.empty()) {
    ActOnFailure(c, FirstFailure(fatal));
    return true;
  }
  return false;
}

void Reconciler::GangStep(Context& c) {
  if (options_.gang == nullptr) return;
  c.gang = options_.gang->LatestGang(c.job.namespace_, c.job.name);
  if (!c.gang || c.gang->restarts <= c.status.restarts) return;
  const GangReading& r = *c.gang;
  const int before = c.status.restarts;

  // The lowest node of the current gang whose pod is being deleted, or has none; with the
  // pod's name.
  auto gone_node = [&c]() -> std::optional<std::pair<int, std::string>> {
    for (int node = 0; node < c.job.spec.nodes; ++node) {
      std::optional<std::string> going;
      bool stays = false;
      for (const auto& pod : c.pods) {
        if (NodeRankOf(pod) != node || !c.OfCurrentGang(pod)) continue;
        if (IsTerminating(pod)) {
          going = NameOf(pod);
        } else {
          stays = true;
        }
      }
      if (!stays) return std::make_pair(node, going.value_or(PodName(c.job.name, node)));
    }
    return std::nullopt;
  };
  // The failure the agents restarted after: theirs when it is new, else the lost pod recorded
  // for this attempt, else a pod being deleted or missing (its agent left before it could say
  // why), else the coordinator's replacement (it knows of no failure).
  const json& last = c.status.last_failure;
  PodFailure f = FailureFromAgent(r.last_failure, c.job.name);
  const bool reported = r.last_failure.is_object() && !f.failed_at.empty() &&
                        f.failed_at != (last.is_object() ? last.value("failedAt", "") : "");
  if (!reported) {
    if (last.is_object() && last.value("lost", false) &&
        last.value("attempt", -1) == c.status.restarts) {
      f = PodFailure{};
      f.node = last.value("node", 0);
      f.pod = last.value("pod", PodName(c.job.name, f.node));
      f.reason = last.value("reason", "NodeLost");
      f.message = last.value("message", "");
      f.retryable = true;
    } else if (std::optional<std::pair<int, std::string>> gone = gone_node()) {
      // A pod being deleted (kubectl delete, an eviction, its node drained): its agent left
      // before it could say why.
      f = PodFailure{};
      f.node = gone->first;
      f.pod = gone->second;
      f.reason = "NodeLost";
      f.message = "the pod is gone (deleted, evicted or its node lost)";
      f.retryable = true;
    } else {
      f = PodFailure{};
      f.node = 0;
      f.pod = PodName(c.job.name, 0);
      f.reason = "NodeLost";
      f.message =
          "the gang restarted without a failure report: its coordinator (node 0's agent) was "
          "replaced";
      f.retryable = true;
    }
  }
  const int failed_attempt = r.restarts - 1;
  const std::string message = f.Describe() + "; restart " + std::to_string(r.restarts) + " of " +
                              std::to_string(c.job.spec.restart_policy.max_restarts) +
                              " in place (the pods stay)";
  ApplyStall(c, DecideStallAfterFailure(c.status.stall, f, /*restart=*/true, c.status.restarts,
                                        c.now_text));
  json recorded = f.ToJson();
  recorded["attempt"] = failed_attempt;
  recorded["time"] = FormatTime(c.now, /*millis=*/true);
  recorded["inPlace"] = true;
  recorded["quickFailures"] = 1;  // the agents keep the schedule; a recreation starts anew
  c.status.last_failure = recorded;
  if (reported) c.Event(EventType::kWarning, "NodeFailed", f.Describe());
  c.log.Warning("gang restarted in place", {{"attempt", failed_attempt},
                                            {"restarts", r.restarts},
                                            {"node", f.node},
                                            {"rank", f.rank},
                                            {"reason", f.reason},
                                            {"pod", r.pod}});
  c.status.restarts = r.restarts;
  c.status.phase = phase::kRestarting;
  c.SetCondition(condition::kRestarting, true, f.reason.empty() ? "PodFailed" : f.reason, message);
  c.ClearCondition(condition::kRunning, "GangFailed", f.Describe());
  // One event per restart, as a recreated gang shows them, even when the agents made several
  // between two readings (only the last one's failure is known).
  for (int n = before + 1; n < r.restarts; ++n) {
    c.Event(EventType::kWarning, "Restarting",
            "restart " + std::to_string(n) + " of " +
                std::to_string(c.job.spec.restart_policy.max_restarts) + " in place");
  }
  c.Event(EventType::kWarning, "Restarting", message);
  c.restarted_in_place = true;
  c.RequeueAfter(kInPlaceRecheck);
}

void Reconciler::RecordLoss(Context& c, const PodFailure& failure) {
  const json& last = c.status.last_failure;
  if (last.is_object() && last.value("lost", false) && last.value("node", -1) == failure.node &&
      last.value("attempt", -1) == c.status.restarts) {
    return;  // recorded already (the cache may still show the pod)
  }
  const std::string message =
      failure.Describe() +
      "; it is recreated alone, the other nodes hold their ranks stopped until its agent joins";
  json recorded = failure.ToJson();
  recorded["attempt"] = c.status.restarts;
  recorded["time"] = FormatTime(c.now, /*millis=*/true);
  recorded["lost"] = true;
  recorded["inPlace"] = true;
  recorded["quickFailures"] = 1;
  c.status.last_failure = recorded;
  c.status.phase = phase::kRestarting;
  c.SetCondition(condition::kRestarting, true, failure.reason, message);
  c.ClearCondition(condition::kRunning, "PodLost", failure.Describe());
  c.Event(EventType::kWarning, "NodeFailed", message);
  c.log.Warning("pod lost", {{"pod", failure.pod},
                             {"node", failure.node},
                             {"reason", failure.reason},
                             {"attempt", c.status.restarts}});
}

bool Reconciler::GangRunsAgain(const Context& c) const {
  if (c.restarted_in_place) return false;                // written Restarting first
  if (options_.gang == nullptr || !c.gang) return true;  // nothing read: the pods say it
  const GangReading& r = *c.gang;
  if (r.phase != "Running" || r.restarts < c.status.restarts) return false;
  const json& last = c.status.last_failure;
  if (!last.is_object() || r.restarts > last.value("attempt", -1)) return true;
  // A reading of the very attempt that lost a pod: only once the agents have seen the loss.
  std::optional<WallTime> read_at = ParseTime(r.updated);
  std::optional<WallTime> lost_at = ParseTime(last.value("time", ""));
  return read_at && lost_at && *read_at >= *lost_at + kLossSettle;
}

std::optional<Clock::Duration> Reconciler::LossSettleRemaining(const Context& c) const {
  if (c.restarted_in_place || options_.gang == nullptr || !c.gang) return std::nullopt;
  const GangReading& r = *c.gang;
  const json& last = c.status.last_failure;
  if (r.phase != "Running" || r.restarts < c.status.restarts || !last.is_object() ||
      r.restarts > last.value("attempt", -1)) {
    return std::nullopt;
  }
  std::optional<WallTime> read_at = ParseTime(r.updated);
  std::optional<WallTime> lost_at = ParseTime(last.value("time", ""));
  if (!read_at || !lost_at) return std::nullopt;
  // The watcher keeps the latest reading fresh; at least one interval between two looks.
  return std::max<Clock::Duration>(*lost_at + kLossSettle - *read_at, kInPlaceRecheck);
}

}  // namespace spawnpoint::op
