#include "operator/reconciler/reconciler.h"

#include <algorithm>
#include <set>

#include "api/training_job.h"
#include "operator/common/names.h"
#include "operator/common/object.h"
#include "operator/policy/admission_policy.h"
#include "operator/policy/clean_pod_policy.h"
#include "operator/policy/deadline_policy.h"
#include "operator/policy/failure_policy.h"
#include "operator/policy/pending_policy.h"
#include "operator/policy/quota_policy.h"
#include "operator/policy/stall_policy.h"
#include "operator/policy/success_policy.h"
#include "operator/policy/suspend_policy.h"
#include "operator/policy/ttl_policy.h"
#include "operator/reconciler/job_status.h"
#include "operator/reconciler/reconcile_context.h"

namespace spawnpoint::op {

using nlohmann::json;

namespace {
// When a write's answer contradicts the cache (AlreadyExists for a pod the cache lacks),
// look again after this long even if no event comes.
constexpr Clock::Duration kRecheckAfter = std::chrono::seconds(1);
}  // namespace

Reconciler::Reconciler(Cluster* cluster, const WallClock* clock, ReconcilerOptions options,
                       UtilisationSource* utilisation)
    : cluster_(cluster),
      clock_(clock),
      options_([&] {
        options.pods.status_token = options.status_tokens != nullptr;
        return std::move(options);
      }()),
      utilisation_(utilisation) {}

ReconcileResult Reconciler::Reconcile(const std::string& ns, const std::string& name,
                                      const Logger& log) {
  // Fetch. A job that is gone needs nothing: its children are garbage-collected.
  std::optional<json> object = cluster_->GetJob(ns, name);
  if (!object) return {};
  if (IsTerminating(*object)) return {};

  Context c;
  c.object = std::move(*object);
  c.log = log;
  c.now = clock_->Now();
  c.now_text = FormatTime(c.now);
  c.generation = GenerationOf(c.object);
  c.status = JobStatus::FromJson(c.object.value("status", json::object()));
  c.old_status = c.status.ToJson();
  c.status.observed_generation = c.generation;
  // An operator runs again: what the status watchdog marked stale is current from here on.
  if (c.status.IsTrue(condition::kStatusStale)) {
    c.SetCondition(condition::kStatusStale, false, "OperatorRunning",
                   "an operator reconciles this job again; its status is current");
    c.Event(EventType::kNormal, "StatusCurrent",
            "an operator reconciles this job again; its status is current");
  }

  // What the schema cannot express is checked here: a terminal InvalidSpec until the spec
  // changes (a new generation gets another look).
  StatusOr<api::TrainingJob> parsed = api::TrainingJobFromJson(c.object);
  if (!parsed.ok()) {
    InvalidSpec(c, parsed.status().message());
    return Finish(c);
  }
  c.job = std::move(parsed).value();
  c.in_place = RestartsInPlace(c.job);
  if (c.in_place) {
    c.status.gang_attempt = c.status.GangAttempt();
  } else {
    c.status.gang_attempt.reset();
  }
  const Condition* failed = c.status.Find(condition::kFailed);
  if (failed && failed->status == "True" && failed->reason == "InvalidSpec") {
    c.SetCondition(condition::kFailed, false, "SpecCorrected", "the spec is valid again");
    c.status.phase = "";
    c.status.completion_time = "";
  }

  c.pods = cluster_->ListPods(ns, UidOf(c.object));
  c.service = cluster_->GetService(ns, ServiceName(name));
  c.status.world_size = api::WorldSize(c.job.spec);
  c.status.gpus = c.job.spec.nodes * c.job.spec.gpus_per_node;

  if (c.status.Finished()) {
    FinishedStep(c);
    return Finish(c);
  }
  if (SuspendStep(c)) return Finish(c);
  if (c.status.start_time.empty()) c.status.start_time = c.now_text;
  if (DeadlineStep(c)) return Finish(c);
  EnsureService(c);
  DeleteStalePods(c);
  KueueEvictionStep(c);
  if (c.in_place) GangStep(c);  // before the pods: a restart just before the end is counted
  if (c.in_place ? InPlaceFailureStep(c) : FailureStep(c)) return Finish(c);
  if (SuccessStep(c)) return Finish(c);
  if (!BackoffElapsed(c)) return Finish(c);
  CreateMissingPods(c);
  if (AdmissionStep(c)) return Finish(c);
  PendingStep(c);
  UpdatePhase(c);
  StallStep(c);
  return Finish(c);
}

void Reconciler::InvalidSpec(Context& c, const std::string& message) {
  const Condition* failed = c.status.Find(condition::kFailed);
  if (failed && failed->status == "True" && failed->reason == "InvalidSpec" &&
      failed->message == message) {
    return;  // already reported for this spec
  }
  c.status.phase = phase::kFailed;
  c.SetCondition(condition::kFailed, true, "InvalidSpec", message);
  c.ClearCondition(condition::kRunning, "InvalidSpec", message);
  if (c.status.completion_time.empty()) c.status.completion_time = c.now_text;
  c.Event(EventType::kWarning, "InvalidSpec", message);
  c.log.Warning("invalid spec", {{"error", message}});
}

// Succeeded or Failed: apply cleanPodPolicy, then ttlSecondsAfterFinished.
void Reconciler::FinishedStep(Context& c) {
  const api::RunPolicy& run = c.job.spec.run_policy;
  for (const auto& pod : c.pods) {
    if (DeletePodWhenFinished(run.clean_pod_policy, pod)) {
      DeletePod(c, pod,
                std::string("cleanPodPolicy ") + api::CleanPodPolicyName(run.clean_pod_policy));
    }
  }
  if (c.service && DeleteServiceWhenFinished(run.clean_pod_policy) && !IsTerminating(*c.service)) {
    Status s = cluster_->DeleteService(c.job.namespace_, NameOf(*c.service), UidOf(*c.service));
    if (!s.ok() && s.code() != StatusCode::kNotFound) c.KeepError(s);
  }
  TtlCheck ttl = CheckTtl(run, ParseTime(c.status.completion_time), c.now);
  if (ttl.expired) {
    Status s = cluster_->DeleteJob(c.job.namespace_, c.job.name, UidOf(c.object));
    if (s.ok() || s.code() == StatusCode::kNotFound) {
      c.abandoned = true;
      c.log.Info("deleted the finished job: ttlSecondsAfterFinished passed",
                 {{"ttl", std::to_string(*run.ttl_seconds_after_finished)}});
    } else {
      c.KeepError(s);
    }
    return;
  }
  if (ttl.remaining) c.RequeueAfter(*ttl.remaining);
}

bool Reconciler::SuspendStep(Context& c) {
  switch (DecideSuspend(c.job.spec.run_policy, c.status.IsTrue(condition::kSuspended))) {
    case SuspendTransition::kNone:
      return false;
    case SuspendTransition::kResume:
      c.SetCondition(condition::kSuspended, false, "JobResumed", "spec.runPolicy.suspend is false");
      c.Event(EventType::kNormal, "Resumed", "the job was resumed: recreating the gang");
      return false;
    case SuspendTransition::kSuspend:
      break;
  }
  for (const auto& pod : c.pods) {
    if (!IsTerminating(pod)) DeletePod(c, pod, "suspended");
  }
  const std::string message = "spec.runPolicy.suspend is true: the pods are deleted";
  if (c.SetCondition(condition::kSuspended, true, "JobSuspended", message)) {
    c.Event(EventType::kNormal, "Suspended", message);
  }
  c.ClearCondition(condition::kRunning, "JobSuspended", message);
  c.status.phase = phase::kSuspended;
  c.status.start_time = "";  // the deadline counts from the resume
  return true;
}

bool Reconciler::DeadlineStep(Context& c) {
  DeadlineCheck d = CheckDeadline(c.job.spec.run_policy, ParseTime(c.status.start_time), c.now);
  if (!d.exceeded) {
    if (d.remaining) c.RequeueAfter(*d.remaining);
    return false;
  }
  // Past the deadline no rank may keep running, whatever cleanPodPolicy says.
  for (const auto& pod : c.pods) {
    const std::string p = PodPhase(pod);
    if (!IsTerminating(pod) && p != "Succeeded" && p != "Failed") {
      DeletePod(c, pod, "deadline exceeded");
    }
  }
  Fail(c, "DeadlineExceeded", d.message);
  return true;
}

void Reconciler::EnsureService(Context& c) {
  if (c.service || !ConfirmJobLive(c)) return;
  StatusOr<json> created = cluster_->CreateService(BuildService(c.job, c.object));
  if (created.ok()) {
    c.log.Info("created service", {{"service", ServiceName(c.job.name)}});
  } else if (created.status().code() != StatusCode::kAlreadyExists) {
    c.KeepError(created.status());
  }
}

// Pods of earlier attempts (in place: of an earlier gang): the failed gang, deleted once its
// failure is in status.
void Reconciler::DeleteStalePods(Context& c) {
  for (const auto& pod : c.pods) {
    if (c.OfCurrentGang(pod) || IsTerminating(pod)) continue;
    DeletePod(c, pod, "attempt " + std::to_string(AttemptOf(pod)) + " is over");
  }
}

bool Reconciler::SuccessStep(Context& c) {
  if (!AttemptSucceeded(c.CurrentPods(), c.job.spec.nodes)) return false;
  const std::string message = "all " + std::to_string(c.job.spec.nodes) + " pods of attempt " +
                              std::to_string(c.status.restarts) + " succeeded";
  c.status.phase = phase::kSucceeded;
  c.status.completion_time = c.now_text;
  c.SetCondition(condition::kSucceeded, true, "AllNodesSucceeded", message);
  c.ClearCondition(condition::kRunning, "JobSucceeded", message);
  if (c.status.IsTrue(condition::kRestarting)) {
    c.SetCondition(condition::kRestarting, false, "JobSucceeded", message);
  }
  c.Event(EventType::kNormal, "Succeeded", message);
  c.log.Info("job succeeded", {{"attempt", c.status.restarts}});
  return true;
}

void Reconciler::CreateMissingPods(Context& c) {
  std::set<std::string> present;
  for (const auto& pod : c.pods) present.insert(NameOf(pod));  // incl. stale ones still going
  // In place, a pod missing from a gang that has run was lost: it comes back alone.
  const bool gang_ran =
      c.in_place && !c.CurrentPods().empty() &&
      (c.status.phase == phase::kRunning ||
       (c.status.phase == phase::kRestarting && c.status.GangAttempt() < c.status.restarts));
  const bool kueue = c.job.spec.scheduling.gang == api::GangScheduler::kKueue;
  if (kueue && KueueGroupEnded(c)) {
    c.RequeueAfter(kRecheckAfter);
    return;
  }
  // A whole gang to make: can the namespace's quota hold all of it? One dry-run create asks.
  if (c.CurrentPods().empty() && c.job.spec.nodes > 1 && !QuotaHolds(c)) return;
  bool denied = false, failed = false;
  std::vector<std::string> created;
  for (int node = 0; node < c.job.spec.nodes; ++node) {
    std::string name = PodName(c.job.name, node);
    if (kueue) {
      // A replacement gets a name of its own (Kueue holds its predecessor, Failed, until it
      // exists), once Kueue no longer counts the predecessor as active.
      if (KueueNodeCovered(c, node)) continue;
      name = KueueNewPodName(c, node);
      if (name.empty()) {
        c.RequeueAfter(kRecheckAfter);
        continue;
      }
    } else if (present.count(name)) {
      continue;
    }
    if (!ConfirmJobLive(c)) return;
    if (!EnsureJobSecret(c)) return;
    if (!EnsurePodGroup(c)) return;
    if (gang_ran) {
      PodFailure lost;
      lost.node = node;
      lost.pod = name;
      lost.reason = "NodeLost";
      lost.message = "the pod is gone (deleted, evicted or its node lost)";
      lost.retryable = true;
      RecordLoss(c, lost);
    }
    json built = BuildPod(c.job, c.object, node, c.status.restarts, options_.pods);
    built["metadata"]["name"] = name;  // its hostname stays PodName's (the gang's DNS names)
    StatusOr<json> pod = cluster_->CreatePod(built);
    if (!pod.ok() && pod.status().code() == StatusCode::kAlreadyExists) {
      // Usually cache lag; look again soon in case it was not (the pod was not made).
      c.RequeueAfter(kRecheckAfter);
      continue;
    }
    if (!pod.ok() && IsQuotaDenial(pod.status())) {
      QuotaDenied(c, pod.status().message());
      denied = true;
      break;
    }
    if (!pod.ok()) {
      failed = true;
      if (pod.status().code() == StatusCode::kInvalidArgument) {
        // The API rejects the pod the template makes: terminal until the spec changes.
        const std::string message = "pod " + name + ": " + pod.status().message();
        if (c.SetCondition(condition::kCreated, false, "FailedCreatePod", message)) {
          c.Event(EventType::kWarning, "FailedCreatePod", message);
        }
      }
      c.KeepError(pod.status());
      break;  // keep creation in node order: a crash leaves a prefix of the gang
    }
    created.push_back(name);
    c.pods.push_back(std::move(pod).value());
    if (options_.after_pod_create) options_.after_pod_create(name);
  }
  if (!denied && !failed && c.status.IsTrue(condition::kQuotaExceeded)) {
    const std::string message = "the pods fit the namespace's quota again";
    c.SetCondition(condition::kQuotaExceeded, false, "QuotaAvailable", message);
    c.Event(EventType::kNormal, "QuotaAvailable", message);
  }
  if (created.empty()) return;
  std::string names;
  for (const auto& n : created) names += (names.empty() ? "" : ", ") + n;
  const std::string message = "created " + std::to_string(created.size()) + " pod" +
                              (created.size() == 1 ? "" : "s") + " of attempt " +
                              std::to_string(c.status.restarts) + ": " + names;
  if (denied) {  // never "created" while a pod is missing
    c.SetCondition(condition::kCreated, false, "QuotaExceeded",
                   message + "; the rest exceed the namespace's quota");
  } else {
    c.SetCondition(condition::kCreated, true, "GangCreated", message);
  }
  cluster_->RecordEvent(c.object, EventType::kNormal, "Created", message);
  c.log.Info("created pods", {{"attempt", c.status.restarts}, {"pods", names}});
}

void Reconciler::PendingStep(Context& c) {
  PendingCheck check = CheckPending(c.CurrentPods(), options_.pending_timeout, c.now);
  if (check.recheck_after) c.RequeueAfter(*check.recheck_after);
  c.pending_message = check.message;
  if (c.pending_message.empty()) QuotaPendingStep(c);
}

void Reconciler::UpdatePhase(Context& c) {
  std::set<int> up;
  for (const json* pod : c.CurrentPods()) {
    const std::string p = PodPhase(*pod);
    if (p == "Running" || p == "Succeeded") up.insert(NodeRankOf(*pod));
  }
  const int nodes = c.job.spec.nodes;
  const std::string attempt = std::to_string(c.status.restarts);
  if (static_cast<int>(up.size()) == nodes && c.in_place &&
      c.status.IsTrue(condition::kRestarting) && !GangRunsAgain(c)) {
    c.status.phase = phase::kRestarting;  // the pods run; their agents restart the gang
    if (std::optional<Clock::Duration> settle = LossSettleRemaining(c)) c.RequeueAfter(*settle);
    return;
  }
  if (static_cast<int>(up.size()) == nodes) {
    c.status.phase = phase::kRunning;
    const std::string message =
        "all " + std::to_string(nodes) + " pods of attempt " + attempt + " are running";
    c.SetCondition(condition::kRunning, true, "GangRunning", message);
    if (c.status.IsTrue(condition::kRestarting)) {
      c.SetCondition(condition::kRestarting, false, "GangRunning", message);
      c.Event(EventType::kNormal, "Restarted", message);
    }
    return;
  }
  c.status.phase = c.status.IsTrue(condition::kRestarting) ? phase::kRestarting : phase::kPending;
  if (!c.pending_message.empty()) {
    const Condition* running = c.status.Find(condition::kRunning);
    bool reported = running && running->reason == "PodPending";
    c.SetCondition(condition::kRunning, false, "PodPending", c.pending_message);
    if (!reported) c.Event(EventType::kWarning, "PodPending", c.pending_message);
    return;
  }
  c.ClearCondition(condition::kRunning, "PodsNotRunning",
                   std::to_string(up.size()) + " of " + std::to_string(nodes) +
                       " pods of attempt " + attempt + " are running");
}

// The running attempt's agents report a stalled rank or a straggler, or no longer do
// (stall_policy.h).
void Reconciler::StallStep(Context& c) {
  if (utilisation_ == nullptr || c.status.phase != phase::kRunning) return;
  // A reading from before this attempt's gang was running says nothing about it.
  const Condition* running = c.status.Find(condition::kRunning);
  std::optional<WallTime> running_since =
      running ? ParseTime(running->last_transition_time) : std::nullopt;
  if (!running_since) return;
  auto current = [since = *running_since](const std::string& updated) {
    std::optional<WallTime> read_at = ParseTime(updated);
    return read_at && *read_at >= since;
  };
  std::optional<json> stall, straggler;
  std::optional<StallReading> stall_read = utilisation_->LatestStall(c.job.namespace_, c.job.name);
  if (stall_read && current(stall_read->updated)) stall = stall_read->stall;
  std::optional<StragglerReading> straggler_read =
      utilisation_->LatestStraggler(c.job.namespace_, c.job.name);
  if (straggler_read && current(straggler_read->updated)) straggler = straggler_read->straggler;
  if (!stall && !straggler) return;
  ApplyStall(
      c, DecideStallFromReadings(c.status.stall, c.status.straggler, stall, straggler, c.now_text));
}

ReconcileResult Reconciler::Finish(Context& c) {
  if (c.abandoned) return {.status = c.error};
  // Counts of the current attempt.
  NodeCounts counts;
  for (const json* pod : c.CurrentPods()) {
    const std::string p = PodPhase(*pod);
    if (p == "Running") {
      ++counts.running;
    } else if (p == "Succeeded") {
      ++counts.succeeded;
    } else if (p == "Failed") {
      ++counts.failed;
    } else {
      ++counts.pending;
    }
  }
  c.status.nodes = counts;
  if (c.status.phase != phase::kRunning) {
    c.status.utilisation = nullptr;  // no rank runs: no reading stands for the job
  } else if (utilisation_) {
    if (auto latest = utilisation_->Latest(c.job.namespace_, c.job.name)) {
      c.status.utilisation = *latest;
    }
  }

  ReconcileResult result;
  result.requeue_after = c.requeue_after;
  result.phase = c.status.phase;
  result.previous_phase = c.old_status.value("phase", "");
  result.previous_restarts = c.old_status.value("restarts", 0);
  result.restarts = c.status.restarts;
  json desired = c.status.ToJson();
  if (desired != c.old_status) {
    if (!ReleasePodGroup(c) || !ReleaseKueueGroup(c)) {
      result.status = c.error;
      return result;
    }
    json updated = c.object;
    updated["status"] = desired;
    StatusOr<json> written = cluster_->UpdateJobStatus(updated);
    if (!written.ok()) {
      // Nothing of this decision is lost: the next reconcile makes it again.
      c.KeepError(written.status());
      result.status = c.error;
      return result;
    }
    result.status_written = true;
    result.admission_wait = AdmissionWait(c.old_status, desired);
    if (desired.value("phase", "") != result.previous_phase) {
      c.log.Info("phase changed", {{"from", result.previous_phase},
                                   {"to", desired.value("phase", "")},
                                   {"restarts", c.status.restarts}});
    }
  }
  for (const auto& [type, reason, message] : c.events) {
    cluster_->RecordEvent(c.object, type, reason, message);
  }
  result.status = c.error;
  return result;
}

bool Reconciler::ConfirmJobLive(Context& c) {
  if (!c.live) {
    StatusOr<bool> live = cluster_->JobIsLive(c.job.namespace_, c.job.name, UidOf(c.object));
    if (!live.ok()) {
      c.KeepError(live.status());
      c.live = false;
      c.abandoned = true;
    } else {
      c.live = *live;
      // Gone: the cache is behind; its deletion event brings nothing more to do.
      if (!*live) c.abandoned = true;
    }
  }
  return *c.live;
}

bool Reconciler::EnsureJobSecret(Context& c) {
  if (c.job_secret_ready || (!c.in_place && options_.status_tokens == nullptr)) return true;
  std::string gang_token;
  if (c.in_place) {
    StatusOr<std::string> token =
        options_.new_gang_token ? options_.new_gang_token() : NewGangToken();
    if (!token.ok()) {
      c.KeepError(token.status());
      return false;
    }
    gang_token = *token;
  }
  const std::string status_token =
      options_.status_tokens != nullptr
          ? options_.status_tokens->For(c.job.namespace_, c.job.name, UidOf(c.object))
          : "";
  // Created once and never read back: AlreadyExists means this job's Secret is there.
  StatusOr<json> created =
      cluster_->CreateSecret(BuildJobSecret(c.job, c.object, gang_token, status_token));
  if (!created.ok() && created.status().code() != StatusCode::kAlreadyExists) {
    c.KeepError(created.status());
    return false;
  }
  if (created.ok()) {
    c.log.Info("created the job's secret",
               {{"secret", JobSecretName(c.job.name, UidOf(c.object))}});
  }
  c.job_secret_ready = true;
  return true;
}

void Reconciler::Fail(Context& c, const std::string& reason, const std::string& message) {
  c.status.phase = phase::kFailed;
  c.status.completion_time = c.now_text;
  c.SetCondition(condition::kFailed, true, reason, message);
  c.ClearCondition(condition::kRunning, reason, message);
  if (c.status.IsTrue(condition::kRestarting)) {
    c.SetCondition(condition::kRestarting, false, reason, message);
  }
  c.Event(EventType::kWarning, reason == "DeadlineExceeded" ? "DeadlineExceeded" : "Failed",
          message);
  c.log.Warning("job failed", {{"reason", reason}, {"message", message}});
}

void Reconciler::ApplyStall(Context& c, const StallUpdate& update) {
  c.status.stall = update.stall;
  if (update.stalled && *update.stalled) {
    c.SetCondition(condition::kStalled, true, update.reason, update.message);
  } else if (update.stalled) {
    c.ClearCondition(condition::kStalled, update.reason, update.message);
  }
  if (update.straggling && *update.straggling) {
    c.SetCondition(condition::kStraggler, true, update.straggling_reason,
                   update.straggling_message);
  } else if (update.straggling) {
    c.ClearCondition(condition::kStraggler, update.straggling_reason, update.straggling_message);
  }
  if (update.straggler) c.status.straggler = *update.straggler;
  if (update.event) {
    c.Event(EventType::kWarning, stall_reason::kRankStalled, update.event_message);
    c.log.Warning("rank stalled", {{"message", update.event_message}});
  }
  if (update.straggler_event) {
    c.Event(EventType::kWarning, stall_reason::kStraggler, update.straggler_event_message);
    c.log.Warning("straggler", {{"message", update.straggler_event_message}});
  }
}

void Reconciler::DeletePod(Context& c, const json& pod, const std::string& why) {
  const std::string name = NameOf(pod);
  Status s = cluster_->DeletePod(c.job.namespace_, name, UidOf(pod));
  if (s.ok() || s.code() == StatusCode::kNotFound || s.code() == StatusCode::kConflict) {
    // kConflict: the UID precondition failed, the name already belongs to a successor.
    c.deleted.insert(name);
    if (!s.ok()) c.RequeueAfter(kRecheckAfter);
    if (s.ok()) c.log.Info("deleted pod", {{"pod", name}, {"why", why}});
    return;
  }
  c.KeepError(s);
}

}  // namespace spawnpoint::op
