// Reconciles one TrainingJob (namespace/name) towards its spec, level-triggered: it reads
// the job, its pods and its service (from the caches), computes what the world should be,
// runs a flat list of guarded steps that may return early (finished → clean up and TTL;
// suspend; deadline; service; stale pods; failure → restart or fail; success; restart
// backoff; create missing pods, after the gang scheduler's PodGroup; pending check; phase;
// stalled and straggling ranks), and
// writes status ONCE at the end, skipped when nothing changed. Every step is idempotent, so
// a reconcile may be repeated or interrupted at any line and the next one converges to the
// same state.
//
// Gang restarts are two reconciles apart on purpose: the one that sees a failed pod only
// records it (restarts+1, lastFailure) in status; the pods of the failed attempt carry the old
// spawnpoint.dev/attempt label, so once that status is written the next reconcile deletes
// them as stale, and after the backoff creates the new attempt. A lost status write thus
// never loses a failure, and a stale cache never restarts a gang twice (the write's
// resourceVersion precondition fails).
//
// restartPolicy.mode InPlace (with several nodes) leaves restarts to the pods' agents, which
// form a gang: the operator creates the gang's Secret before the pods, mirrors each in-place
// restart the agents report (GangSource: status.restarts, lastFailure, the Restarting phase,
// condition and events, as a recreated gang shows them; the phase is written Restarting before
// a later reconcile calls the gang running again), recreates a lost pod alone under its index
// (never beside a pod of the same name), fails the job when the agents give up
// (MaxRestartsReached, a non-retryable failure) and recreates the whole gang when they give up
// on a node that never came back (NodeLost). status.gangAttempt is the attempt the current
// pods were created at: older pods are stale.
//
// Thread-safe for different jobs (the work queue never hands one key to two workers).
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/clock.h"
#include "common/status.h"
#include "operator/common/log.h"
#include "operator/common/status_token.h"
#include "operator/common/wall_clock.h"
#include "operator/policy/failure_policy.h"
#include "operator/policy/quota_policy.h"
#include "operator/reconciler/children.h"
#include "operator/reconciler/cluster.h"

namespace spawnpoint::op {

struct StallUpdate;  // operator/policy/stall_policy.h

// What one round of reading a running job's agents said about stalled ranks.
struct StallReading {
  // The culprit's "stall" object from the agents' documents (JobStall), or null when every
  // agent was read and none reports a stall.
  nlohmann::json stall;
  std::string updated;  // when the agents were read (RFC 3339)
};

// What one round of reading a running job's agents said about its straggler.
struct StragglerReading {
  // The job's straggler (JobStraggler: the slowest rank of the whole job, when it is one), or
  // null when every agent was read and no rank straggles.
  nlohmann::json straggler;
  std::string updated;  // when the agents were read (RFC 3339)
};

// The latest utilisation read from a running job's agents (status.utilisation), by key.
// Implementations must be thread-safe.
class UtilisationSource {
 public:
  virtual ~UtilisationSource() = default;
  virtual std::optional<nlohmann::json> Latest(const std::string& ns, const std::string& name) = 0;
  // The latest reading of stalled ranks; nullopt when the job's agents were not all read
  // (a source that does not read stalls keeps this default).
  virtual std::optional<StallReading> LatestStall(const std::string& ns, const std::string& name) {
    return std::nullopt;
  }
  // The latest reading of the job's straggler; nullopt when the job's agents were not all read
  // (a source that does not judge stragglers keeps this default).
  virtual std::optional<StragglerReading> LatestStraggler(const std::string& ns,
                                                          const std::string& name) {
    return std::nullopt;
  }
};

// What the agents of an in-place gang say (the first readable of its pods' /status, node 0's
// first: the coordinator's).
struct GangReading {
  int restarts = 0;             // the document's restarts: the gang's restarts, job-wide
  std::string phase;            // the agent's phase: Starting, Running, Restarting, ...
  nlohmann::json last_failure;  // the document's lastFailure, or null
  std::string pod;              // the pod read
  std::string updated;          // when it was read (RFC 3339, ms)
};

// The latest reading of each in-place job's gang. Implementations must be thread-safe.
class GangSource {
 public:
  virtual ~GangSource() = default;
  // nullopt when none of the job's current pods could be read yet.
  virtual std::optional<GangReading> LatestGang(const std::string& ns, const std::string& name) = 0;
};

struct ReconcilerOptions {
  PodSettings pods;
  // In-place gangs' readings; nullptr: the pods alone say when the gang runs again.
  GangSource* gang = nullptr;
  // The gang token in the job's Secret (default NewGangToken).
  std::function<StatusOr<std::string>()> new_gang_token;
  // Each job's status token (not owned); nullptr: none (the agents serve their log lines on
  // loopback only). Sets pods.status_token.
  const StatusTokens* status_tokens = nullptr;
  // A pod Pending longer than this is reported (Running condition, reason PodPending).
  Clock::Duration pending_timeout = std::chrono::minutes(5);
  // When a create the namespace's ResourceQuota refused is tried again (quota_policy.h).
  QuotaRetry quota_retry;
  // Called after each pod was created (tests use it as a crash point).
  std::function<void(const std::string& pod)> after_pod_create;
};

struct ReconcileResult {
  // OK, or the first error: kConflict (stale read: requeue), retryable (kUnavailable,
  // kDeadlineExceeded: requeue with backoff), or terminal (logged, not retried until the
  // next change).
  Status status;
  // Time-driven work (restart backoff, deadline, TTL, pending timeout): reconcile again then.
  std::optional<Clock::Duration> requeue_after;
  bool status_written = false;
  std::string phase;  // the phase after this reconcile ("" if the job is gone)
  // The phase and restart count before this reconcile, and the restart count after it.
  std::string previous_phase;
  int previous_restarts = 0;
  int restarts = 0;
  // The status written ended a wait for Kueue's admission that took this long
  // (AdmissionWait, admission_policy.h); nullopt otherwise, and when nothing was written.
  std::optional<Clock::Duration> admission_wait;
};

class Reconciler {
 public:
  Reconciler(Cluster* cluster, const WallClock* clock, ReconcilerOptions options,
             UtilisationSource* utilisation = nullptr);

