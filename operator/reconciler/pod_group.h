// What a TrainingJob's pods carry for the gang scheduler its spec.scheduling names (issue 40),
// and the Volcano PodGroup of the job (pure functions; thread-safe):
//  - volcano: one PodGroup (scheduling.volcano.sh/v1beta1) <job>-<the first 8 characters of
//    its UID>, owned by the job (controller reference), with minMember = spec.nodes,
//    minResources = the sum of the pods' requests as BuildPod makes them (every container's
//    requests, a limit standing for a request it lacks, an init container counting when it
//    asks more than the containers together: the pod's effective request as the schedulers
//    reckon it), the queue and the priorityClassName. Every pod gets schedulerName volcano and
//    the annotation scheduling.k8s.io/group-name (without it Volcano makes a group per pod).
//    The group lives as long as the job runs: a recreated gang or a lost pod's replacement
//    joins it again, and its minMember never changes.
//  - kueue: every pod is one of a Kueue plain-pod group: label kueue.x-k8s.io/queue-name (the
//    LocalQueue), label kueue.x-k8s.io/pod-group-name (the same group name) and annotation
//    kueue.x-k8s.io/pod-group-total-count (spec.nodes). Kueue's webhook then gates the pods
//    until the group is admitted.
//  - any: spec.scheduling.priorityClassName becomes the pods' priorityClassName.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "api/training_job.h"
#include "operator/reconciler/children.h"

namespace spawnpoint::op {

inline constexpr const char* kVolcanoSchedulerName = "volcano";
inline constexpr const char* kVolcanoGroupAnnotation = "scheduling.k8s.io/group-name";
inline constexpr const char* kVolcanoApiVersion = "scheduling.volcano.sh/v1beta1";
inline constexpr const char* kKueuePodGroupLabel = "kueue.x-k8s.io/pod-group-name";
inline constexpr const char* kKueueGroupTotalAnnotation = "kueue.x-k8s.io/pod-group-total-count";

// "<job>-<the first 8 characters of its UID>": at most 61 characters (a label value), and a
// group left by an earlier job of the same name is never taken for this one's.
inline std::string GangGroupName(const std::string& job, const std::string& job_uid) {
  return job + "-" + job_uid.substr(0, 8);
}

// The job's pods are scheduled by Volcano (spec.scheduling.gang volcano).
bool UsesVolcano(const api::TrainingJob& job);

// Adds to `pod` (as BuildPod makes it, for the job whose object is `owner`) what the job's
// gang scheduler reads.
void ApplyGangScheduling(const api::TrainingJob& job, const nlohmann::json& owner,
                         nlohmann::json& pod);

// A pod's effective requests ({"cpu": "1500m", "nvidia.com/gpu": "2", ...}): per resource, the
// larger of the sum over its containers and the largest init container; a container's limit
// stands for a request it does not give. Quantities are summed exactly (milli-units) and
// written as integers, or with "m" when not whole.
nlohmann::json PodRequests(const nlohmann::json& pod);
// `pods` times PodRequests(pod): what a gang of such pods asks in all.
nlohmann::json GangRequests(const nlohmann::json& pod, int pods);

// The job's PodGroup (under volcano): see above. `settings` as the pods are built with.
nlohmann::json BuildPodGroup(const api::TrainingJob& job, const nlohmann::json& owner,
                             const PodSettings& settings);

}  // namespace spawnpoint::op
