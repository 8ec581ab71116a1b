#include "operator/controller/kube_cluster.h"

#include "operator/common/object.h"

namespace spawnpoint::op {

using nlohmann::json;

KubeCluster::KubeCluster(kube::Client* client, const kube::Store* jobs, const kube::Store* pods,
                         const kube::Store* services, EventRecorder* events)
    : client_(client), jobs_(jobs), pods_(pods), services_(services), events_(events) {}

std::optional<json> KubeCluster::GetJob(const std::string& ns, const std::string& name) {
  kube::ObjectPtr job = jobs_->Get(ns, name);
  if (!job) return std::nullopt;
  return *job;
}

std::vector<json> KubeCluster::ListPods(const std::string& ns, const std::string& job_uid) {
  std::vector<json> out;
  for (const auto& pod : pods_->ByIndex(kube::kOwnerUidIndex, job_uid)) {
    if (NamespaceOf(*pod) == ns) out.push_back(*pod);
  }
  return out;
}

std::optional<json> KubeCluster::GetService(const std::string& ns, const std::string& name) {
  kube::ObjectPtr service = services_->Get(ns, name);
  if (!service) return std::nullopt;
  return *service;
}

StatusOr<bool> KubeCluster::JobIsLive(const std::string& ns, const std::string& name,
                                      const std::string& uid) {
  auto job = client_->Get(kube::resources::TrainingJobs(), ns, name);
  if (!job.ok()) {
    if (job.status().code() == StatusCode::kNotFound) return false;
    return job.status();
  }
  return UidOf(*job) == uid && !IsTerminating(*job);
}

StatusOr<json> KubeCluster::CreatePod(const json& pod) {
  return client_->Create(kube::resources::Pods(), pod);
}

Status KubeCluster::CheckPodCreate(const json& pod) {
  kube::CallOptions call;
  call.dry_run = true;
  auto checked = client_->Create(kube::resources::Pods(), pod, call);
  return checked.ok() ? Status::Ok() : checked.status();
}

Status KubeCluster::DeletePod(const std::string& ns, const std::string& name,
                              const std::string& uid) {
  kube::DeleteOptions options;
  options.precondition_uid = uid;
  options.propagation_policy = "Background";
  auto deleted = client_->Delete(kube::resources::Pods(), ns, name, options);
  return deleted.ok() ? Status::Ok() : deleted.status();
}

StatusOr<json> KubeCluster::CreateService(const json& service) {
  return client_->Create(kube::resources::Services(), service);
}

StatusOr<json> KubeCluster::CreateSecret(const json& secret) {
  return client_->Create(kube::resources::Secrets(), secret);
}

Status KubeCluster::DeleteService(const std::string& ns, const std::string& name,
                                  const std::string& uid) {
  kube::DeleteOptions options;
  options.precondition_uid = uid;
  auto deleted = client_->Delete(kube::resources::Services(), ns, name, options);
  return deleted.ok() ? Status::Ok() : deleted.status();
}

StatusOr<json> KubeCluster::CreatePodGroup(const json& pod_group) {
  return client_->Create(kube::resources::PodGroups(), pod_group);
}

Status KubeCluster::DeletePodGroup(const std::string& ns, const std::string& name) {
  kube::DeleteOptions options;
  options.propagation_policy = "Background";
  auto deleted = client_->Delete(kube::resources::PodGroups(), ns, name, options);
  return deleted.ok() ? Status::Ok() : deleted.status();
}

Status KubeCluster::AnnotatePod(const std::string& ns, const std::string& name,
                                const std::string& uid, const json& annotations) {
  json patch = {{"metadata", {{"uid", uid}, {"annotations", annotations}}}};
  auto patched = client_->Patch(kube::resources::Pods(), ns, name, patch);
  return patched.ok() ? Status::Ok() : patched.status();
}

StatusOr<json> KubeCluster::GetKueueWorkload(const std::string& ns, const std::string& name) {
  return client_->Get(kube::resources::KueueWorkloads(), ns, name);
}

StatusOr<json> KubeCluster::UpdateJobStatus(const json& job) {
  return client_->UpdateStatus(kube::resources::TrainingJobs(), job);
}

Status KubeCluster::DeleteJob(const std::string& ns, const std::string& name,
                              const std::string& uid) {
  kube::DeleteOptions options;
  options.precondition_uid = uid;
  options.propagation_policy = "Background";
  auto deleted = client_->Delete(kube::resources::TrainingJobs(), ns, name, options);
  return deleted.ok() ? Status::Ok() : deleted.status();
}

void KubeCluster::RecordEvent(const json& job, EventType type, const std::string& reason,
                              const std::string& message) {
  if (events_) events_->Record(job, type, reason, message);
}

}  // namespace spawnpoint::op
