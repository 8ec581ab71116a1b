// NodeAgent runs this node's share of a TrainingJob. Given the job, the node's identity
// (the options' --node-rank, --nnodes and rendezvous) and the seams below, it discovers
// the node, plans, checks (preflight), starts the loader pools, the endpoint and the
// ranks, supervises them, restarts the gang under the job's restartPolicy, and reports
// (status file, termination log, endpoint, console). With several nodes and no
// --node-rank it runs every node on this machine instead (LocalCluster), under the same
// loop. It owns all it starts. Not thread-safe: create it and call Run() on the thread
// that created the SignalWatcher.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/cli/options.h"
#include "agent/devices/gpu_backend.h"
#include "agent/gang/gang_channel.h"
#include "agent/plan/node_plan.h"
#include "agent/process/spawner.h"
#include "agent/run/attempt_decision.h"
#include "agent/run/loader_pools.h"
#include "agent/run/local_cluster.h"
#include "agent/run/node_facts.h"
#include "agent/run/stall_monitor.h"
#include "agent/run/standby_rank.h"
#include "agent/status/agent_endpoint.h"
#include "agent/status/node_status.h"
#include "agent/supervisor/gang.h"
#include "agent/supervisor/signals.h"
#include "api/training_job.h"
#include "common/clock.h"
#include "common/status.h"

namespace spawnpoint::agent {

class NodeAgent {
 public:
  // What the agent reaches the world through; each must outlive the agent.
  struct Seams {
    ProcessSpawner* spawner = nullptr;  // every process: ranks, loader workers, node agents
    Clock* clock = nullptr;             // restart backoff, grace periods, intervals, elapsed
    SignalWatcher* signals = nullptr;   // SIGTERM/SIGINT/SIGHUP stop the agent; SIGCHLD
    std::shared_ptr<devices::GpuBackend> gpus;  // discovery, and the metrics' samples
  };

  // Discovers, plans and checks; starts nothing. Errors are what the agent exits with
  // through ExitCodeFor (agent/run/report.h): InvalidArgument for bad input (exit 2).
  static StatusOr<std::unique_ptr<NodeAgent>> Create(const AgentOptions& options,
                                                     api::TrainingJob job, Seams seams);
  ~NodeAgent();  // stops what Run() started: endpoint, pools, the pool directory

  // Runs attempts until the job succeeds, fails or the agent is stopped; the exit code as
  // agent/cli/commands.h states it. REQUIRES: the SignalWatcher's thread; called once.
  int Run();

 private:
  NodeAgent(const AgentOptions& options, NodeFacts node, Seams seams);

  // Rendezvous port, then this node's first plan, or the local cluster of every node.
  Status Plan();
  // The command resolves and the shared memory is big enough (ranks mode).
  Status Validate() const;
  // Says what runs, then starts the loader pools and the endpoint (ranks mode), and the
  // status document (both modes).
  Status StartPools();
  // Makes the status document, wired to --status-file, and publishes its first (Starting).
  void StartStatus(NodeStatusOptions options);
  // The members of attempt `restart`: this node's ranks, or the cluster's node agents.
  StatusOr<std::vector<GangMember>> MembersFor(int restart) const;
  // Runs one attempt of the gang to its end. REQUIRES: the SignalWatcher's thread.
  StatusOr<GangResult> RunAttempt(int restart);
  // The restart policy applied to an attempt's result (agent/run/attempt_decision.h). The
  // local cluster's node agents restart in place themselves: for it, the gang's end as their
  // reports tell (and restart_ takes the restarts they made).
  AttemptDecision Decide(const GangResult& result);
  // The one writer of what was decided: status file, endpoint, console, termination log.
  void Report(const AttemptDecision& decision, int up = 0, int total = 0);
  // The agent itself cannot go on (its pools, its gang channel): said, and, as reason
  // AgentError, in the termination log and the status document. Returns the exit code. A
  // preflight's own reason (PortInUse) is retryable as restartPolicy says of exit code 1.
  int FailAgent(const Status& status, const std::string& reason = "AgentError");
  // Waits out a restart backoff on the clock; a termination signal (returned) ends it.
  // REQUIRES: the SignalWatcher's thread.
  int WaitOutBackoff(std::chrono::milliseconds wait);
  // Before a restart (overlap_teardown_): the next attempt gets a fresh rendezvous port,
  // since the last one's processes may still be torn down (GangOptions::overlap_exit);
  // when it waits out a backoff first, they are reaped now.
  void PrepareOverlap(const AttemptDecision& decision, bool teardown_pending);
  // Reaps every child of the agent but the loader pools' workers. REQUIRES: the
  // SignalWatcher's thread.
  void AwaitTeardown();
  // The file made when attempt `restart` fails (SPAWNPOINT_FAILED_FILE of its ranks); "" when
  // no restart can follow (maxRestarts 0), or there is no run directory.
  std::string FailedFile(int restart) const;
  // Stops the endpoint and the status, then the pools, and removes the pool directory.
  // Idempotent.
  void Stop();
  // The processes that live beside the gang (loader workers, standbys), and the exit of one.
  std::vector<pid_t> KeptPids() const;
  bool OnKeptExit(pid_t pid, int wait_status);

