// Small read-only accessors for Kubernetes objects held as JSON (pods, services, jobs), so
// policies read "the pod's phase" rather than walk JSON. Missing fields read as empty / -1.
// Pure; thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace spawnpoint::op {

using Json = nlohmann::json;

std::string Str(const Json& object, const Json::json_pointer& pointer);
std::string NameOf(const Json& object);
std::string NamespaceOf(const Json& object);
std::string UidOf(const Json& object);
int64_t GenerationOf(const Json& object);
std::string LabelOf(const Json& object, const std::string& key);
std::string AnnotationOf(const Json& object, const std::string& key);
bool IsTerminating(const Json& object);  // metadata.deletionTimestamp is set

// "Pending", "Running", "Succeeded", "Failed", "Unknown" ("" if absent).
std::string PodPhase(const Json& pod);
// The spawnpoint.dev/node-rank and spawnpoint.dev/attempt labels; -1 if absent or malformed.
int NodeRankOf(const Json& pod);
int AttemptOf(const Json& pod);
// Whether `pod` belongs to the current gang of TrainingJob `job` (as cached): attempt label
// >= status.gangAttempt when set (restartPolicy.mode InPlace), else == status.restarts.
bool OfCurrentGang(const Json& job, const Json& pod);
// status.containerStatuses[] entry of the named container, or nullptr.
const Json* ContainerStatus(const Json& pod, const std::string& container);
// The object's status.conditions entry of `type` (the first), or nullptr.
const Json* FindCondition(const Json& object, const std::string& type);
// The controller ownerReference's name when it is a TrainingJob, else "".
std::string ControllingJobName(const Json& object);

}  // namespace spawnpoint::op
