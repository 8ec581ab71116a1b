#include "operator/controller/controller.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "operator/common/names.h"
#include "operator/common/object.h"
#include "operator/kube/errors.h"
#include "operator/reconciler/job_status.h"

namespace spawnpoint::op {
namespace {

// What the reconciler reads of a child: metadata (without managedFields) and, for pods,
// the status and spec.schedulingGates (Kueue's, admission_policy.h). The rest of a pod's spec
// (with the job's JSON in an env var) is the bulk of a pod and is never read, so the cache
// does not keep it.
void TrimChild(nlohmann::json& object) {
  kube::StripManagedFields(object);
  auto spec = object.find("spec");
  if (spec != object.end() && spec->is_object() && spec->contains("schedulingGates")) {
    nlohmann::json gates = std::move((*spec)["schedulingGates"]);
    *spec = nlohmann::json{{"schedulingGates", std::move(gates)}};
  } else {
    object.erase("spec");
  }
  auto status = object.find("status");
  if (status != object.end() && status->is_object()) {
    for (const char* drop : {"hostIPs", "podIPs", "qosClass", "ephemeralContainerStatuses"}) {
      status->erase(drop);
    }
  }
}

kube::InformerOptions ChildInformerOptions(const ControllerOptions& o) {
  kube::InformerOptions io;
  io.namespaces = o.namespaces;
  io.label_selector = kJobNameLabel;  // exists: only the children of TrainingJobs
  io.transform = TrimChild;
  return io;
}

// A ResourceQuota's change is all the controller needs of it: its name and namespace.
void TrimQuota(nlohmann::json& object) {
  kube::StripManagedFields(object);
  object.erase("spec");
  object.erase("status");
}

kube::InformerOptions QuotaInformerOptions(const ControllerOptions& o) {
  kube::InformerOptions io;
  io.namespaces = o.namespaces;
  io.transform = TrimQuota;
  return io;
}

bool QuotaRefused(const nlohmann::json& job) {
  const nlohmann::json* c = FindCondition(job, condition::kQuotaExceeded);
  return c != nullptr && c->value("status", "") == "True";
}

kube::InformerOptions JobInformerOptions(const ControllerOptions& o) {
  kube::InformerOptions io;
  io.namespaces = o.namespaces;
  io.resync_period = o.resync_period;
  return io;
}

}  // namespace

Controller::Controller(kube::Client* client, const WallClock* clock, ControllerOptions options,
                       OperatorMetrics* metrics, UtilisationSource* utilisation, Logger log)
    : client_(client),
      clock_(clock),
      options_(std::move(options)),
      metrics_(metrics),
      log_(std::move(log)),
      jobs_(client, kube::resources::TrainingJobs(), JobInformerOptions(options_)),
      pods_(client, kube::resources::Pods(), ChildInformerOptions(options_)),
      services_(client, kube::resources::Services(), ChildInformerOptions(options_)),
      queue_(clock->clock(),
             {.name = "trainingjobs", .metrics = metrics ? metrics->QueueHooks() : nullptr}),
      events_(client, clock, options_.instance, log_),
      cluster_(client, &jobs_.store(), &pods_.store(), &services_.store(), &events_),
      reconciler_(&cluster_, clock, options_.reconciler, utilisation) {
  kube::EventHandler on_job;
  on_job.on_add = [this](const kube::ObjectPtr& o) { queue_.Add(kube::ObjectKey(*o)); };
  on_job.on_update = [this](const kube::ObjectPtr&, const kube::ObjectPtr& o) {
    queue_.Add(kube::ObjectKey(*o));
  };
  on_job.on_delete = [this](const kube::ObjectPtr& o, bool) { queue_.Add(kube::ObjectKey(*o)); };
  jobs_.AddEventHandler(on_job);

  kube::EventHandler on_child;
  on_child.on_add = [this](const kube::ObjectPtr& o) { EnqueueOwner(o); };
  on_child.on_update = [this](const kube::ObjectPtr& old_object, const kube::ObjectPtr& o) {
    EnqueueOwner(o);
  };
  on_child.on_delete = [this](const kube::ObjectPtr& o, bool) { EnqueueOwner(o); };
  pods_.AddEventHandler(on_child);
  services_.AddEventHandler(on_child);

  if (options_.watch_quotas) {
    quotas_ = std::make_unique<kube::Informer>(client, kube::resources::ResourceQuotas(),
                                               QuotaInformerOptions(options_));
    // Every change: the quota controller rewrites status.used as pods come and go, so this also
    // fires when another job's pods free their share. A resourceVersion-only change (a trimmed
    // object compares equal) still counts.
    kube::EventHandler on_quota;
    on_quota.on_add = [this](const kube::ObjectPtr& o) { EnqueueQuotaRefused(NamespaceOf(*o)); };
    on_quota.on_update = [this](const kube::ObjectPtr&, const kube::ObjectPtr& o) {
      EnqueueQuotaRefused(NamespaceOf(*o));
    };
    on_quota.on_delete = [this](const kube::ObjectPtr& o, bool) {
      EnqueueQuotaRefused(NamespaceOf(*o));
    };
    quotas_->AddEventHandler(on_quota);
  }
}

Controller::~Controller() { Stop(); }

void Controller::EnqueueOwner(const kube::ObjectPtr& object) {
  std::string job = ControllingJobName(*object);
  if (job.empty()) return;
  queue_.Add(NamespaceOf(*object) + "/" + job);
}

void Controller::EnqueueQuotaRefused(const std::string& ns) {
  for (const auto& job : jobs_.store().ByIndex(kube::kNamespaceIndex, ns)) {
    if (QuotaRefused(*job)) queue_.Add(ns + "/" + NameOf(*job));
  }
}

void Controller::Enqueue(const std::string& ns, const std::string& name) {
  queue_.Add(ns + "/" + name);
}

void Controller::StartInformers() {
  jobs_.Start();
  pods_.Start();
  services_.Start();
  if (quotas_) quotas_->Start();
}

bool Controller::HasSynced() const {
  return jobs_.HasSynced() && pods_.HasSynced() && services_.HasSynced();
}

bool Controller::WaitForSync(std::chrono::milliseconds timeout) const {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const kube::Informer* i : {&jobs_, &pods_, &services_}) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() < 0 || !i->WaitForSync(left)) return false;
  }
  return true;
}

