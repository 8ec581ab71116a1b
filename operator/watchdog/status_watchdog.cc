#include "operator/watchdog/status_watchdog.h"

#include "operator/common/object.h"
#include "operator/controller/event_recorder.h"
#include "operator/kube/errors.h"
#include "operator/reconciler/job_status.h"

namespace spawnpoint::op {

namespace {

std::string Seconds(Clock::Duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::seconds>(d).count()) + " s";
}

}  // namespace

StatusWatchdog::StatusWatchdog(kube::Client* client, const WallClock* wall,
                               StatusWatchdogOptions options, Logger log)
    : client_(client),
      wall_(wall),
      options_(std::move(options)),
      log_(std::move(log)),
      clock_(wall->clock()),
      lease_(options_.lease_namespace + "/" + options_.lease_name) {}

WatchdogRound StatusWatchdog::Check() {
  WatchdogRound round;
  Status read = ReadLease();
  if (!read.ok()) {
    if (read.message() != lease_error_) {  // once per failure, until a read succeeds
      log_.Warning("cannot read the operator's Lease: nothing is marked while it cannot be read",
                   {{"error", read.message()}});
      lease_error_ = read.message();
    }
    return round;
  }
  round.lease_read = true;
  round.unchanged = clock_->Now() - changed_at_;
  round.stale = round.unchanged >= options_.stale_after;
  if (round.stale) MarkJobs(&round);
  return round;
}

void StatusWatchdog::Run() {
  log_.Info("watching the operator's Lease", {{"lease", lease_},
                                              {"staleAfter", Seconds(options_.stale_after)},
                                              {"interval", Seconds(options_.interval)}});
  while (true) {
    WatchdogRound round = Check();
    if (!round.marked.empty()) {
      log_.Warning("marked jobs' status stale", {{"jobs", static_cast<int>(round.marked.size())},
                                                 {"leaseUnchanged", Seconds(round.unchanged)}});
    }
    std::unique_lock<std::mutex> lock(mu_);
    // Real time here: the interval is a pause between rounds, never a decision.
    if (cv_.wait_for(lock, options_.interval, [&] { return stop_; })) return;
  }
}

void StatusWatchdog::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stop_ = true;
  cv_.notify_all();
}

Status StatusWatchdog::ReadLease() {
  StatusOr<Json> lease =
      client_->Get(kube::resources::Leases(), options_.lease_namespace, options_.lease_name);
  std::string version;
  std::string holder;
  if (lease.ok()) {
    version = Str(*lease, "/metadata/resourceVersion"_json_pointer);
    holder = Str(*lease, "/spec/holderIdentity"_json_pointer);
  } else if (!kube::IsNotFound(lease.status())) {
    return lease.status();
  }
  if (!lease_version_ || *lease_version_ != version) {
    if (lease_version_ && version.empty()) {
      log_.Warning("the operator's Lease is gone", {{"lease", lease_}});
    } else if (!lease_version_ && version.empty()) {
      log_.Warning(
          "the operator's Lease does not exist (yet): no operator with leader election "
          "has run",
          {{"lease", lease_}});
    }
    lease_version_ = version;
    changed_at_ = clock_->Now();
    changed_at_wall_ = wall_->Now();
  }
  holder_ = holder;
  lease_error_.clear();  // a later failure is news again
  return Status::Ok();
}

void StatusWatchdog::MarkJobs(WatchdogRound* round) {
  std::vector<std::string> scopes = options_.namespaces;
  if (scopes.empty()) scopes.push_back("");  // every namespace
  for (const std::string& ns : scopes) {
    StatusOr<kube::ObjectList> jobs =
        client_->ListAll(kube::resources::TrainingJobs(), ns, {.limit = 500});
    if (!jobs.ok()) {
      LogOnce("cannot list TrainingJobs" + (ns.empty() ? "" : " in " + ns), jobs.status());
      continue;
    }
    for (Json& job : jobs->items) {
      JobStatus status = JobStatus::FromJson(job.value("status", Json::object()));
      if (status.Finished() || status.IsTrue(condition::kStatusStale) || IsTerminating(job)) {
        continue;
      }
      if (!job.contains("apiVersion")) job["apiVersion"] = "spawnpoint.dev/v1alpha1";
      if (!job.contains("kind")) job["kind"] = "TrainingJob";
      Status s = Mark(job, std::move(status), Message(job, round->unchanged), round);
      if (kube::IsConflict(s)) {
        ++round->conflicts;  // written since the list: looked at again next round
      } else if (!s.ok() && !kube::IsNotFound(s)) {
        LogOnce("cannot mark a job's status stale", s);
      }
    }
  }
}

Status StatusWatchdog::Mark(const Json& job, JobStatus status, const std::string& message,
                            WatchdogRound* round) {
  const WallTime now = wall_->Now();
  const std::string now_text = FormatTime(now);
  status.SetCondition(condition::kStatusStale, true, "OperatorNotRunning", message,
                      GenerationOf(job), now_text);
  Json patch = {
      {"metadata", {{"resourceVersion", Str(job, "/metadata/resourceVersion"_json_pointer)}}},
      {"status", {{"conditions", status.ToJson()["conditions"]}}}};
  StatusOr<Json> patched = client_->Patch(kube::resources::TrainingJobs(), NamespaceOf(job),
                                          NameOf(job), patch, kube::PatchType::kMerge, "status");
  if (!patched.ok()) return patched.status();
  round->marked.push_back(NamespaceOf(job) + "/" + NameOf(job));

  StatusOr<Json> created = client_->Create(
      kube::resources::Events(),
      MakeEvent(job, EventType::kWarning, "StatusStale", message, EventName(job, now, event_seq_++),
                now_text, options_.identity, kStatusWatchdogComponent));
  if (!created.ok()) LogOnce("cannot record an event", created.status());
  return Status::Ok();
}

std::string StatusWatchdog::Message(const Json& job, Clock::Duration unchanged) const {
  std::string text = "no spawnpoint operator is running: its Lease " + lease_;
  text += lease_version_->empty()
              ? " does not exist"
              : " has not been renewed for " + Seconds(unchanged) + " (holder " +
                    (holder_.empty() ? std::string("none: released") : "\"" + holder_ + "\"") +
                    ", last change seen at " + FormatTime(changed_at_wall_) + ")";
  std::string phase = Str(job, "/status/phase"_json_pointer);
  std::string updated = Str(job, "/status/utilisation/updated"_json_pointer);
  text += ". This status (phase " + (phase.empty() ? std::string("none") : phase) +
          ") is what the operator last wrote" +
          (updated.empty() ? std::string() : ", its agents last read at " + updated) +
          "; nothing restarts, times out or suspends this job until an operator runs again";
  return text;
}

void StatusWatchdog::LogOnce(const std::string& what, const Status& error) {
  if (!logged_errors_.insert(what + "\n" + error.message()).second) return;
  log_.Warning(what, {{"error", error.message()}});
}

}  // namespace spawnpoint::op
