// Pods stuck Pending: a pod of the current attempt still Pending (not running, not being
// deleted) longer than the operator's pending timeout is reported in status (the Running
// condition's reason PodPending, naming the pod and the scheduler's message) and in an
// event. Measured from the pod's creationTimestamp. A pod that still carries a Kueue scheduling
// gate waits for admission (admission_policy.h), not for the scheduler, and is not counted;
// pods record no time for a gate's removal, so once admitted its clock still counts from its
// creationTimestamp. Pure; thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "operator/common/wall_clock.h"

namespace spawnpoint::op {

struct PendingCheck {
  std::string stuck_pod;  // the longest-pending pod past the timeout, "" if none
  std::string message;    // "pod x-node-1 has been Pending for 5m0s: 0/3 nodes are available..."
  // When the next pending pod will pass the timeout.
  std::optional<Clock::Duration> recheck_after;
};

PendingCheck CheckPending(const std::vector<const nlohmann::json*>& pods, Clock::Duration timeout,
                          WallTime now);

// Why a pod is not running: the scheduler's message (PodScheduled=False), else a waiting
// container's reason and message, else "not scheduled or started yet".
std::string WhyPending(const nlohmann::json& pod);

// The pods of a gang of `nodes` (`gang`: the current attempt's pods) that never ran, for a gang
// that did not start: "job-node-1 (Pending: 0/2 nodes are available: ...), job-node-2 (not
// created)"; a pod that ran or ended is left out, one being deleted says so. "" when every
// node's pod ran.
std::string GangPodsNotRunning(const std::vector<const nlohmann::json*>& gang, int nodes,
                               const std::string& job);

}  // namespace spawnpoint::op
