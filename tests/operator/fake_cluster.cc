#include "tests/operator/fake_cluster.h"

#include "operator/reconciler/pod_group.h"

#include "operator/common/object.h"

namespace spawnpoint::op::testing {

void FakeCluster::Stamp(json& object) {
  object["metadata"]["resourceVersion"] = std::to_string(next_rv_++);
}

void FakeCluster::Log(const std::string& write) { writes_.push_back(write); }

json FakeCluster::AddJob(json job) {
  std::lock_guard<std::mutex> lock(mu_);
  json& meta = job["metadata"];
  if (!meta.contains("namespace")) meta["namespace"] = "default";
  meta["uid"] = "job-uid-" + std::to_string(next_uid_++);
  meta["generation"] = 1;
  meta["creationTimestamp"] = FormatTime(clock_->Now());
  Stamp(job);
  jobs_[meta["name"].get<std::string>()] = job;
  return job;
}

json* FakeCluster::Job(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(name);
  return it == jobs_.end() ? nullptr : &it->second;
}

void FakeCluster::UpdateSpec(const std::string& name, const std::function<void(json&)>& change) {
  std::lock_guard<std::mutex> lock(mu_);
  json& job = jobs_.at(name);
  change(job["spec"]);
  job["metadata"]["generation"] = job["metadata"]["generation"].get<int64_t>() + 1;
  Stamp(job);
}

json* FakeCluster::Pod(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pods_.find(name);
  return it == pods_.end() ? nullptr : &it->second;
}

std::vector<std::string> FakeCluster::PodNames() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  for (const auto& [name, pod] : pods_) names.push_back(name);
  return names;
}

bool FakeCluster::HasService(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  return services_.count(name) > 0;
}

void FakeCluster::SetPodPhase(const std::string& name, const std::string& phase) {
  std::lock_guard<std::mutex> lock(mu_);
  json& pod = pods_.at(name);
  pod["status"]["phase"] = phase;
  if (phase == "Succeeded") {
    pod["status"]["containerStatuses"] =
        json::array({{{"name", "trainer"},
                      {"state", {{"terminated", {{"exitCode", 0}, {"reason", "Completed"}}}}}}});
  }
  Stamp(pod);
}

void FakeCluster::FailPod(const std::string& name, int exit_code, const std::string& reason,
                          const std::string& message, const std::string& finished_at) {
  std::lock_guard<std::mutex> lock(mu_);
  json& pod = pods_.at(name);
  json terminated = {{"exitCode", exit_code},
                     {"reason", reason},
                     {"finishedAt", finished_at.empty() ? FormatTime(clock_->Now()) : finished_at}};
  if (!message.empty()) terminated["message"] = message;
  pod["status"]["phase"] = "Failed";
  pod["status"]["containerStatuses"] =
      json::array({{{"name", "trainer"}, {"state", {{"terminated", terminated}}}}});
  Stamp(pod);
}

void FakeCluster::RemovePod(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  pods_.erase(name);
}

void FakeCluster::FinishDeletions() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = pods_.begin(); it != pods_.end();) {
    it = IsTerminating(it->second) ? pods_.erase(it) : std::next(it);
  }
}

void FakeCluster::FailNext(const std::string& op, Status status, int count) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int i = 0; i < count; ++i) faults_[op].push_back(status);
}

bool FakeCluster::Injected(const std::string& op, Status* status) {
  auto it = faults_.find(op);
  if (it == faults_.end() || it->second.empty()) return false;
  *status = it->second.front();
  it->second.pop_front();
  return true;
}

int FakeCluster::EventCount(const std::string& reason) const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& e : events_) n += e.reason == reason;
  return n;
}

json FakeCluster::JobCondition(const std::string& job, const std::string& type) {
  std::lock_guard<std::mutex> lock(mu_);
  const json status = jobs_.at(job).value("status", json::object());
  for (const auto& c : status.value("conditions", json::array())) {
    if (c.value("type", "") == type) return c;
  }
  return json::object();
}

std::vector<std::string> FakeCluster::Writes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return writes_;
}

void FakeCluster::ClearWrites() {
  std::lock_guard<std::mutex> lock(mu_);
  writes_.clear();
}

std::vector<RecordedEvent> FakeCluster::Events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

int FakeCluster::StatusWrites() const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& w : writes_) n += w.rfind("update-status", 0) == 0 ? 1 : 0;
  return n;
}

std::optional<json> FakeCluster::GetJob(const std::string& ns, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return std::nullopt;
  return it->second;
}

