#include "agent/cli/commands.h"

#include <iostream>
#include <map>

#include <nlohmann/json.hpp>

#include "agent/process/spawner.h"
#include "agent/run/node_agent.h"
#include "agent/run/node_facts.h"
#include "agent/run/preflight.h"
#include "agent/run/report.h"
#include "agent/run/torchrun_input.h"
#include "common/clock.h"

namespace spawnpoint::agent {
namespace {

// The job the options name. Everything LoadJob reads is the agent's input, so each of its
// errors is bad input (exit 2): a missing or unreadable manifest file as much as a typo.
// A command that started torchrun is said in one line, at plan and run time. A torchrun
// command line (`torchrun`) is its job and sets options of its own (agent/run/torchrun_input.h).
StatusOr<api::TrainingJob> LoadInput(AgentOptions* o) {
  if (!o->torchrun.empty()) return LoadTorchrunJob(o);
  auto job = LoadJob(*o);
  if (!job.ok() && job.status().code() != StatusCode::kInvalidArgument) {
    return InvalidArgument(job.status().message());
  }
  if (job.ok() && job->spec.trainer.torchrun) {
    Say(job->name + ": " + job->spec.trainer.torchrun->Summary(api::RanksPerNode(job->spec)));
  }
  return job;
}

// The job and this node as the options name them; nothing started.
StatusOr<NodeFacts> LoadNode(AgentOptions* o) {
  SP_ASSIGN_OR_RETURN(api::TrainingJob job, LoadInput(o));
  SP_ASSIGN_OR_RETURN(std::shared_ptr<devices::GpuBackend> backend, OpenGpuBackend(*o, job));
  return DiscoverNode(*o, std::move(job), std::move(backend));
}

// How long plan waits for an interpreter to import torch (~1-2 s on an idle machine).
constexpr std::chrono::seconds kTorchProbeTimeout{30};

// Adds each rank's program as the spawner will exec it ("executable", an absolute path)
// and, for a Python rank, "torchVersion": what its interpreter imports, or null with one
// warning line per interpreter that cannot (the ranks would fail later with
// ModuleNotFoundError). `probed` remembers the interpreters already run.
Status AddExecutables(const NodePlan& plan, ProcessSpawner* spawner,
                      std::map<std::string, TorchProbe>* probed, nlohmann::json* out) {
  for (size_t i = 0; i < plan.ranks.size(); ++i) {
    const RankPlan& rank = plan.ranks[i];
    auto exe = ResolveRankExecutable(rank);
    if (!exe.ok()) return InvalidArgument("the trainer container's " + exe.status().message());
    (*out)["ranks"][i]["executable"] = *exe;
    if (!IsPythonCommand(rank.argv)) continue;
    auto it = probed->find(*exe);
    if (it == probed->end()) {
      it = probed->emplace(*exe, ProbeTorch(spawner, *exe, rank, kTorchProbeTimeout)).first;
      if (!it->second.version) {
        const std::string from =
            rank.argv.front() == *exe ? "" : " (`" + rank.argv.front() + "` on the ranks' PATH)";
        Say("warning: " + plan.job_name + ": the ranks' interpreter " + *exe + from +
            " cannot import torch: " + it->second.error +
            "; the ranks will fail when they import it. Put the interpreter that has torch "
            "in command: (its absolute path), or first on PATH");
      }
    }
    (*out)["ranks"][i]["torchVersion"] =
        it->second.version ? nlohmann::json(*it->second.version) : nlohmann::json(nullptr);
  }
  return Status::Ok();
}

}  // namespace

int PlanCommand(const AgentOptions& given) {
  AgentOptions o = given;
  auto node = LoadNode(&o);
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
  auto spawner = MakeVforkSpawner();
  std::map<std::string, TorchProbe> probed;
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
    nlohmann::json node_plan = NodePlanToJson(*plan, o.full_env);
    if (Status s = AddExecutables(*plan, spawner.get(), &probed, &node_plan); !s.ok()) {
      return Fail(s);
    }
    out.push_back(std::move(node_plan));
  }
  std::cout << (o.node_rank >= 0 ? out[0] : out).dump(2) << std::endl;
  return 0;
}

int RunCommand(const AgentOptions& given, SignalWatcher* signals) {
  AgentOptions o = given;
  auto job = LoadInput(&o);
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
