#include "agent/cli/commands.h"

#include <iostream>

#include <nlohmann/json.hpp>

#include "agent/process/spawner.h"
#include "agent/run/node_agent.h"
#include "agent/run/node_facts.h"
#include "agent/run/report.h"
#include "common/clock.h"

namespace spawnpoint::agent {
namespace {

// The job and this node as the options name them; nothing started.
StatusOr<NodeFacts> LoadNode(const AgentOptions& o) {
  SP_ASSIGN_OR_RETURN(api::TrainingJob job, LoadJob(o));
  SP_ASSIGN_OR_RETURN(std::shared_ptr<devices::GpuBackend> backend, OpenGpuBackend(o, job));
  return DiscoverNode(o, std::move(job), std::move(backend));
}

}  // namespace

int PlanCommand(const AgentOptions& o) {
  auto node = LoadNode(o);
  if (!node.ok()) return Fail(node.status());
  const int nnodes = NodeCount(o, node->job);
  const int port = o.master_port >= 0 ? o.master_port : node->job.spec.rendezvous_port;
  nlohmann::json out = nlohmann::json::array();
  std::vector<int> node_ranks;
  if (o.node_rank >= 0) {
    node_ranks.push_back(o.node_rank);
  } else {
    for (int i = 0; i < nnodes; ++i) node_ranks.push_back(i);
  }
  const bool local_nodes = o.node_rank < 0 && nnodes > 1;
  const auto shares = SplitCpusAcrossNodes(node->cpus.AllCpus(), nnodes);
  for (int i : node_ranks) {
    PlanRequest request =
        MakeRequest(o, *node, i, o.restart_count, port, "$TMPDIR/spawnpoint-XXXXXX");
    if (local_nodes) {
      auto share = devices::ReadCpuTopology(o.sysfs_root, shares[i]);
      if (!share.ok()) return Fail(share.status());
      request.cpus = *share;
    }
    auto plan = MakeNodePlan(request);
    if (!plan.ok()) return Fail(plan.status());
    if (Status s = CheckCommand(plan->ranks.front()); !s.ok()) return Fail(s);
    out.push_back(NodePlanToJson(*plan, o.full_env));
  }
  std::cout << (o.node_rank >= 0 ? out[0] : out).dump(2) << std::endl;
  return 0;
}

int RunCommand(const AgentOptions& o, SignalWatcher* signals) {
  auto job = LoadJob(o);
  if (!job.ok()) return Fail(job.status());
  auto backend = OpenGpuBackend(o, *job);
  if (!backend.ok()) return Fail(backend.status());
  auto spawner = MakeVforkSpawner();
  NodeAgent::Seams seams;
  seams.spawner = spawner.get();
  seams.clock = RealClock::Get();
  seams.signals = signals;
  seams.gpus = std::move(backend).value();
  auto agent = NodeAgent::Create(o, std::move(job).value(), std::move(seams));
  if (!agent.ok()) return Fail(agent.status());
  return (*agent)->Run();
}

}  // namespace spawnpoint::agent
