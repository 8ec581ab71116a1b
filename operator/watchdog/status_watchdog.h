// The status watchdog: marks TrainingJobs' status stale while no operator runs, as the node
// lifecycle controller marks a Node whose kubelet stopped renewing its Lease. Only a running
// operator can keep a job's status true (restarts, deadlines, utilisation); when none runs,
// `kubectl get tj` would go on saying Running with the last samples/s. The watchdog reads the
// operator's leader-election Lease every `interval`; when the Lease has not changed (any write
// moves its resourceVersion: a renewal, a new leader, a release) for `stale_after`, measured on
// this process's own clock from when it saw the last change (clocks of different machines are
// never compared, as in kube/leader_election.h), it sets the condition StatusStale=True, reason
// OperatorNotRunning, on every job that is not Succeeded or Failed, with one Warning event each.
// The operator sets it False (reason OperatorRunning) on its first reconcile of the job
// (reconciler.cc StatusStaleStep). A Lease that cannot be read is no evidence either way: nothing
// is marked on a failed read, and the failure is logged once until a read succeeds; other
// failures (listing, patching, events) once per distinct error.
//
// Writes are merge patches of the status subresource carrying the job's resourceVersion as a
// precondition, so a status the operator wrote after the watchdog read it is never
// overwritten (the 409 is dropped; the next round reads again). Verbs: leases get (the one
// Lease), trainingjobs list, trainingjobs/status patch, events create.
//
// Check() and Run() are called from one thread; Stop() from any.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "operator/common/log.h"
#include "operator/common/object.h"
#include "operator/common/wall_clock.h"
#include "operator/kube/client.h"
#include "operator/reconciler/job_status.h"

namespace spawnpoint::op {

inline constexpr const char* kStatusWatchdogComponent = "spawnpoint-status-watchdog";

struct StatusWatchdogOptions {
  std::string lease_namespace;
  std::string lease_name;
  std::vector<std::string> namespaces;  // the jobs' namespaces; empty: every namespace
  Clock::Duration stale_after = std::chrono::seconds(45);
  Clock::Duration interval = std::chrono::seconds(5);
  std::string identity;  // the events' reportingInstance
};

// What one round saw and did.
struct WatchdogRound {
  bool lease_read = false;  // false: the Lease could not be read (nothing marked)
  bool stale = false;       // no change of the Lease for stale_after
  Clock::Duration unchanged{0};
  std::vector<std::string> marked;  // "ns/name" of the jobs marked this round
  int conflicts = 0;                // marks refused by the resourceVersion precondition
};

class StatusWatchdog {
 public:
  StatusWatchdog(kube::Client* client, const WallClock* wall, StatusWatchdogOptions options,
                 Logger log);

  // One round: read the Lease; when stale, mark every unfinished, unmarked job.
  WatchdogRound Check();
  // Rounds every `interval` until Stop().
  void Run();
  void Stop();

 private:
  Status ReadLease();
  void MarkJobs(WatchdogRound* round);
  // Patches `status` (the job's, as listed) with StatusStale=True, and records the event.
  Status Mark(const Json& job, JobStatus status, const std::string& message, WatchdogRound* round);
  std::string Message(const Json& job, Clock::Duration unchanged) const;
  void LogOnce(const std::string& what, const Status& error);

  kube::Client* const client_;
  const WallClock* const wall_;
  const StatusWatchdogOptions options_;
  const Logger log_;
  Clock* const clock_;
  const std::string lease_;  // "namespace/name", as messages and logs name it

  // The Lease as last seen: its resourceVersion ("" absent) and holder, and when (on clock_)
  // it last changed; nullopt before the first successful read.
  std::optional<std::string> lease_version_;
  std::string holder_;
  Clock::TimePoint changed_at_{};
  WallTime changed_at_wall_{};
  std::string lease_error_;              // the Lease read's failure logged last; "" after a read
  std::set<std::string> logged_errors_;  // the other failures, each logged once
  uint64_t event_seq_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

}  // namespace spawnpoint::op
