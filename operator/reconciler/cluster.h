// What the reconciler may see and do: reads come from the informer caches (they may lag
// behind the API server; the reconciler is written so that acting on a stale read is
// harmless: deterministic names make a repeated create an AlreadyExists, and the status
// write's resourceVersion precondition turns a stale decision into a Conflict), writes go
// to the API server and return its errors as Status values (errors.h mapping: 404
// kNotFound, 409 kAlreadyExists/kConflict, 422 kInvalidArgument, 429/5xx kUnavailable).
// Implementations must be thread-safe: several workers reconcile different jobs at once.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace spawnpoint::op {

enum class EventType { kNormal, kWarning };

class Cluster {
 public:
  virtual ~Cluster() = default;

  // Reads (cache).
  virtual std::optional<nlohmann::json> GetJob(const std::string& ns, const std::string& name) = 0;
  // Pods whose controller is the job with this UID.
  virtual std::vector<nlohmann::json> ListPods(const std::string& ns,
                                               const std::string& job_uid) = 0;
  virtual std::optional<nlohmann::json> GetService(const std::string& ns,
                                                   const std::string& name) = 0;
  // A live read (not the cache): is this incarnation of the job still there and not being
  // deleted? Asked once before creating children, so that a reconcile acting on a cache
  // that has not seen the job's deletion yet does not recreate what garbage collection
  // just removed.
  virtual StatusOr<bool> JobIsLive(const std::string& ns, const std::string& name,
                                   const std::string& uid) = 0;

  // Writes (API server).
  virtual StatusOr<nlohmann::json> CreatePod(const nlohmann::json& pod) = 0;
  // A dry-run create of `pod` (dryRun=All): the API server admits it as it would a real one
  // (ResourceQuota included) and stores nothing; its answer as a Status.
  virtual Status CheckPodCreate(const nlohmann::json& pod) = 0;
  // Deletes only the incarnation with this UID (a precondition): never a successor.
  virtual Status DeletePod(const std::string& ns, const std::string& name,
                           const std::string& uid) = 0;
  virtual StatusOr<nlohmann::json> CreateService(const nlohmann::json& service) = 0;
  virtual Status DeleteService(const std::string& ns, const std::string& name,
                               const std::string& uid) = 0;
  // Creates a Secret (the gang token); never read back: AlreadyExists means it is there.
  virtual StatusOr<nlohmann::json> CreateSecret(const nlohmann::json& secret) = 0;
  // Creates the job's Volcano PodGroup (scheduling.volcano.sh/v1beta1, gang volcano); never read
  // back: AlreadyExists means it is there.
  virtual StatusOr<nlohmann::json> CreatePodGroup(const nlohmann::json& pod_group) = 0;
  // Deletes the PodGroup of this name (it is named after the job's UID: never a successor's).
  virtual Status DeletePodGroup(const std::string& ns, const std::string& name) = 0;
  // Gang kueue: merges `annotations` into the pod's (a merge patch carrying the UID, so a
  // successor of the same name is never touched: kConflict or kInvalidArgument then).
  virtual Status AnnotatePod(const std::string& ns, const std::string& name, const std::string& uid,
                             const nlohmann::json& annotations) = 0;
  // Gang kueue: Kueue's Workload of this name (kueue.x-k8s.io/v1beta2), a live read (Workloads
  // are not watched); kNotFound when there is none.
  virtual StatusOr<nlohmann::json> GetKueueWorkload(const std::string& ns,
                                                    const std::string& name) = 0;
  // PUT .../status with the object's resourceVersion as precondition.
  virtual StatusOr<nlohmann::json> UpdateJobStatus(const nlohmann::json& job) = 0;
  // Deletes the job (its children are garbage-collected through their owner references).
  virtual Status DeleteJob(const std::string& ns, const std::string& name,
                           const std::string& uid) = 0;
  // Best effort, never blocks the reconcile on the API server.
  virtual void RecordEvent(const nlohmann::json& job, EventType type, const std::string& reason,
                           const std::string& message) = 0;
};

}  // namespace spawnpoint::op
