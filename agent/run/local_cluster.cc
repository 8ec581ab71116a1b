#include "agent/run/local_cluster.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "agent/run/report.h"
#include "agent/run/self_exe.h"
#include "agent/status/agent_endpoint.h"
#include "common/random.h"

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
  // The gang's token: random, readable by this user only (the directory is 0700).
  StatusOr<std::string> random = RandomHex(32);
  if (!random.ok()) {
    std::filesystem::remove_all(tmpl);
    return random.status();
  }
  const std::string token = *random + "\n";
  const int fd = ::open((std::string(tmpl) + "/gang-token").c_str(),
                        O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  const bool written =
      fd >= 0 && ::write(fd, token.data(), token.size()) == static_cast<ssize_t>(token.size());
  if (fd >= 0) ::close(fd);
  if (!written) {
    std::filesystem::remove_all(tmpl);
    return Internal("cannot write the gang's token in " + std::string(tmpl));
  }
  StatusOr<int> gang_port = FreePort();
  if (!gang_port.ok()) {
    std::filesystem::remove_all(tmpl);
    return gang_port.status();
  }
  Say(node.job.name + ": running " + std::to_string(nnodes) + " nodes locally, rendezvous on " +
      MasterAddress(o) + ":" + std::to_string(port) + ", their gang on port " +
      std::to_string(*gang_port));
  return std::unique_ptr<LocalCluster>(
      new LocalCluster(o, nnodes, port, *gang_port, tmpl, std::move(self),
                       SplitCpusAcrossNodes(node.cpus.AllCpus(), nnodes)));
}

LocalCluster::LocalCluster(const AgentOptions& options, int nnodes, int port, int gang_port,
                           std::string dir, std::string self, std::vector<std::vector<int>> shares)
    : options_(options),
      nnodes_(nnodes),
      port_(port),
      gang_port_(gang_port),
      dir_(std::move(dir)),
      self_(std::move(self)),
      shares_(std::move(shares)) {}

LocalCluster::~LocalCluster() { std::filesystem::remove_all(dir_); }

std::string LocalCluster::LogPath(int node) const {
  return dir_ + "/node-" + std::to_string(node) + ".json";
}

std::string LocalCluster::StatusPath(int node) const {
  return dir_ + "/node-" + std::to_string(node) + "-status.json";
}

LocalCluster::Outcome LocalCluster::GangOutcome() const {
  Outcome out;
  std::ifstream status(StatusPath(0));
  nlohmann::json s = nlohmann::json::parse(status, nullptr, false);
  if (s.is_object() && s["restarts"].is_number_integer()) out.restarts = s["restarts"];
  if (s.is_object() && s["lastFailure"].is_object()) out.last_failure = s["lastFailure"];
  for (int i = 0; i < nnodes_; ++i) {
    std::ifstream in(LogPath(i));
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (!j.is_object()) continue;
    if (j["restarts"].is_number_integer())
      out.restarts = std::max(out.restarts, j["restarts"].get<int>());
    if (out.verdict.empty() && j["verdict"].is_string()) {
      out.verdict = j["verdict"];
      out.verdict_message = j.value("verdictMessage", "");
    }
  }
  return out;
}

AgentOptions LocalCluster::NodeOptions(int node, int restart) const {
  AgentOptions o = options_;
  o.command = AgentCommand::kRun;
  o.node_rank = node;
  o.nnodes = nnodes_;
  o.master_addr = MasterAddress(options_);
  o.master_port = port_;
  o.restart_count = restart;  // max_restarts as given: node 0's agent spends the budget
  o.gang_addr = "127.0.0.1:" + std::to_string(gang_port_);
  o.gang_token_file = TokenPath();
  o.termination_log = LogPath(node);
  o.termination_log_explicit = true;
  o.status_file = StatusPath(node);  // this agent writes the one the user asked for
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
  // Every node agent's log names the gang's cause, which may be another node's rank.
  if (!j.contains("nodeRank")) refined.node_rank = f.node_rank;
  refined.pid = f.pid;
  if (!j.contains("message")) refined.cause.message = f.cause.message;
  if (!j.contains("stack")) refined.stack = f.stack;
  if (!j.contains("reason")) refined.cause.reason = f.cause.reason;
  f = std::move(refined);
  return true;
}

}  // namespace spawnpoint::agent