std::vector<json> FakeCluster::ListPods(const std::string& ns, const std::string& job_uid) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<json> out;
  for (const auto& [name, pod] : pods_) {
    for (const auto& ref : pod["metadata"].value("ownerReferences", json::array())) {
      if (ref.value("uid", "") == job_uid) out.push_back(pod);
    }
  }
  return out;
}

std::optional<json> FakeCluster::GetService(const std::string& ns, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = services_.find(name);
  if (it == services_.end()) return std::nullopt;
  return it->second;
}

StatusOr<bool> FakeCluster::JobIsLive(const std::string& ns, const std::string& name,
                                      const std::string& uid) {
  std::lock_guard<std::mutex> lock(mu_);
  Status injected;
  if (Injected("get-job", &injected)) return injected;
  auto it = jobs_.find(name);
  if (gone_for_live_reads_ || it == jobs_.end()) return false;
  return UidOf(it->second) == uid && !IsTerminating(it->second);
}

Status FakeCluster::QuotaCheckLocked(const json& pod) const {
  if (gpu_quota_ < 0) return Status::Ok();
  auto gpus = [](const json& p) -> int {
    json r = PodRequests(p);
    return r.contains("nvidia.com/gpu") ? std::stoi(r["nvidia.com/gpu"].get<std::string>()) : 0;
  };
  int used = 0;
  for (const auto& [name, p] : pods_) {
    const std::string phase = PodPhase(p);
    if (!IsTerminating(p) && phase != "Succeeded" && phase != "Failed") used += gpus(p);
  }
  const int requested = gpus(pod);
  if (requested == 0 || used + requested <= gpu_quota_) return Status::Ok();
  return Status(StatusCode::kForbidden,
                "pods \"" + NameOf(pod) + "\" is forbidden: exceeded quota: gpu-quota, " +
                    "requested: requests.nvidia.com/gpu=" + std::to_string(requested) +
                    ", used: requests.nvidia.com/gpu=" + std::to_string(used) +
                    ", limited: requests.nvidia.com/gpu=" + std::to_string(gpu_quota_));
}

Status FakeCluster::CheckPodCreate(const json& pod) {
  std::lock_guard<std::mutex> lock(mu_);
  Status injected;
  if (Injected("check-pod", &injected)) return injected;
  return QuotaCheckLocked(pod);
}

StatusOr<json> FakeCluster::CreatePod(const json& pod) {
  std::lock_guard<std::mutex> lock(mu_);
  Status injected;
  if (Injected("create-pod", &injected)) return injected;
  if (Status quota = QuotaCheckLocked(pod); !quota.ok()) return quota;
  const std::string name = pod["metadata"]["name"];
  if (pods_.count(name))
    return Status(StatusCode::kAlreadyExists, "pods \"" + name + "\" already exists");
  json p = pod;
  p["metadata"]["uid"] = "pod-uid-" + std::to_string(next_uid_++);
  p["metadata"]["creationTimestamp"] = FormatTime(clock_->Now());
  p["status"] = {{"phase", "Pending"}};
  if (pod_webhook_) pod_webhook_(p);
  Stamp(p);
  pods_[name] = p;
  Log("create-pod " + name);
  return p;
}

Status FakeCluster::DeletePod(const std::string& ns, const std::string& name,
                              const std::string& uid) {
  std::lock_guard<std::mutex> lock(mu_);
  Status injected;
  if (Injected("delete-pod", &injected)) return injected;
  auto it = pods_.find(name);
  if (it == pods_.end()) return NotFound("pods \"" + name + "\" not found");
  if (!uid.empty() && UidOf(it->second) != uid) {
    return Status(StatusCode::kConflict, "precondition failed: UID mismatch");
  }
  Log("delete-pod " + name);
  if (graceful_) {
    it->second["metadata"]["deletionTimestamp"] = FormatTime(clock_->Now());
    Stamp(it->second);
  } else {
    pods_.erase(it);
  }
  return Status::Ok();
}

StatusOr<json> FakeCluster::CreateSecret(const json& secret) {
  std::lock_guard<std::mutex> lock(mu_);
  Status injected;
  if (Injected("create-secret", &injected)) return injected;
  const std::string name = secret["metadata"]["name"];
  if (secrets_.count(name)) return Status(StatusCode::kAlreadyExists, "exists");
  json s = secret;
  s["metadata"]["uid"] = "secret-uid-" + std::to_string(next_uid_++);
  Stamp(s);
  secrets_[name] = s;
  Log("create-secret " + name);
  return s;
}