void Controller::StartWorkers() {
  if (workers_started_.exchange(true)) return;
  log_.Info("starting workers", {{"workers", options_.workers}});
  for (int i = 0; i < options_.workers; ++i) {
    workers_.emplace_back([this, i] { Worker(i); });
  }
}

void Controller::Stop() {
  if (stopped_.exchange(true)) return;
  queue_.ShutDown();
  for (auto& t : workers_) t.join();
  workers_.clear();
  jobs_.Stop();
  pods_.Stop();
  services_.Stop();
  if (quotas_) quotas_->Stop();
  events_.Stop();
}

void Controller::Worker(int index) {
  while (auto key = queue_.Get()) {
    ProcessKey(*key);
    queue_.Done(*key);
  }
}

void Controller::ProcessKey(const std::string& key) {
  char id[24];
  snprintf(id, sizeof id, "r%llu",
           static_cast<unsigned long long>(reconcile_seq_.fetch_add(1) + 1));
  const Logger log = log_.With({{"job", key}, {"reconcile", id}});
  auto [ns, name] = kube::SplitKey(key);
  Clock* clock = clock_->clock();
  const auto start = clock->Now();
  ReconcileResult result;
  try {
    result = reconciler_.Reconcile(ns, name, log);
  } catch (const std::exception& e) {
    result.status = Internal(std::string("reconcile threw: ") + e.what());
  }
  const double seconds = std::chrono::duration<double>(clock->Now() - start).count();
  if (result.status_written && metrics_) {
    metrics_->ObserveStatusWrite(ns, result.previous_phase, result.phase, result.previous_restarts,
                                 result.restarts, result.admission_wait);
  }

  const Status& s = result.status;
  std::string outcome = "success";
  if (s.ok()) {
    queue_.Forget(key);
    if (result.requeue_after) {
      queue_.AddAfter(key, *result.requeue_after);
      outcome = "requeue";
    }
  } else if (s.code() == StatusCode::kConflict || s.code() == StatusCode::kAlreadyExists) {
    // A stale cache: look again once the informer caught up.
    log.Debug("conflict, requeued", {{"error", s.message()}});
    queue_.AddRateLimited(key);
    outcome = "requeue";
  } else if (kube::IsRetryable(s) || s.code() == StatusCode::kInternal ||
             s.code() == StatusCode::kNotFound) {
    log.Warning("reconcile failed, will retry", {{"error", s.message()}});
    queue_.AddRateLimited(key);
    outcome = "error";
  } else {
    // 422, 403, 401: retrying the same request cannot help; the next change brings the key back.
    log.Error("reconcile failed", {{"error", s.message()}});
    queue_.Forget(key);
    if (result.requeue_after) queue_.AddAfter(key, *result.requeue_after);
    outcome = "error";
  }
  if (metrics_) metrics_->ObserveReconcile(seconds, outcome);
}

