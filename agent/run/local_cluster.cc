#include "agent/run/local_cluster.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "agent/run/report.h"
#include "agent/run/self_exe.h"
#include "agent/status/agent_endpoint.h"

namespace spawnpoint::agent {

StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Create(const AgentOptions& o,
                                                             const NodeFacts& node, int nnodes,
                                                             int port) {
  for (int i = 0; i < nnodes; ++i) {
    SP_RETURN_IF_ERROR(MakeNodePlan(MakeRequest(o, node, i, o.restart_count, port)).status());
  }
  char tmpl[] = "/tmp/spawnpoint-nodes-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return Internal("mkdtemp failed");
  std::string self = SelfExecutablePath();
  if (self.empty()) {
    std::filesystem::remove_all(tmpl);
    return Internal("cannot read /proc/self/exe");
  }
  Say(node.job.name + ": running " + std::to_string(nnodes) + " nodes locally, rendezvous on " +
      MasterAddress(o) + ":" + std::to_string(port));
  return std::unique_ptr<LocalCluster>(new LocalCluster(
      o, nnodes, port, tmpl, std::move(self), SplitCpusAcrossNodes(node.cpus.AllCpus(), nnodes)));
}

LocalCluster::LocalCluster(const AgentOptions& options, int nnodes, int port, std::string dir,
                           std::string self, std::vector<std::vector<int>> shares)
    : options_(options),
      nnodes_(nnodes),
      port_(port),
      dir_(std::move(dir)),
      self_(std::move(self)),
      shares_(std::move(shares)) {}

LocalCluster::~LocalCluster() { std::filesystem::remove_all(dir_); }

std::string LocalCluster::LogPath(int node) const {
  return dir_ + "/node-" + std::to_string(node) + ".json";
}

AgentOptions LocalCluster::NodeOptions(int node, int restart) const {
  AgentOptions o = options_;
  o.command = AgentCommand::kRun;
  o.node_rank = node;
  o.nnodes = nnodes_;
  o.master_addr = MasterAddress(options_);
  o.master_port = port_;
  o.max_restarts = 0;  // this agent restarts the whole cluster
  o.restart_count = restart;
  o.termination_log = LogPath(node);
  o.termination_log_explicit = true;
  o.status_file.clear();  // this agent writes it
  o.full_env = false;
  o.metrics_addr = LocalNodeMetricsAddress(options_.metrics_addr, node);
  return o;
}

std::vector<GangMember> LocalCluster::MembersFor(int restart) const {
  std::vector<GangMember> members;
  for (int i = 0; i < nnodes_; ++i) {
    unlink(LogPath(i).c_str());
    GangMember m;
    m.label = "node " + std::to_string(i);
    m.rank = -1;
    m.node_rank = i;
    m.prefix_output = false;  // node agents prefix their ranks' lines themselves
    m.spawn.cpus = shares_[i];
    m.spawn.argv = ToArgs(NodeOptions(i, restart));
    m.spawn.argv.insert(m.spawn.argv.begin(), self_);
    for (const auto& [k, v] : CurrentEnvironment()) m.spawn.env.push_back(k + "=" + v);
    members.push_back(std::move(m));
  }
  return members;
}

bool LocalCluster::Refine(RankFailure& f) const {
  std::ifstream in(LogPath(f.node_rank));
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("rank")) return false;
  // The node agent exits 1 for any failed rank; the rank's own code decides the restart.
  RankFailure refined = RankFailure::FromJson(j);
  refined.node_rank = f.node_rank;
  refined.pid = f.pid;
  if (!j.contains("message")) refined.cause.message = f.cause.message;
  if (!j.contains("stack")) refined.stack = f.stack;
  if (!j.contains("reason")) refined.cause.reason = f.cause.reason;
  f = std::move(refined);
  return true;
}

}  // namespace spawnpoint::agent
