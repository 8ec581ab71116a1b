#include "operator/kube/leader_election.h"

#include <ctime>
#include <random>

#include "operator/kube/errors.h"
#include "operator/kube/timing.h"

namespace spawnpoint::kube {

Json LeaseSpecFromRecord(const LeaderElectionRecord& r) {
  Json spec = {{"holderIdentity", r.holder_identity},
               {"leaseDurationSeconds", r.lease_duration_seconds},
               {"leaseTransitions", r.lease_transitions}};
  if (!r.acquire_time.empty()) spec["acquireTime"] = r.acquire_time;
  if (!r.renew_time.empty()) spec["renewTime"] = r.renew_time;
  return spec;
}

LeaderElectionRecord RecordFromLease(const Json& lease) {
  LeaderElectionRecord r;
  auto spec = lease.find("spec");
  if (spec == lease.end() || !spec->is_object()) return r;
  auto str = [&](const char* k) {
    auto it = spec->find(k);
    return it != spec->end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  auto num = [&](const char* k) {
    auto it = spec->find(k);
    return it != spec->end() && it->is_number_integer() ? it->get<int64_t>() : int64_t{0};
  };
  r.holder_identity = str("holderIdentity");
  r.lease_duration_seconds = num("leaseDurationSeconds");
  r.acquire_time = str("acquireTime");
  r.renew_time = str("renewTime");
  r.lease_transitions = num("leaseTransitions");
  return r;
}

StatusOr<std::unique_ptr<LeaderElector>> LeaderElector::Create(Client* client,
                                                               LeaderElectionConfig config) {
  if (config.lease_name.empty() || config.lease_namespace.empty()) {
    return InvalidArgument("leader election: lease namespace and name are required");
  }
  if (config.identity.empty()) return InvalidArgument("leader election: identity is required");
  if (config.lease_duration <= config.renew_deadline) {
    return InvalidArgument("leader election: lease duration must exceed the renew deadline");
  }
  if (config.renew_deadline <= config.retry_period * 1.2) {
    return InvalidArgument(
        "leader election: renew deadline must exceed 1.2 × the retry period (the jitter)");
  }
  if (config.retry_period <= Clock::Duration::zero()) {
    return InvalidArgument("leader election: retry period must be positive");
  }
  return std::unique_ptr<LeaderElector>(new LeaderElector(client, std::move(config)));
}

LeaderElector::LeaderElector(Client* client, LeaderElectionConfig config)
    : client_(client), config_(std::move(config)), clock_(client->clock()) {
  uniform01_ = config_.uniform01;
  if (!uniform01_) {
    auto rng = std::make_shared<std::mt19937_64>(std::random_device{}());
    uniform01_ = [rng] { return std::uniform_real_distribution<double>(0.0, 1.0)(*rng); };
  }
}

void LeaderElector::Log(LogLevel level, const std::string& message) const {
  client_->logger()(level, "leader election " + config_.lease_namespace + "/" + config_.lease_name +
                               " (" + config_.identity + "): " + message);
}

std::string LeaderElector::NowString() const {
  auto now = config_.wall_clock ? config_.wall_clock() : std::chrono::system_clock::now();
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(us / 1'000'000);
  std::tm tm;
  gmtime_r(&secs, &tm);
  char buf[64];
  size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%06lldZ", static_cast<long long>(us % 1'000'000));
  return buf;
}

bool LeaderElector::IsLeader() const {
  std::lock_guard<std::mutex> lock(mu_);
  // Like client-go, also false as soon as we have seen someone else hold the lease, even
  // before our renew deadline makes us step down.
  return leading_ && observed_.holder_identity == config_.identity;
}

std::string LeaderElector::GetLeader() const {
  std::lock_guard<std::mutex> lock(mu_);
  return observed_.holder_identity;
}

bool LeaderElector::StopRequested() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stop_;
}

void LeaderElector::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stop_ = true;
  cv_.notify_all();
}

bool LeaderElector::Sleep(Clock::Duration d) {
  std::unique_lock<std::mutex> lock(mu_);
  WaitUntil(clock_, cv_, lock, clock_->Now() + d, [&] { return stop_; });
  return !stop_;
}

void LeaderElector::ObserveLocked(const LeaderElectionRecord& record, const std::string& raw) {
  observed_ = record;
  observed_raw_ = raw;
  observed_time_ = clock_->Now();
}

void LeaderElector::ReportNewLeader() {
  std::string leader;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (reported_once_ && reported_leader_ == observed_.holder_identity) return;
    reported_once_ = true;
    reported_leader_ = observed_.holder_identity;
    leader = reported_leader_;
  }
  if (leader.empty()) return;
  Log(LogLevel::kInfo, "new leader: " + leader);
  if (config_.callbacks.on_new_leader) config_.callbacks.on_new_leader(leader);
}

