// What Kueue's plain-pod groups ask of the pods' owner (issue 40), as Kueue v0.19's pod
// integration (pkg/controller/jobs/pod) behaves:
//  - Kueue keeps its finalizer (kueue.x-k8s.io/managed) on a Failed pod of an admitted group
//    until a replacement of the same group exists, so a replacement can never take the failed
//    pod's name: the n-th replacement of node i is "<job>-node-<i>-<n>" (KueuePodName).
//  - A pod that is neither Failed nor (being deleted and never bound) counts as one of the
//    group's active pods; with more active pods than the group's total Kueue deletes the newest
//    as excess (kueue#15424), so a node's replacement waits until its predecessor is inactive
//    (KueueCountsActive), and has been for kKueueSettle (Kueue's cache lags).
//  - When Kueue evicts the group (preemption, PodsReadyTimeout, a stopped ClusterQueue, ...) it
//    sets the pod condition TerminationTarget=True (reason "WorkloadEvictedDueTo<why>") on
//    every pod and deletes them, and never recreates them (KueueStopped).
//  - A group ends without succeeding only when no pod is active and a terminated pod carries
//    kueue.x-k8s.io/retriable-in-group: "false" (kKueueRetriableAnnotation); until then its
//    Workload keeps the quota, waiting for replacements.
// Pure functions; thread-safe.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace spawnpoint::op {

inline constexpr const char* kKueueFinalizer = "kueue.x-k8s.io/managed";
inline constexpr const char* kKueueRetriableAnnotation = "kueue.x-k8s.io/retriable-in-group";
inline constexpr const char* kKueueTerminationTarget = "TerminationTarget";

// Kueue counts `pod` among its group's active pods: not Failed, and not deleted before it was
// bound to a node (Kueue's isPodRunnableOrSucceeded).
bool KueueCountsActive(const nlohmann::json& pod);

// Kueue's view of a pod lags the operator's: a replacement made the moment its predecessor is
// seen Failed can still meet it counted active there, and be deleted as excess. So a
// predecessor must have ended this long ago (its containers' finishedAt).
inline constexpr std::chrono::seconds kKueueSettle{2};

// When the pod's containers ended (the latest terminated finishedAt, RFC 3339), "" if none did.
std::string KueueEndedAt(const nlohmann::json& pod);

// The name of a new pod for node `node` of job `job`: PodName(job, node) when no pod in `pods`
// has it, else the first of "<PodName>-1", "-2", ... that none has. Deterministic for a given
// view: a repeated reconcile asks for the same name (AlreadyExists), never a second pod.
std::string KueuePodName(const std::string& job, int node, const std::vector<nlohmann::json>& pods);

struct KueueStop {
  std::string reason;   // "Preempted", "PodsReadyTimeout", ..., or Kueue's own stop reason
  std::string message;  // Kueue's ("Preempted to accommodate a workload ...")
  std::string at;       // the condition's lastTransitionTime (RFC 3339, seconds)
};

// Kueue stopped `pod`: its condition TerminationTarget is True. The reason is the eviction's
// ("WorkloadEvictedDueToPreempted" gives "Preempted"), or Kueue's stop reason as written
// (WorkloadDeleted, NoMatchingWorkload, NotAdmitted).
std::optional<KueueStop> KueueStopped(const nlohmann::json& pod);

// The Workload's condition Finished is True: Kueue ended the group.
bool KueueWorkloadFinished(const nlohmann::json& workload);

// The message of the Workload's condition that says why it waits ("couldn't assign flavors to
// pod set main: insufficient quota for nvidia.com/gpu in flavor gpu-flavor, request > maximum
// capacity of quota (2 > 1)"): QuotaReserved False, else Admitted False, with a message; "" when
// neither says anything.
std::string KueueWaitingReason(const nlohmann::json& workload);

}  // namespace spawnpoint::op