  // --gang (node_agent_gang.cc): this node's share of a gang that restarts in place. Node
  // 0's agent starts the coordinator; every agent joins it, and runs each attempt when the
  // coordinator starts it, stops its ranks when told, and reports as the verdict says.
  Status StartGang();
  int RunInGang();
  // The next coordinator message of one of `kinds` ("lost" and "reconnected" always come
  // through), waiting up to `wait`; a termination signal ends the wait (*signal set).
  std::optional<nlohmann::json> AwaitGang(const std::vector<std::string>& kinds,
                                          std::chrono::milliseconds wait, int* signal);
  // Waits (up to the join timeout) until the connection to the coordinator is back; false
  // when it is not, or a termination signal came (*signal set).
  bool AwaitReconnection(int* signal);
  // Tells the coordinator how this node's attempt ended, once per attempt (the first of a
  // rank's failure and a stop wins).
  void ReportToGang(const nlohmann::json& exit);

  // Constant after Create().
  const AgentOptions options_;
  const NodeFacts node_;
  ProcessSpawner* const spawner_;
  Clock* const clock_;
  SignalWatcher* const signals_;
  const int nnodes_;
  const int node_rank_;
  const bool owns_gang_;          // restarts are this agent's to decide (not the operator's)
  const std::string what_;        // how members are named: "ranks" or "nodes"
  api::RestartPolicy policy_;     // the job's, maxRestarts as --max-restarts says
  int port_ = 0;                  // the rendezvous port
  std::string pool_root_;         // the loader pools' directory; "" for none
  std::optional<NodePlan> plan_;  // ranks mode: the first attempt's plan
  std::unique_ptr<LocalCluster> cluster_;  // local multi-node mode instead of ranks
  // A failed attempt's teardown overlaps the next one's start: this agent owns the gang,
  // the rendezvous is on loopback (a fresh port per attempt is private), and no rank holds
  // a GPU (a dying CUDA context frees its memory last).
  bool overlap_teardown_ = false;
  std::string run_dir_;                  // ranks mode: progress records and stack files
  std::unique_ptr<StallMonitor> stall_;  // ranks mode: stalled ranks (spec.stallPolicy)
  // Ranks mode with restarts to come and restartPolicy.standby: a warm standby per Python
  // rank, released into the next attempt.
  std::unique_ptr<StandbyRanks> standbys_;

  // Started by Run(); destroyed in reverse (the endpoint serves the status, which reads
  // the pools).
  LoaderPools pools_;
  // The one status document: /status serves it, --status-file gets each new one.
  std::unique_ptr<NodeStatus> status_;
  std::unique_ptr<AgentEndpoint> endpoint_;
  Clock::TimePoint start_{};
  int restart_ = 0;         // attempts before the current one, earlier agents' included
  int local_restarts_ = 0;  // restarts this agent made (the budget it spends)
  int quick_failures_ = 0;  // failures in a row of attempts shorter than resetAfterSeconds
  std::unique_ptr<gang::GangServer> gang_server_;  // --gang on node 0: the coordinator
  std::unique_ptr<gang::GangPeer> gang_;           // --gang: this agent's connection
  bool stopped_by_gang_ = false;   // the attempt's ranks were stopped for another node
  bool reported_to_gang_ = false;  // the attempt's end was told to the coordinator
};

}  // namespace spawnpoint::agent
