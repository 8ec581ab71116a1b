// The production Cluster: reads from the informers' stores (TrainingJobs, the pods and
// services they own), writes through the Kubernetes client, events through the
// EventRecorder. Thread-safe (the stores and the client are).
#pragma once

#include "operator/controller/event_recorder.h"
#include "operator/kube/client.h"
#include "operator/kube/store.h"
#include "operator/reconciler/cluster.h"

namespace spawnpoint::op {

class KubeCluster : public Cluster {
 public:
  KubeCluster(kube::Client* client, const kube::Store* jobs, const kube::Store* pods,
              const kube::Store* services, EventRecorder* events);

  std::optional<nlohmann::json> GetJob(const std::string& ns, const std::string& name) override;
  std::vector<nlohmann::json> ListPods(const std::string& ns, const std::string& job_uid) override;
  std::optional<nlohmann::json> GetService(const std::string& ns, const std::string& name) override;
  StatusOr<bool> JobIsLive(const std::string& ns, const std::string& name,
                           const std::string& uid) override;
  StatusOr<nlohmann::json> CreatePod(const nlohmann::json& pod) override;
  Status CheckPodCreate(const nlohmann::json& pod) override;
  Status DeletePod(const std::string& ns, const std::string& name, const std::string& uid) override;
  StatusOr<nlohmann::json> CreateService(const nlohmann::json& service) override;
  Status DeleteService(const std::string& ns, const std::string& name,
                       const std::string& uid) override;
  StatusOr<nlohmann::json> CreateSecret(const nlohmann::json& secret) override;
  StatusOr<nlohmann::json> CreatePodGroup(const nlohmann::json& pod_group) override;
  Status DeletePodGroup(const std::string& ns, const std::string& name) override;
  Status AnnotatePod(const std::string& ns, const std::string& name, const std::string& uid,
                     const nlohmann::json& annotations) override;
  StatusOr<nlohmann::json> GetKueueWorkload(const std::string& ns,
                                            const std::string& name) override;
  StatusOr<nlohmann::json> UpdateJobStatus(const nlohmann::json& job) override;
  Status DeleteJob(const std::string& ns, const std::string& name, const std::string& uid) override;
  void RecordEvent(const nlohmann::json& job, EventType type, const std::string& reason,
                   const std::string& message) override;

 private:
  kube::Client* const client_;
  const kube::Store* const jobs_;
  const kube::Store* const pods_;
  const kube::Store* const services_;
  EventRecorder* const events_;
};

}  // namespace spawnpoint::op
