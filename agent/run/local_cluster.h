// The local multi-node mode: every node of a job on this machine, as one child agent per
// node (`spawnpoint-agent run --node-rank i`, its argv from ToArgs), each with its own
// share of the CPUs and its own metrics port. The node agents form an in-place gang, as the
// agents of pods do on Kubernetes (--gang on a free loopback port, a token file only this
// user can read; node 0's coordinates and spends the job's restart budget); NodeAgent runs
// them as its gang in place of ranks, once: when one exits, the job has ended. Not
// thread-safe: NodeAgent's thread only.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/cli/options.h"
#include "agent/run/node_facts.h"
#include "agent/supervisor/exit_cause.h"
#include "agent/supervisor/gang.h"
#include "common/status.h"

namespace spawnpoint::agent {

class LocalCluster {
 public:
  // Validates every node's plan (bad input fails before any agent starts) and makes the
  // directory the node agents write their termination logs to. Says what it will run.
  static StatusOr<std::unique_ptr<LocalCluster>> Create(const AgentOptions& options,
                                                        const NodeFacts& node, int nnodes,
                                                        int port);
  ~LocalCluster();  // removes the directory

  // The node agents of attempt `restart`.
  std::vector<GangMember> MembersFor(int restart) const;
  // Refines a failed node agent's report with the rank, exit code, signal, cause, last lines
  // and failure time its termination log names (the node agent itself exits 1 for any failed
  // rank); false, leaving it as it was, when the log names no failed rank (it was stopped).
  bool Refine(RankFailure& failure) const;

  // The options of node `node`'s agent in attempt `restart`.
  AgentOptions NodeOptions(int node, int restart) const;

  // How the node agents' gang ended, from their termination logs and node 0's status file:
  // the restarts it made and, when it failed, why it did not restart (the verdict's reason,
  // e.g. MaxRestartsReached, and message; "" when unknown).
  struct Outcome {
    int restarts = 0;
    std::string verdict, verdict_message;
    nlohmann::json last_failure;  // node 0's status document's lastFailure (null: none)
  };
  Outcome GangOutcome() const;

 private:
  LocalCluster(const AgentOptions& options, int nnodes, int port, int gang_port, std::string dir,
               std::string self, std::vector<std::vector<int>> shares);
  std::string LogPath(int node) const;
  std::string StatusPath(int node) const;
  std::string TokenPath() const { return dir_ + "/gang-token"; }

  // Constant after Create().
  const AgentOptions options_;
  const int nnodes_;
  const int port_;
  const int gang_port_;                         // node 0's coordinator, on loopback
  const std::string dir_;                       // node-<i>.json: node i's termination log
  const std::string self_;                      // this executable
  const std::vector<std::vector<int>> shares_;  // CPUs per node
};

}  // namespace spawnpoint::agent
