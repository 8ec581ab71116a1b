// An in-memory Cluster for reconciler unit tests: jobs, pods and services with UIDs,
// resourceVersions (status writes check them), creationTimestamps from the test's
// WallClock, scripted write failures, a log of every write and of recorded events. Reads
// see the state immediately (a perfectly fresh cache) unless a test freezes them.
// Thread-safe.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "operator/common/wall_clock.h"
#include "operator/reconciler/cluster.h"

namespace spawnpoint::op::testing {

using nlohmann::json;

struct RecordedEvent {
  EventType type;
  std::string reason;
  std::string message;
};

class FakeCluster : public Cluster {
 public:
  explicit FakeCluster(const WallClock* clock) : clock_(clock) {}

  // Test setup and inspection.
  json AddJob(json job);  // fills uid, resourceVersion, generation, creationTimestamp
  json* Job(const std::string& name);
  // Replaces the spec (generation + 1), as kubectl apply would.
  void UpdateSpec(const std::string& name, const std::function<void(json& spec)>& change);
  json* Pod(const std::string& name);
  std::vector<std::string> PodNames() const;
  bool HasService(const std::string& name) const;
  json* Secret(const std::string& name);
  json* PodGroup(const std::string& name);  // nullptr when there is none
  void SetPodPhase(const std::string& name, const std::string& phase);
  // Pod Failed with the trainer's terminated state (exit code, reason, message).
  void FailPod(const std::string& name, int exit_code, const std::string& reason = "Error",
               const std::string& message = "", const std::string& finished_at = "");
  void RemovePod(const std::string& name);  // as if its deletion completed
  // Deletions leave pods terminating (deletionTimestamp) until FinishDeletions().
  void SetGracefulDeletion(bool graceful) { graceful_ = graceful; }
  // Changes every pod as it is created, as a mutating admission webhook would (Kueue's gates).
  void SetPodWebhook(std::function<void(json& pod)> webhook) { pod_webhook_ = std::move(webhook); }
  void FinishDeletions();

  // The next `count` calls of `op` ("create-pod", "delete-pod", "create-service", "create-secret",
  // "create-podgroup", "delete-podgroup", "annotate-pod", "get-workload", "check-pod" (the
  // dry-run create, never in Writes()), "update-status",
  // "delete-job") fail with `status`.
  void FailNext(const std::string& op, Status status, int count = 1);
  std::vector<std::string> Writes() const;  // "create-pod x-node-0", "update-status x", ...
  void ClearWrites();
  std::vector<RecordedEvent> Events() const;
  int EventCount(const std::string& reason) const;  // recorded events with this reason
  // The job's status.conditions entry of this type, or an empty object.
  json JobCondition(const std::string& job, const std::string& type);
  int StatusWrites() const;

  // Cluster.
  std::optional<json> GetJob(const std::string& ns, const std::string& name) override;
  std::vector<json> ListPods(const std::string& ns, const std::string& job_uid) override;
  std::optional<json> GetService(const std::string& ns, const std::string& name) override;
  StatusOr<bool> JobIsLive(const std::string& ns, const std::string& name,
                           const std::string& uid) override;
  // Makes JobIsLive answer false, as if the job was deleted after the cache was read.
  void SetJobGoneForLiveReads(bool gone) { gone_for_live_reads_ = gone; }
  StatusOr<json> CreatePod(const json& pod) override;
  Status CheckPodCreate(const json& pod) override;
  // A ResourceQuota "gpu-quota" of `gpus` requests.nvidia.com/gpu (-1: none), held by the
  // pods that are not terminal or being deleted; CreatePod and CheckPodCreate refuse a pod
  // beyond it as the API server does (403, "exceeded quota").
  void SetGpuQuota(int gpus) { gpu_quota_ = gpus; }
  Status DeletePod(const std::string& ns, const std::string& name, const std::string& uid) override;
  StatusOr<json> CreateService(const json& service) override;
  Status DeleteService(const std::string& ns, const std::string& name,
                       const std::string& uid) override;
  StatusOr<json> CreateSecret(const json& secret) override;
  StatusOr<json> CreatePodGroup(const json& pod_group) override;
  Status DeletePodGroup(const std::string& ns, const std::string& name) override;
  Status AnnotatePod(const std::string& ns, const std::string& name, const std::string& uid,
                     const json& annotations) override;
  StatusOr<json> GetKueueWorkload(const std::string& ns, const std::string& name) override;
  // Kueue's Workload as GetKueueWorkload reads it (gang kueue); nullptr-like absent by default.
  void SetKueueWorkload(const std::string& name, json workload);
  StatusOr<json> UpdateJobStatus(const json& job) override;
  Status DeleteJob(const std::string& ns, const std::string& name, const std::string& uid) override;
  void RecordEvent(const json& job, EventType type, const std::string& reason,
                   const std::string& message) override;

 private:
  bool Injected(const std::string& op, Status* status);
  void Stamp(json& object);
  void Log(const std::string& write);

  const WallClock* const clock_;
  mutable std::mutex mu_;
  std::map<std::string, json> jobs_, pods_, services_, secrets_, pod_groups_, workloads_;
  std::map<std::string, std::deque<Status>> faults_;
  std::vector<std::string> writes_;
  std::vector<RecordedEvent> events_;
  int64_t next_rv_ = 100;
  int64_t next_uid_ = 1;
  bool graceful_ = false;
  std::function<void(json& pod)> pod_webhook_;
  int gpu_quota_ = -1;
  Status QuotaCheckLocked(const json& pod) const;
  bool gone_for_live_reads_ = false;
};

}  // namespace spawnpoint::op::testing