StatusOr<json> FakeCluster::CreatePodGroup(const json& pod_group) {
  std::lock_guard<std::mutex> lock(mu_);
  Status injected;
  if (Injected("create-podgroup", &injected)) return injected;
  const std::string name = pod_group["metadata"]["name"];
  if (pod_groups_.count(name)) return Status(StatusCode::kAlreadyExists, "exists");
  json g = pod_group;
  g["metadata"]["uid"] = "pg-uid-" + std::to_string(next_uid_++);
  Stamp(g);
  pod_groups_[name] = g;
  Log("create-podgroup " + name);
  return g;
}

Status FakeCluster::DeletePodGroup(const std::string& ns, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  Status injected;
  if (Injected("delete-podgroup", &injected)) return injected;
  if (!pod_groups_.erase(name)) return Status(StatusCode::kNotFound, "not found");
  Log("delete-podgroup " + name);
  return Status::Ok();
}

Status FakeCluster::AnnotatePod(const std::string& ns, const std::string& name,
                                const std::string& uid, const json& annotations) {
  std::lock_guard<std::mutex> lock(mu_);
  Status injected;
  if (Injected("annotate-pod", &injected)) return injected;
  auto it = pods_.find(name);
  if (it == pods_.end()) return NotFound("pods \"" + name + "\" not found");
  if (UidOf(it->second) != uid) {
    return Status(StatusCode::kConflict, "precondition failed: UID mismatch");
  }
  for (const auto& [key, value] : annotations.items()) {
    it->second["metadata"]["annotations"][key] = value;
  }
  Stamp(it->second);
  Log("annotate-pod " + name);
  return Status::Ok();
}

StatusOr<json> FakeCluster::GetKueueWorkload(const std::string& ns, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  Status injected;
  if (Injected("get-workload", &injected)) return injected;
  auto it = workloads_.find(name);
  if (it == workloads_.end()) return NotFound("workloads \"" + name + "\" not found");
  return it->second;
}

void FakeCluster::SetKueueWorkload(const std::string& name, json workload) {
  std::lock_guard<std::mutex> lock(mu_);
  workloads_[name] = std::move(workload);
}

json* FakeCluster::PodGroup(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pod_groups_.find(name);
  return it == pod_groups_.end() ? nullptr : &it->second;
}

json* FakeCluster::Secret(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = secrets_.find(name);
  return it == secrets_.end() ? nullptr : &it->second;
}

StatusOr<json> FakeCluster::CreateService(const json& service) {
  std::lock_guard<std::mutex> lock(mu_);
  Status injected;
  if (Injected("create-service", &injected)) return injected;
  const std::string name = service["metadata"]["name"];
  if (services_.count(name)) return Status(StatusCode::kAlreadyExists, "exists");
  json s = service;
  s["metadata"]["uid"] = "svc-uid-" + std::to_string(next_uid_++);
  Stamp(s);
  services_[name] = s;
  Log("create-service " + name);
  return s;
}

Status FakeCluster::DeleteService(const std::string& ns, const std::string& name,
                                  const std::string& uid) {
  std::lock_guard<std::mutex> lock(mu_);
  Status injected;
  if (Injected("delete-service", &injected)) return injected;
  if (!services_.erase(name)) return NotFound("services \"" + name + "\" not found");
  Log("delete-service " + name);
  return Status::Ok();
}

StatusOr<json> FakeCluster::UpdateJobStatus(const json& job) {
  std::lock_guard<std::mutex> lock(mu_);
  Status injected;
  if (Injected("update-status", &injected)) return injected;
  const std::string name = job["metadata"]["name"];
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return NotFound("not found");
  if (job["metadata"].value("resourceVersion", "") !=
      it->second["metadata"].value("resourceVersion", "")) {
    return Status(StatusCode::kConflict, "the object has been modified");
  }
  it->second["status"] = job["status"];
  Stamp(it->second);
  Log("update-status " + name);
  return it->second;
}

Status FakeCluster::DeleteJob(const std::string& ns, const std::string& name,
                              const std::string& uid) {
  std::lock_guard<std::mutex> lock(mu_);
  Status injected;
  if (Injected("delete-job", &injected)) return injected;
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return NotFound("not found");
  // Garbage collection of the children, as the API server would.
  for (auto p = pods_.begin(); p != pods_.end();) {
    p = ControllingJobName(p->second) == name ? pods_.erase(p) : std::next(p);
  }
  services_.erase(name);
  jobs_.erase(it);
  Log("delete-job " + name);
  return Status::Ok();
}

void FakeCluster::RecordEvent(const json& job, EventType type, const std::string& reason,
                              const std::string& message) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back({type, reason, message});
}

}  // namespace spawnpoint::op::testing
