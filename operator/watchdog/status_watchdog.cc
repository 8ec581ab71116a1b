#include "operator/watchdog/status_watchdog.h"

#include <cstdio>

#include "operator/common/object.h"
#include "operator/controller/event_recorder.h"
#include "operator/kube/errors.h"
#include "operator/reconciler/job_status.h"

namespace spawnpoint::op {

namespace {

std::string Seconds(Clock::Duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::seconds>(d).count()) + " s";
}

bool Finished(const Json& job) {
  for (const char* type : {condition::kSucceeded, condition::kFailed}) {
    const Json* c = FindCondition(job, type);
    if (c != nullptr && c->value("status", "") == "True") return true;
  }
  const std::string phase = Str(job, "/status/phase"_json_pointer);
  return phase == phase::kSucceeded || phase == phase::kFailed;
}

bool MarkedStale(const Json& job) {
  const Json* c = FindCondition(job, condition::kStatusStale);
  return c != nullptr && c->value("status", "") == "True";
}

}  // namespace

StatusWatchdog::StatusWatchdog(kube::Client* client, const WallClock* wall,
                               StatusWatchdogOptions options, Logger log)
    : client_(client),
      wall_(wall),
      options_(std::move(options)),
      log_(std::move(log)),
      clock_(wall->clock()) {}

WatchdogRound StatusWatchdog::Check() {
  WatchdogRound round;
  Status read = ReadLease();
  if (!read.ok()) {
    LogOnce("cannot read the operator's Lease: nothing is marked while it cannot be read", read);
    return round;
  }
  round.lease_read = true;
  round.unchanged = clock_->Now() - changed_at_;
  round.stale = round.unchanged >= options_.stale_after;
  if (round.stale) MarkJobs(&round);
  return round;
}

void StatusWatchdog::Run() {
  log_.Info("watching the operator's Lease",
            {{"lease", options_.lease_namespace + "/" + options_.lease_name},
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
      log_.Warning("the operator's Lease is gone",
                   {{"lease", options_.lease_namespace + "/" + options_.lease_name}});
    } else if (!lease_version_ && version.empty()) {
      log_.Warning(
          "the operator's Lease does not exist (yet): no operator with leader election "
          "has run",
          {{"lease", options_.lease_namespace + "/" + options_.lease_name}});
    }
    lease_version_ = version;
    changed_at_ = clock_->Now();
    changed_at_wall_ = wall_->Now();
  }
  holder_ = holder;
  logged_errors_.clear();  // a later failure is news again
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
      if (Finished(job) || MarkedStale(job) || IsTerminating(job)) continue;
      if (!job.contains("apiVersion")) job["apiVersion"] = "spawnpoint.dev/v1alpha1";
      if (!job.contains("kind")) job["kind"] = "TrainingJob";
      Status s = Mark(job, Message(job, round->unchanged), round);
      if (kube::IsConflict(s)) {
        ++round->conflicts;  // written since the list: looked at again next round
      } else if (!s.ok() && !kube::IsNotFound(s)) {
        LogOnce("cannot mark a job's status stale", s);
      }
    }
  }
}

Status StatusWatchdog::Mark(const Json& job, const std::string& message, WatchdogRound* round) {
  const std::string now = FormatTime(wall_->Now());
  Json conditions = Json::array();
  if (const Json* status = job.contains("status") ? &job["status"] : nullptr;
      status != nullptr && status->contains("conditions") && (*status)["conditions"].is_array()) {
    for (const Json& c : (*status)["conditions"]) {
      if (c.value("type", "") != condition::kStatusStale) conditions.push_back(c);
    }
  }
  conditions.push_back({{"type", condition::kStatusStale},
                        {"status", "True"},
                        {"observedGeneration", GenerationOf(job)},
                        {"lastTransitionTime", now},
                        {"reason", "OperatorNotRunning"},
                        {"message", message}});
  Json patch = {
      {"metadata", {{"resourceVersion", Str(job, "/metadata/resourceVersion"_json_pointer)}}},
      {"status", {{"conditions", conditions}}}};
  StatusOr<Json> patched = client_->Patch(kube::resources::TrainingJobs(), NamespaceOf(job),
                                          NameOf(job), patch, kube::PatchType::kMerge, "status");
  if (!patched.ok()) return patched.status();
  round->marked.push_back(NamespaceOf(job) + "/" + NameOf(job));

  char suffix[48];
  snprintf(suffix, sizeof suffix, ".%llx%04llx",
           static_cast<unsigned long long>(wall_->Now().time_since_epoch().count()),
           static_cast<unsigned long long>(event_seq_++ & 0xffff));
  Json event = MakeEvent(job, EventType::kWarning, "StatusStale", message, NameOf(job) + suffix,
                         now, options_.identity);
  event["source"]["component"] = kStatusWatchdogComponent;
  event["reportingComponent"] = std::string("spawnpoint.dev/") + kStatusWatchdogComponent;
  StatusOr<Json> created = client_->Create(kube::resources::Events(), event);
  if (!created.ok()) LogOnce("cannot record an event", created.status());
  return Status::Ok();
}

std::string StatusWatchdog::Message(const Json& job, Clock::Duration unchanged) const {
  std::string lease = options_.lease_namespace + "/" + options_.lease_name;
  std::string text = "no spawnpoint operator is running: its Lease " + lease;
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
