// spec.scheduling: which gang scheduler admits a TrainingJob's pods, in which queue, at which
// priority (issue 40). gang none: kube-scheduler places the pods one by one; volcano: the
// operator makes a PodGroup (scheduling.volcano.sh/v1beta1) per job and the Volcano scheduler
// binds the pods all together or none; kueue: the pods are labelled as one Kueue plain-pod
// group and queued in a LocalQueue. Kueue users name the queue with the label
// kueue.x-k8s.io/queue-name on the TrainingJob, as on any Kueue workload; that label alone
// (without spec.scheduling.gang) means gang kueue. Plain data and a decoder; thread-compatible.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace spawnpoint::api {

class FieldReader;  // api/field_reader.h, internal to api/
struct Field;

enum class GangScheduler { kNone, kVolcano, kKueue };

// The label Kueue reads a workload's LocalQueue from.
inline constexpr const char* kKueueQueueLabel = "kueue.x-k8s.io/queue-name";
// The Volcano queue of a job that names none (Volcano's own default queue).
inline constexpr const char* kVolcanoDefaultQueue = "default";

struct SchedulingSpec {
  GangScheduler gang = GangScheduler::kNone;
  // volcano: the Queue (default "default"); kueue: the LocalQueue in the job's namespace (from
  // spec.scheduling.queue or the job's kueue.x-k8s.io/queue-name label); none: empty.
  std::string queue;
  // The pods' PriorityClass (and the PodGroup's, under volcano); empty: none.
  std::string priority_class_name;
};

inline constexpr std::string_view kSchedulingFields[] = {"gang", "queue", "priorityClassName"};
inline constexpr std::string_view kGangSchedulerNames[] = {"none", "volcano", "kueue"};

const char* GangSchedulerName(GangScheduler gang);

// Decodes spec.scheduling (absent: gang none, or kueue when `metadata` carries the Kueue queue
// label) with `reader`'s located errors; `metadata_field` is the job's metadata.
Status DecodeScheduling(FieldReader& reader, const Field& field, const Field& metadata_field,
                        SchedulingSpec* scheduling);
// The settings as the API spells them, defaults included.
nlohmann::json SchedulingJson(const SchedulingSpec& scheduling);

}  // namespace spawnpoint::api
