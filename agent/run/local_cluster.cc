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
  if (j.is_discarded() || !j.contains("rank")) return false;
  f.rank = j.value("rank", f.rank);
  f.local_rank = j.value("localRank", f.local_rank);
  // The node agent exits 1 for any failed rank; the rank's own code decides the restart.
  if (j.contains("exitCode") && j["exitCode"].is_number_integer()) {
    const int code = j["exitCode"].get<int>();
    const bool signalled = j.contains("signal") && code > 128;
    f.status.signal = signalled ? code - 128 : 0;
    f.status.exit_code = signalled ? 0 : code;
  }
  f.cause.message = j.value("message", f.cause.message);
  f.cause.line = j.value("line", "");
  f.cause.exception = j.value("exception", "");
  if (j.contains("retryable") && j["retryable"].is_boolean())
    f.retryable = j["retryable"].get<bool>();
  f.stack = j.value("stack", f.stack);
  f.log_tail = j.value("logTail", "");
  f.log_stream = j.value("logStream", "");
  // When it failed, as that node's agent saw it: the order across nodes (PickRootCause).
  if (auto at = ParseEpochMillis(j.value("failedAt", ""))) f.failed_at_ms = *at;
  f.consequences.clear();
  if (j.contains("consequences") && j["consequences"].is_array()) {
    for (const auto& c : j["consequences"]) {
      if (!c.is_object()) continue;
      f.consequences.push_back(PeerFailure{c.value("rank", -1), c.value("nodeRank", 0),
                                           c.value("exitCode", 0), c.value("reason", ""),
                                           c.value("line", "")});
    }
  }
  if (auto reason = ExitReasonFromName(j.value("reason", ""))) f.cause.reason = *reason;
  return true;
}

}  // namespace spawnpoint::agent
