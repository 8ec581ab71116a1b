// The local multi-node mode: every node of a job on this machine, as one child agent per
// node (`spawnpoint-agent run --node-rank i`, its argv from ToArgs), each with its own
// share of the CPUs and its own metrics port. NodeAgent runs these agents as its gang in
// place of ranks, under the same restart loop. Not thread-safe: NodeAgent's thread only.
#pragma once

#include <memory>
#include <string>
#include <vector>

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

 private:
  LocalCluster(const AgentOptions& options, int nnodes, int port, std::string dir, std::string self,
               std::vector<std::vector<int>> shares);
  std::string LogPath(int node) const;

  // Constant after Create().
  const AgentOptions options_;
  const int nnodes_;
  const int port_;
  const std::string dir_;                       // node-<i>.json: node i's termination log
  const std::string self_;                      // this executable
  const std::vector<std::vector<int>> shares_;  // CPUs per node
};

}  // namespace spawnpoint::agent