bool LeaderElector::TryAcquireOrRenew() {
  const auto gvr = resources::Leases();
  CallOptions call;
  // An attempt that cannot finish within the renew deadline is worthless to a leader.
  call.deadline = clock_->Now() + config_.renew_deadline;
  LeaderElectionRecord desired;
  desired.holder_identity = config_.identity;
  desired.lease_duration_seconds =
      std::max<int64_t>(1, std::chrono::ceil<std::chrono::seconds>(config_.lease_duration).count());
  desired.acquire_time = desired.renew_time = NowString();

  auto got = client_->Get(gvr, config_.lease_namespace, config_.lease_name, call);
  if (!got.ok()) {
    if (!IsNotFound(got.status())) {
      Log(LogLevel::kWarning, "cannot read the lease: " + got.status().ToString());
      return false;
    }
    Json lease = {
        {"apiVersion", "coordination.k8s.io/v1"},
        {"kind", "Lease"},
        {"metadata", {{"name", config_.lease_name}, {"namespace", config_.lease_namespace}}},
        {"spec", LeaseSpecFromRecord(desired)}};
    auto created = client_->Create(gvr, lease, call);
    if (!created.ok()) {
      Log(IsAlreadyExists(created.status()) ? LogLevel::kInfo : LogLevel::kWarning,
          "cannot create the lease: " + created.status().ToString());
      return false;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ObserveLocked(desired, (*created)["spec"].dump());
    }
    ReportNewLeader();
    return true;
  }

  LeaderElectionRecord old = RecordFromLease(*got);
  const std::string raw = (*got)["spec"].dump();
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Expiry is measured from when WE saw the record change, on OUR clock.
    if (raw != observed_raw_) ObserveLocked(old, raw);
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    Clock::Duration held = old.lease_duration_seconds > 0
                               ? Clock::Duration(std::chrono::seconds(old.lease_duration_seconds))
                               : config_.lease_duration;
    if (!old.holder_identity.empty() && old.holder_identity != config_.identity &&
        observed_time_ + held > clock_->Now()) {
      lock.unlock();
      ReportNewLeader();
      return false;
    }
  }
  if (old.holder_identity == config_.identity) {
    desired.acquire_time = old.acquire_time;
    desired.lease_transitions = old.lease_transitions;
  } else {
    desired.lease_transitions = old.lease_transitions + 1;
  }
  Json lease = std::move(got).value();
  lease["spec"] = LeaseSpecFromRecord(desired);  // metadata.resourceVersion is the guard
  auto updated = client_->Update(gvr, lease, call);
  if (!updated.ok()) {
    Log(IsConflict(updated.status()) ? LogLevel::kDebug : LogLevel::kWarning,
        "cannot update the lease: " + updated.status().ToString());
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ObserveLocked(desired, (*updated)["spec"].dump());
  }
  ReportNewLeader();
  return true;
}

void LeaderElector::Release() {
  const auto gvr = resources::Leases();
  CallOptions call;
  call.deadline = clock_->Now() + config_.renew_deadline;
  auto got = client_->Get(gvr, config_.lease_namespace, config_.lease_name, call);
  if (!got.ok()) {
    Log(LogLevel::kWarning, "cannot release the lease: " + got.status().ToString());
    return;
  }
  LeaderElectionRecord old = RecordFromLease(*got);
  if (old.holder_identity != config_.identity) return;
  LeaderElectionRecord r;
  r.lease_duration_seconds = 1;
  r.acquire_time = r.renew_time = NowString();
  r.lease_transitions = old.lease_transitions;
  Json lease = std::move(got).value();
  lease["spec"] = LeaseSpecFromRecord(r);
  auto updated = client_->Update(gvr, lease, call);
  if (!updated.ok()) {
    Log(LogLevel::kWarning, "cannot release the lease: " + updated.status().ToString());
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  ObserveLocked(r, (*updated)["spec"].dump());
  Log(LogLevel::kInfo, "released the lease");
}

void LeaderElector::Run() {
  // Campaign: followers retry every retry period plus up to 120 % jitter (client-go's
  // JitterUntil factor), so candidates do not hammer the lease in lockstep.
  for (;;) {
    if (StopRequested()) return;
    if (TryAcquireOrRenew()) break;
    auto wait = std::chrono::duration_cast<Clock::Duration>(config_.retry_period *
                                                            (1.0 + 1.2 * uniform01_()));
    if (!Sleep(wait)) return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    leading_ = true;
  }
  Log(LogLevel::kInfo, "acquired the lease");
  if (config_.callbacks.on_started_leading) config_.callbacks.on_started_leading();

  auto last_renew = clock_->Now();
  for (;;) {
    if (!Sleep(config_.retry_period)) break;
    if (TryAcquireOrRenew()) {
      last_renew = clock_->Now();
      continue;
    }
    if (clock_->Now() - last_renew >= config_.renew_deadline) {
      Log(LogLevel::kError, "could not renew the lease within the renew deadline; leadership lost");
      break;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    leading_ = false;
  }
  if (StopRequested() && config_.release_on_stop) Release();
  if (config_.callbacks.on_stopped_leading) config_.callbacks.on_stopped_leading();
}

}  // namespace spawnpoint::kube
