// Leader election on a coordination.k8s.io/v1 Lease, with client-go's rules. Candidates
// read the lease and take it only when it is free or expired, where "expired" is judged by
// when THIS process last saw the lease record change, measured on its own Clock, plus the
// lease duration: clocks of different machines are never compared. Writes are optimistic
// (resourceVersion precondition), so of two racing candidates one gets a Conflict and
// stays a follower. The leader renews every retry period and gives up when it could not
// renew for the renew deadline (lease 15 s > renew deadline 10 s > retry 2 s by default),
// which leaves a margin before anyone else may take over. On Stop() a leader releases the
// lease (empty holder, 1 s duration) so a successor need not wait out the lease.
// Run() blocks on the caller's thread; Stop(), IsLeader() and GetLeader() are thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "operator/kube/client.h"

namespace spawnpoint::kube {

struct LeaderCallbacks {
  // Called on Run()'s thread when this process becomes the leader; start the controllers
  // and return (do not block: renewing happens on this thread).
  std::function<void()> on_started_leading;
  // Called once when leadership ends (lost or released). A controller must stop acting at
  // once: the operator exits here.
  std::function<void()> on_stopped_leading;
  // Called whenever the observed holder changes (including to ourselves).
  std::function<void(const std::string& identity)> on_new_leader;
};

struct LeaderElectionConfig {
  std::string lease_namespace;
  std::string lease_name;
  std::string identity;  // unique per candidate, e.g. the pod name
  Clock::Duration lease_duration = std::chrono::seconds(15);
  Clock::Duration renew_deadline = std::chrono::seconds(10);
  Clock::Duration retry_period = std::chrono::seconds(2);
  bool release_on_stop = true;
  LeaderCallbacks callbacks;
  // Wall time written into acquireTime/renewTime (informational: kubectl shows them).
  std::function<std::chrono::system_clock::time_point()> wall_clock;
  std::function<double()> uniform01;  // jitter of follower retries; default seeded PRNG
};

// What the Lease's spec says.
struct LeaderElectionRecord {
  std::string holder_identity;
  int64_t lease_duration_seconds = 0;
  std::string acquire_time;  // RFC 3339 with microseconds
  std::string renew_time;
  int64_t lease_transitions = 0;
};

class LeaderElector {
 public:
  // Checks lease_duration > renew_deadline > 1.2 × retry_period and that names are set.
  static StatusOr<std::unique_ptr<LeaderElector>> Create(Client* client,
                                                         LeaderElectionConfig config);

  // Campaigns until leader, then renews until leadership is lost or Stop() is called.
  // Returns after on_stopped_leading (if leadership was gained).
  void Run();
  // Makes Run() return; a leader first releases the lease (if release_on_stop).
  void Stop();

  // True while leading and the last lease record we saw names us.
  bool IsLeader() const;
  // The holder we last observed ("" if none).
  std::string GetLeader() const;

  // One attempt to acquire or renew; public for tests.
  bool TryAcquireOrRenew();

 private:
  LeaderElector(Client* client, LeaderElectionConfig config);
  bool Sleep(Clock::Duration d);
  bool StopRequested() const;
  void Release();
  std::string NowString() const;
  void ObserveLocked(const LeaderElectionRecord& record, const std::string& raw);
  void ReportNewLeader();
  void Log(LogLevel level, const std::string& message) const;

  Client* const client_;
  const LeaderElectionConfig config_;
  Clock* const clock_;
  std::function<double()> uniform01_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool leading_ = false;
  LeaderElectionRecord observed_;
  std::string observed_raw_;
  Clock::TimePoint observed_time_{};
  std::string reported_leader_;
  bool reported_once_ = false;
};

Json LeaseSpecFromRecord(const LeaderElectionRecord& record);
LeaderElectionRecord RecordFromLease(const Json& lease);

}  // namespace spawnpoint::kube