std::string Controller::StatusToken(const nlohmann::json& job) const {
  const StatusTokens* tokens = options_.reconciler.status_tokens;
  return tokens != nullptr ? tokens->For(NamespaceOf(job), NameOf(job), UidOf(job)) : "";
}

std::vector<RunningJob> Controller::RunningJobs() const {
  std::vector<RunningJob> out;
  for (const auto& job : jobs_.store().List()) {
    if (Str(*job, "/status/phase"_json_pointer) != "Running") continue;
    RunningJob r{NamespaceOf(*job), NameOf(*job), {}};
    r.token = StatusToken(*job);
    const auto ratio = "/spec/stallPolicy/stragglerRatio"_json_pointer;
    if (job->contains(ratio) && job->at(ratio).is_number()) {
      r.straggler_ratio = job->at(ratio).get<double>();
    }
    const auto straggler = "/status/straggler"_json_pointer;
    if (job->contains(straggler) && job->at(straggler).is_object()) {
      r.straggler = job->at(straggler);
    }
    for (const auto& pod : pods_.store().ByIndex(kube::kOwnerUidIndex, UidOf(*job))) {
      if (!OfCurrentGang(*job, *pod) || PodPhase(*pod) != "Running") continue;
      std::string ip = Str(*pod, "/status/podIP"_json_pointer);
      if (!ip.empty()) r.pods.emplace_back(NameOf(*pod), ip);
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<GangJob> Controller::GangJobs() const {
  std::vector<GangJob> out;
  for (const auto& job : jobs_.store().List()) {
    const std::string phase = Str(*job, "/status/phase"_json_pointer);
    if (phase != "Running" && phase != "Restarting") continue;
    const auto mode = "/spec/restartPolicy/mode"_json_pointer;
    const auto nodes = "/spec/nodes"_json_pointer;
    if (job->contains(mode) && job->at(mode) != "InPlace") continue;
    if (!job->contains(nodes) || !job->at(nodes).is_number_integer() || job->at(nodes) < 2)
      continue;
    std::vector<std::tuple<int, std::string, std::string>> pods;
    for (const auto& pod : pods_.store().ByIndex(kube::kOwnerUidIndex, UidOf(*job))) {
      if (!OfCurrentGang(*job, *pod) || PodPhase(*pod) != "Running" || IsTerminating(*pod)) {
        continue;
      }
      std::string ip = Str(*pod, "/status/podIP"_json_pointer);
      if (!ip.empty()) pods.emplace_back(NodeRankOf(*pod), NameOf(*pod), ip);
    }
    std::sort(pods.begin(), pods.end());
    GangJob g{NamespaceOf(*job), NameOf(*job), {}};
    g.token = StatusToken(*job);
    for (auto& [node, name, ip] : pods) g.pods.emplace_back(std::move(name), std::move(ip));
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace spawnpoint::op
