// Admission by Kueue (spec.scheduling.gang kueue): Kueue's pod webhook gives every pod of the
// group scheduling gates named kueue.x-k8s.io/... (admission, topology) and removes them once
// the group's Workload is admitted. While the current attempt's pods all exist and one of them
// still carries such a gate, the job waits for admission: it shows phase Queued and the
// condition Queued (reason WaitingForAdmission), and a gated pod is not "stuck Pending": the
// pending timeout (pending_policy.h) skips it. Pods record no time for a gate's removal, so a
// pod's pending clock still counts from its creationTimestamp once its gates are gone. Pure;
// thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"

namespace spawnpoint::op {

inline constexpr const char* kKueueGatePrefix = "kueue.x-k8s.io/";

struct AdmissionCheck {
  bool waiting = false;   // all pods exist and at least one carries a Kueue gate
  bool admitted = false;  // all pods exist and none carries one
  // Neither: the group is not whole in this view (a pod being replaced, or not yet seen).
  // "waiting for admission by Kueue in queue team-a: 2 of 2 pods gated (kueue.x-k8s.io/admission)"
  std::string message;
};

// The names of the pod's scheduling gates that Kueue owns.
std::vector<std::string> KueueGates(const nlohmann::json& pod);

// `pods`: the current attempt's pods that are not going away; `nodes`: how many it has.
AdmissionCheck CheckAdmission(const std::vector<const nlohmann::json*>& pods, int nodes,
                              const std::string& queue);

// How long the gang waited for Kueue's admission, when a status write ends the wait: the
// Queued condition is True in `before` (the status as read) and False in `after` (the status
// written); the time from the one's lastTransitionTime (the operator saw the whole gang created
// and gated, or Kueue evicted it) to the other's (the gates gone). nullopt for any other write,
// or a time that does not parse. For spawnpoint_job_admission_wait_seconds.
std::optional<Clock::Duration> AdmissionWait(const nlohmann::json& before,
                                             const nlohmann::json& after);

}  // namespace spawnpoint::op