  ReconcileResult Reconcile(const std::string& ns, const std::string& name, const Logger& log);

 private:
  struct Context;

  void InvalidSpec(Context& c, const std::string& message);
  void FinishedStep(Context& c);
  bool SuspendStep(Context& c);
  bool DeadlineStep(Context& c);
  void EnsureService(Context& c);
  void DeleteStalePods(Context& c);
  bool FailureStep(Context& c);
  // Records the first failure of the attempt and restarts the gang or fails the job; with
  // `may_restart` false (the agents gave up) it fails the job in any case.
  void ActOnFailure(Context& c, const PodFailure& first, bool may_restart = true,
                    const std::string& verdict = "", const std::string& verdict_message = "");
  // In place (in_place.cc): pods that failed without the gang's verdict are lost (recreated
  // alone) or fatal; a verdict ends the gang.
  bool InPlaceFailureStep(Context& c);
  // In place: mirrors the restarts the agents made.
  void GangStep(Context& c);
  // In place: a lost pod of node `failure.node`, once per node and attempt.
  void RecordLoss(Context& c, const PodFailure& failure);
  // True once the job's Secret exists, when it needs one (in place: the gang token; with
  // status tokens: the agents' status token).
  bool EnsureJobSecret(Context& c);
  // In place: whether the agents say the gang runs the attempt in status.restarts.
  bool GangRunsAgain(const Context& c) const;
  // In place, GangRunsAgain false: how long until a reading can say so when only the time since
  // a pod's loss is missing (the readings then change no more, so nothing else enqueues the
  // job); nullopt when a new reading must come first.
  std::optional<Clock::Duration> LossSettleRemaining(const Context& c) const;
  // Gang volcano (gang_scheduling.cc): true once the job's PodGroup exists.
  bool EnsurePodGroup(Context& c);
  // Gang volcano: deletes the PodGroup when the job enters Succeeded, Failed or Suspended; false
  // if that failed (the status is then not written, so the next reconcile does it again).
  bool ReleasePodGroup(Context& c);
  // Gang kueue (gang_scheduling.cc, kueue_pods.h): Kueue evicted the current gang (its pods'
  // condition TerminationTarget): recorded once (status.evictions and lastEviction, condition
  // Queued with Kueue's reason, an event), no restart counted; the gang is recreated and waits
  // for admission again.
  void KueueEvictionStep(Context& c);
  // Gang kueue: whether node `node` has a pod of the current gang that is not going away.
  bool KueueNodeCovered(const Context& c, int node) const;
  // Gang kueue: the name of node `node`'s new pod, or "" while a predecessor still counts as
  // active for Kueue (a new pod now would be deleted as excess).
  std::string KueueNewPodName(const Context& c, int node) const;
  // Gang kueue: before a whole new gang (a resume), whether the group's Workload is still there
  // Finished (the suspended gang's, until garbage collection takes it with its pods): new pods
  // would join a group Kueue already ended, so they wait.
  bool KueueGroupEnded(Context& c);
  // Gang kueue: when the job enters Failed or Suspended, marks its pods
  // kueue.x-k8s.io/retriable-in-group "false" so that Kueue ends the group and frees its quota;
  // false if that failed (the status is then not written, so the next reconcile does it again).
  bool ReleaseKueueGroup(Context& c);
  bool SuccessStep(Context& c);
  bool BackoffElapsed(Context& c);
  void CreateMissingPods(Context& c);
  // Before a whole gang is created (quota_steps.cc, quota_policy.h): false if the namespace's
  // ResourceQuota cannot hold all of it (QuotaDenied then says so).
  bool QuotaHolds(Context& c);
  // A create refused for a ResourceQuota: condition QuotaExceeded, an event on the transition,
  // a retry after QuotaRetryDelay.
  void QuotaDenied(Context& c, const std::string& api_message);
  // PendingStep's part for a job the quota keeps without any pod: past the pending timeout
  // since QuotaExceeded turned True, it is reported as a pending pod would be.
  void QuotaPendingStep(Context& c);
  // Gang kueue (admission_policy.h): true while the pods wait, gated, for Kueue's admission
  // (phase and condition Queued); once the gates are gone the condition Queued turns False.
  bool AdmissionStep(Context& c);
  void PendingStep(Context& c);
  void UpdatePhase(Context& c);
  void StallStep(Context& c);
  ReconcileResult Finish(Context& c);

  // Before the first create of a reconcile: false if the job is gone (stop here).
  bool ConfirmJobLive(Context& c);
  void Fail(Context& c, const std::string& reason, const std::string& message);
  void DeletePod(Context& c, const nlohmann::json& pod, const std::string& why);
  void ApplyStall(Context& c, const StallUpdate& update);

  Cluster* const cluster_;
  const WallClock* const clock_;
  const ReconcilerOptions options_;
  UtilisationSource* const utilisation_;
};

}  // namespace spawnpoint::op
