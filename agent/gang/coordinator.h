// GangCoordinator decides the attempts of a job whose gang spans several agents (issue 19):
// node 0's agent runs it, every node's agent (its own included) talks to it over the gang
// channel (gang_server.h, gang_peer.h). It holds the attempts together: an attempt starts
// on every node at once, behind a barrier every node reaches with its ranks stopped, on a
// rendezvous port of its own; the first failure stops every node; the failures that follow
// within a short settling window are weighed so that the cause, not a peer's collective
// error, is named (PickRootCause, agent/supervisor/failure_cause.h); the one restart budget and
// schedule of the job decide (Decide(), api/restart_rule.h); the job succeeds when every node's
// ranks did.
//
// Pure: each event returns the messages to send ({node, body}; node kEveryNode for all)
// and time comes from the injected Clock, so it is tested on simulated time. A node lost
// while its ranks run fails the attempt (retryable); the gang then waits for it to rejoin
// at the barrier (its pod recreated), and gives up after rejoin_timeout with a retryable
// failure NodeLost (the operator recreates the gang). The restart count survives a new
// coordinator: each node says the attempt it is at when it joins, and the largest wins.
// Not thread-safe: one owner (the server's thread).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/supervisor/exit_cause.h"
#include "api/training_job.h"
#include "common/clock.h"
#include "common/status.h"

namespace spawnpoint::agent::gang {

inline constexpr int kEveryNode = -1;

struct Outgoing {
  int node = kEveryNode;
  nlohmann::json body;
};

struct CoordinatorOptions {
  int nnodes = 1;
  api::RestartPolicy policy;  // maxRestarts: the job's whole budget
  int restart_count = 0;      // restarts made before this coordinator (--restart-count)
  // After an attempt's first failure, how long the other nodes' reports are waited for to
  // weigh the cause (a peer's death makes the others fail with collective errors soon
  // after), unless every node has reported sooner.
  std::chrono::milliseconds settle{1'000};
  // A node lost from the barrier must rejoin within this, or the gang is given up.
  std::chrono::milliseconds rejoin_timeout{120'000};
  // A fresh rendezvous port for each attempt (the last attempt's rank 0 may hold its own).
  std::function<StatusOr<int>()> pick_port;
};

// Message bodies ("t" names the kind): node -> coordinator: hello {node, attempt},
// ready {attempt}, exit {attempt, ok, stopped?, failure?}; coordinator -> node: start {attempt,
// port}, stop {attempt}, verdict {attempt, decision: restart|fail|succeeded, next, backoffMs,
// reason, message, failure?, restarts}.
class GangCoordinator {
 public:
  GangCoordinator(CoordinatorOptions options, Clock* clock);

  std::vector<Outgoing> Hello(int node, int attempt);
  // At the barrier: the node's ranks are stopped, and it has seen `attempt` (the gang's
  // attempt becomes the largest seen). Ignored while an attempt runs.
  std::vector<Outgoing> Ready(int node, int attempt);
  // `failure` nullopt: the node's ranks all succeeded; `stopped`: they were stopped for
  // another node's failure (after a stop).
  std::vector<Outgoing> Exit(int node, int attempt, std::optional<RankFailure> failure,
                             bool stopped = false);
  std::vector<Outgoing> Lost(int node);
  // Ends a settling window or a rejoin timeout that has passed.
  std::vector<Outgoing> Tick();

  enum class Phase { kBarrier, kRunning, kSettling, kSucceeded, kFailed };
  Phase phase() const { return phase_; }
  int attempt() const { return attempt_; }  // == restarts made, job-wide
  std::optional<RankFailure> last_failure() const { return last_failure_; }
  // The verdict sent last (null before any).
  const nlohmann::json& last_verdict() const { return last_verdict_; }

 private:
  std::vector<Outgoing> StartIfAllReady();
  std::vector<Outgoing> Fail(int node, RankFailure failure);
  std::vector<Outgoing> Decide();

  const CoordinatorOptions options_;
  Clock* const clock_;
  Phase phase_ = Phase::kBarrier;
  int attempt_ = 0;
  int quick_failures_ = 0;
  std::set<int> connected_;
  std::set<int> ready_;                                // at the barrier of attempt_
  std::set<int> succeeded_;                            // this attempt's nodes that succeeded
  std::vector<std::pair<int, RankFailure>> failures_;  // this attempt's, in arrival order
  std::map<int, bool> reported_;                       // nodes that reported this attempt
  Clock::TimePoint attempt_start_{};
  Clock::TimePoint settle_until_{};
  std::optional<Clock::TimePoint> lost_since_;  // a node is missing from the barrier
  std::optional<RankFailure> last_failure_;
  nlohmann::json last_verdict_;
};

}  // namespace spawnpoint::agent::gang
