#include "agent/run/node_agent.h"

#include "agent/status/status_access.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <filesystem>

#include "agent/loader/contract.h"
#include "agent/run/exit_codes.h"
#include "agent/run/gang_stop_check.h"
#include "agent/run/preflight.h"
#include "agent/run/rank_changes.h"
#include "agent/run/report.h"
#include "agent/run/stall_monitor.h"
#include "agent/supervisor/failure_cause.h"
#include "agent/supervisor/process_table.h"
#include "api/restart_rule.h"

namespace spawnpoint::agent {
namespace {

using std::chrono::milliseconds;

// How often a restart backoff looks for a termination signal.
constexpr milliseconds kBackoffSignalCheck{50};

bool RunsLocalCluster(const AgentOptions& o, int nnodes) { return nnodes > 1 && o.node_rank < 0; }

std::string HostName() {
  char buf[HOST_NAME_MAX + 1] = {0};
  return gethostname(buf, sizeof(buf) - 1) == 0 ? buf : "";
}

}  // namespace

StatusOr<std::unique_ptr<NodeAgent>> NodeAgent::Create(const AgentOptions& options,
                                                       api::TrainingJob job, Seams seams) {
  if (!seams.spawner || !seams.clock || !seams.signals || !seams.gpus) {
    return Internal("NodeAgent: every seam (spawner, clock, signals, gpus) must be given");
  }
  SP_ASSIGN_OR_RETURN(NodeFacts node, DiscoverNode(options, std::move(job), seams.gpus));
  std::unique_ptr<NodeAgent> agent(new NodeAgent(options, std::move(node), std::move(seams)));
  SP_RETURN_IF_ERROR(agent->Plan());
  SP_RETURN_IF_ERROR(agent->Validate());
  return agent;
}

NodeAgent::NodeAgent(const AgentOptions& options, NodeFacts node, Seams seams)
    : options_(options),
      node_(std::move(node)),
      spawner_(seams.spawner),
      clock_(seams.clock),
      signals_(seams.signals),
      nnodes_(NodeCount(options_, node_.job)),
      node_rank_(std::max(0, options_.node_rank)),
      owns_gang_(nnodes_ == 1 || RunsLocalCluster(options_, nnodes_)),
      what_(RunsLocalCluster(options_, nnodes_) ? "nodes" : "ranks"),
      policy_(node_.job.spec.restart_policy) {
  if (options_.max_restarts >= 0) policy_.max_restarts = options_.max_restarts;
}

NodeAgent::~NodeAgent() { Stop(); }

Status NodeAgent::Plan() {
  SP_ASSIGN_OR_RETURN(port_, RendezvousPort(options_, node_.job));
  if (RunsLocalCluster(options_, nnodes_)) {
    SP_ASSIGN_OR_RETURN(cluster_, LocalCluster::Create(options_, node_, nnodes_, port_));
    return Status::Ok();
  }
  if (node_.job.spec.loader.workers_per_rank != 0) {
    // Short: a pool's socket paths must fit a sockaddr_un (107 bytes).
    std::string tmpl = (std::filesystem::temp_directory_path() / "spawnpoint-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) return Internal("mkdtemp " + tmpl + " failed");
    pool_root_ = tmpl;
  }
  SP_ASSIGN_OR_RETURN(plan_, MakeNodePlan(MakeRequest(options_, node_, node_rank_,
                                                      options_.restart_count, port_, pool_root_)));
  std::string run_dir = (std::filesystem::temp_directory_path() / "spawnpoint-run-XXXXXX").string();
  if (mkdtemp(run_dir.data()) == nullptr) return Internal("mkdtemp " + run_dir + " failed");
  run_dir_ = run_dir;
  if (policy_.standby && policy_.max_restarts > 0) {
    // The pod's cgroup: where its memory.events is (the OOM kills' count).
    const std::string cgroup = std::filesystem::path(options_.memory_events).parent_path();
    standbys_ = std::make_unique<StandbyRanks>(
        spawner_, clock_, run_dir_,
        [this](const std::string& line) { Say(node_.job.name + ": " + line); },
        [cgroup] { return ReadCgroupMemory(cgroup); });
  }
  stall_ = std::make_unique<StallMonitor>(StallMonitor::Options{
      .job = node_.job.name,
      .pod = IdentityFromEnvironment(CurrentEnvironment(), HostName(), node_.job.name,
                                     node_.job.namespace_, node_rank_)
                 .pod,
      .node_rank = node_rank_,
      .nodes = nnodes_,
      .policy = node_.job.spec.stall_policy,
      .dir = run_dir_,
      .spawner = spawner_,
      .say = [](const std::string& line) { Say(line); },
      .loader_pids = [this](int rank) { return pools_.PidsOf(rank); },
      // status_ is made later (StartPools): looked up at each call.
      .on_progress =
          [this](const std::vector<RankProgress>& ranks, double median, int64_t now_ns) {
            if (status_) status_->OnProgress(ranks, median, now_ns);
          },
      .on_stall =
          [this](const nlohmann::json& stall) {
            if (status_) status_->OnStall(stall);
          },
      .on_straggler =
          [this](const std::vector<RankBusy>& busy, double ratio, const nlohmann::json& straggler,
                 bool changed) {
            if (status_) status_->OnStraggler(busy, ratio, straggler, changed);
          }});
  overlap_teardown_ = owns_gang_ && IsLoopbackAddress(plan_->master_addr) &&
                      std::all_of(plan_->ranks.begin(), plan_->ranks.end(),
                                  [](const RankPlan& r) { return r.devices.visible.empty(); });
  return Status::Ok();
}

Status NodeAgent::Validate() const {
  if (!plan_) return Status::Ok();  // each node agent of a local cluster checks its own
  SP_RETURN_IF_ERROR(CheckCommand(plan_->ranks.front()));
  const int cpus_per_rank = static_cast<int>(plan_->ranks.front().devices.cpus.size());
  return CheckSharedMemory(node_.job.spec, plan_->ranks_per_node, cpus_per_rank, options_.shm_path);
}

Status NodeAgent::StartPools() {
  if (!plan_) {
    // The local cluster's node agents serve their own nodes' /status; this agent's
    // document has the node agents as members and no ranks.
    NodeStatusOptions o;
    o.identity = {
        .job = node_.job.name, .job_namespace = node_.job.namespace_, .hostname = HostName()};
    o.members = nnodes_;
    o.restart_count = options_.restart_count;
    StartStatus(std::move(o));
    return Status::Ok();
  }
  Say(node_.job.name + ": node " + std::to_string(node_rank_) + "/" + std::to_string(nnodes_) +
      ", " + std::to_string(plan_->ranks_per_node) +
      (plan_->ranks_per_node == 1 ? " rank of " : " ranks of ") +
      std::to_string(plan_->world_size) + ", backend " + plan_->backend + ", GPUs: " +
      node_.gpu_backend + ", rendezvous " + plan_->master_addr + ":" + std::to_string(port_));
  for (const std::string& line : RankChanges(*plan_, node_.job)) {
    Say(node_.job.name + ": " + line);
  }
  SP_RETURN_IF_ERROR(pools_.Start(*plan_, spawner_, options_.memory_events));
  StartStatus(NodeStatusOptionsFor(*plan_, options_.dcgm_compatible_names, node_.backend.get(),
                                   pools_.list()));
  std::string token_note;
  SP_ASSIGN_OR_RETURN(std::string status_token,
                      ReadStatusToken(options_.status_token_file, &token_note));
  if (!token_note.empty()) Say("warning: " + node_.job.name + ": " + token_note);
  endpoint_ =
      StartAgentEndpoint(options_.metrics_addr, node_.job.name, status_.get(), status_token);
  return Status::Ok();
}

void NodeAgent::StartStatus(NodeStatusOptions o) {
  if (!options_.status_file.empty()) {
    // Every GET /status makes a document: a file that cannot be written is said once.
    o.on_document = [path = options_.status_file,
                     warned = std::make_shared<std::atomic<bool>>(false)](const std::string& text) {
      Status s = WriteStatusFile(path, text);
      if (!s.ok() && !warned->exchange(true)) Say("warning: " + s.message() + " (said once)");
    };
  }
  status_ = std::make_unique<NodeStatus>(std::move(o));
  status_->Publish();  // phase Starting: the file exists before any rank starts
}

int NodeAgent::Run() {
  if (Status s = BecomeSubreaper(); !s.ok()) Say("warning: " + s.message());
  // Node 0 hosts the rendezvous (rank 0's store): a port taken by another job or process
  // fails now, naming its holder, not as rank 0's EADDRINUSE after every rank started.
  if (node_rank_ == 0) {
    if (std::optional<std::string> busy = RendezvousPortInUse(port_, getpid())) {
      return FailAgent(FailedPrecondition(*busy), ExitReasonName(ExitReason::kPortInUse));
    }
  }
  if (Status s = StartPools(); !s.ok()) return FailAgent(s);
  start_ = clock_->Now();
  restart_ = options_.restart_count;
  int code = 0;
  if (!options_.gang_addr.empty()) {
    Status s = StartGang();
    code = s.ok() ? RunInGang() : FailAgent(s);
    if (standbys_) standbys_->Stop();  // reaped with the leftovers
    AwaitTeardown();
    Stop();
    return code;
  }
  while (true) {
    const Clock::TimePoint attempt_start = clock_->Now();
    auto result = RunAttempt(restart_);
    if (!result.ok()) {
      code = FailAgent(result.status());
      break;
    }
    if (result->failure) {
      quick_failures_ =
          api::QuickFailuresAfter(policy_, quick_failures_, clock_->Now() - attempt_start);
    }
    const AttemptDecision decision = Decide(*result);
    if (decision.restart) {
      ++local_restarts_;
      ++restart_;
    }
    Report(decision);
    if (!decision.restart) {
      code = decision.exit_code;
      break;
    }
    if (overlap_teardown_) PrepareOverlap(decision, result->teardown_pending);
    if (int sig = WaitOutBackoff(decision.backoff); sig != 0) {
      // Stopped between attempts: reported like a stop during one, so the status file and
      // the termination log do not go on saying "Restarting".
      Report(AttemptDecision{.phase = AgentPhase::kTerminated,
                             .reason = "Terminated",
                             .message = "stopped by " + SignalName(sig) + " during restart backoff",
                             .exit_code = ExitForSignal(sig)});
      code = ExitForSignal(sig);
      break;
    }
  }
  if (standbys_) standbys_->Stop();  // reaped with the leftovers
  AwaitTeardown();
  Stop();
  return code;
}

void NodeAgent::PrepareOverlap(const AttemptDecision& decision, bool teardown_pending) {
  // A backoff leaves time enough to wait for the old processes.
  if (teardown_pending && decision.backoff.count() > 0) AwaitTeardown();
  // The old rank 0 may hold its store's port until the kernel has closed its files: the
  // next attempt meets on another.
  StatusOr<int> port = FreePort();
  if (!port.ok()) {
    AwaitTeardown();
    return;
  }
  port_ = *port;
  Say(node_.job.name + ": attempt " + std::to_string(restart_ + 1) + " meets on port " +
      std::to_string(port_) +
      (teardown_pending ? " while the last one's processes are torn down" : ""));
}

std::string NodeAgent::FailedFile(int restart) const {
  if (run_dir_.empty() || policy_.max_restarts <= 0) return "";  // no restart follows
  return run_dir_ + "/attempt-" + std::to_string(restart) + ".failed";
}

void NodeAgent::AwaitTeardown() {
  AwaitLeftovers(
      {}, signals_, clock_, std::min<milliseconds>(options_.grace_period, milliseconds(5000)),
      [this] { return KeptPids(); },
      [this](pid_t pid, int status) { return OnKeptExit(pid, status); });
}

std::vector<pid_t> NodeAgent::KeptPids() const {
  std::vector<pid_t> pids = pools_.Pids();
  if (standbys_) {
    for (pid_t p : standbys_->Pids()) pids.push_back(p);
  }
  return pids;
}

bool NodeAgent::OnKeptExit(pid_t pid, int wait_status) {
  return pools_.OnChildExited(pid, wait_status) || (standbys_ && standbys_->OnChildExited(pid));
}

StatusOr<std::vector<GangMember>> NodeAgent::MembersFor(int restart) const {
  if (cluster_) return cluster_->MembersFor(restart);
  SP_ASSIGN_OR_RETURN(NodePlan plan, MakeNodePlan(MakeRequest(options_, node_, node_rank_, restart,
                                                              port_, pool_root_)));
  std::vector<GangMember> members;
  for (const auto& r : plan.ranks) {
    GangMember m;
    m.label = "rank " + std::to_string(r.rank);
    m.rank = r.rank;
    m.local_rank = r.local_rank;
    m.node_rank = node_rank_;
    m.spawn.argv = r.argv;
    m.spawn.env = r.EnvList();
    m.spawn.working_dir = r.working_dir;
    m.spawn.cpus = r.devices.cpus;
    if (standbys_ && StandbyApplies(m.spawn)) {
      // What the rank imports by its first step is what the next standby preloads.
      m.spawn.env.push_back("SPAWNPOINT_STANDBY_LEARN=" + standbys_->ModulesFile(r.rank));
    }
    if (std::string failed = FailedFile(restart); !failed.empty()) {
      // When the attempt fails, the pids the agent stops (GangOptions::before_failure_stop):
      // the shim ends such a Python rank, once its exit handlers ran, by SIGTERM's default
      // action, not after the interpreter's finalization (which the restart would wait for).
      m.spawn.env.push_back("SPAWNPOINT_FAILED_FILE=" + failed);
    }
    members.push_back(std::move(m));
  }
  return members;
}

StatusOr<GangResult> NodeAgent::RunAttempt(int restart) {
  SP_ASSIGN_OR_RETURN(std::vector<GangMember> members, MembersFor(restart));
  if (stall_) SP_RETURN_IF_ERROR(stall_->Prepare(members));
  GangOptions go;
  go.grace_period = options_.grace_period;
  go.status_interval = options_.status_interval;
  go.memory_events_path = options_.memory_events;
  go.what = what_;
  go.clock = clock_;
  go.overlap_exit = overlap_teardown_;
  if (std::string path = FailedFile(restart); !path.empty()) {
    go.before_failure_stop = [path](const std::vector<pid_t>& stopped) {
      std::string pids;
      for (pid_t pid : stopped) pids += std::to_string(pid) + "\n";
      // A rank reads all of it or nothing; without it the ranks finalize as ever.
      (void)loader::WriteFileAtomically(path, pids);
    };
  }
  if (stall_) {
    go.check_health = [this](const std::vector<std::pair<int, pid_t>>& running) {
      return stall_->Check(running);
    };
  }
  if (gang_) {
    // Another node's rank failed (or the coordinator is gone): this node's ranks stop.
    go.tick_interval = milliseconds(50);
    // This agent is stopping (its pod deleted): it leaves the gang now, before its ranks are
    // stopped. Left in until the agent exits, it would have the coordinator weigh the
    // failures its stopping ranks cause on the other nodes (collective errors, maybe not
    // retryable) without this node's loss, their cause, and maybe decide on them first. On
    // node 0 the coordinator goes first: the other nodes see it go, stop their ranks and
    // rejoin the next one, which counts the attempt. Elsewhere the coordinator counts this
    // node lost (a retryable failure): the others restart when its agent is back.
    go.on_interrupt = [this](int sig) {
      const std::string why = node_.job.name + ": " + SignalName(sig) + ": ";
      if (gang_server_) {
        Say(why +
            "the gang's coordinator closes now; the other nodes stop their ranks and "
            "wait for the next one");
        gang_server_.reset();
      } else {
        Say(why + "node " + std::to_string(node_rank_) +
            " leaves the gang now; the other nodes stop their ranks and restart when its agent "
            "is back");
      }
      gang_->Leave();
    };
    // A rank's failure goes to the coordinator at once, not after this node's teardown:
    // the other nodes' collective errors that follow must not be weighed without it.
    go.on_failure = [this](const RankFailure& f) {
      ReportToGang({{"t", "exit"}, {"attempt", restart_}, {"ok", false}, {"failure", f.ToJson()}});
    };
    auto stop = std::make_shared<GangStopCheck>(
        clock_, [this] { return gang_->StopSeen(restart_); },
        [](pid_t pid) { return ProcessIsExiting(pid); });
    go.on_stderr_line = [stop](pid_t pid, const std::string& line) {
      if (StartsPythonTraceback(line)) stop->NoteTraceback(pid);
    };
    go.check_health =
        [this, stop, stalls = std::move(go.check_health)](
            const std::vector<std::pair<int, pid_t>>& running) -> std::optional<RankFailure> {
      const GangStopCheck::Verdict verdict = stop->Check(running);
      if (verdict == GangStopCheck::Verdict::kAwaitTheDying) return std::nullopt;
      if (verdict == GangStopCheck::Verdict::kStop) {
        stopped_by_gang_ = true;
        ReportToGang({{"t", "exit"}, {"attempt", restart_}, {"ok", false}, {"stopped", true}});
        RankFailure f;
        f.node_rank = node_rank_;
        f.status.signal = SIGTERM;
        f.cause = {ExitReason::kTerminated,
                   "another node's rank failed (the gang's coordinator stops every node)"};
        return f;
      }
      return stalls ? stalls(running) : std::nullopt;
    };
  }
  go.on_status = [this](int up, int total) {
    Report(AttemptDecision{.phase = AgentPhase::kRunning}, up, total);
  };
  ProcessSpawner* spawner = spawner_;
  if (!cluster_) {  // the loader pools and the standbys live beside the gang, across attempts
    go.on_other_exit = [this](pid_t pid, int status) { return OnKeptExit(pid, status); };
    go.keep_pids = [this] { return KeptPids(); };
    go.on_tick = [this] {
      pools_.Tick();
      if (standbys_) {
        standbys_->Tick();
        if (status_) status_->OnStandbys(standbys_->Memory(), standbys_->Ready());
      }
    };
    if (standbys_) {
      // This attempt's ranks start in the standbys made during the last one, if usable;
      // standbys for the next attempt are made while this one runs.
      spawner = standbys_->SpawnerFor(spawner_);
      std::map<int, SpawnOptions> next;
      if (StatusOr<std::vector<GangMember>> later = MembersFor(restart + 1); later.ok()) {
        for (GangMember& m : *later) next[m.rank] = std::move(m.spawn);
      }
      standbys_->Expect(std::move(next));
    }
  }
  if (cluster_) {  // a node agent's failure is its rank's
    go.refine_failure = [this](RankFailure& f) { return cluster_->Refine(f); };
  }
  return Gang(spawner, signals_, std::move(go)).Run(std::move(members));
}

AttemptDecision NodeAgent::Decide(const GangResult& result) {
  if (!cluster_)
    return agent::Decide(result, local_restarts_, policy_, owns_gang_, quick_failures_);
  // The local nodes' agents restart their gang in place themselves (node 0's coordinates):
  // when one exits, the gang has ended, and their reports say how.
  api::RestartPolicy never = policy_;
  never.max_restarts = 0;
  AttemptDecision d = agent::Decide(result, 0, never, owns_gang_, quick_failures_);
  const LocalCluster::Outcome outcome = cluster_->GangOutcome();
  restart_ = std::max(restart_, outcome.restarts);
  if (d.phase == AgentPhase::kFailed && !outcome.verdict.empty()) {
    d.reason = outcome.verdict;
    d.message = outcome.verdict_message;
  }
  // The failures the gang restarted from are in node 0's document: this one says the last.
  if (!d.failure && outcome.last_failure.is_object() && status_) {
    status_->OnRankFailure(outcome.last_failure.value("rank", -1),
                           outcome.last_failure.value("reason", ""), outcome.last_failure);
  }
  return d;
}

void NodeAgent::Report(const AttemptDecision& d, int up, int total) {
  const std::string& job = node_.job.name;
  const std::string elapsed = FormatElapsed(clock_->Now() - start_);
  const char* phase = AgentPhaseName(d.phase);
  if (d.phase == AgentPhase::kFailed) {
    Say(job + ": failed: " + d.failure->Line() + " (not restarted: " + d.message + ")");
  }
  // The status document (served on /status, written to --status-file), and readiness.
  if (status_) {
    if (d.failure) {
      status_->OnRankFailure(d.failure->rank, ExitReasonName(d.failure->cause.reason),
                             d.failure->ToJson());
    }
    status_->OnPhase(phase, up, total, restart_);
  }
  if (endpoint_) endpoint_->SetReadiness(phase, up, total);
  // The console line, and the termination log when the job ends.
  switch (d.phase) {
    case AgentPhase::kRunning:
      Say(job + ": " + std::to_string(up) + "/" + std::to_string(total) + " " + what_ +
          " up, restarts " + std::to_string(restart_) + ", elapsed " + elapsed +
          (plan_ ? pools_.Summary(*plan_) : ""));
      return;
    case AgentPhase::kSucceeded:
      Say(job + ": all " + what_ + " succeeded, restarts " + std::to_string(restart_) +
          ", elapsed " + elapsed);
      return;
    case AgentPhase::kRestarting:
      Say(job + ": restart " + std::to_string(local_restarts_) + " of " +
          std::to_string(policy_.max_restarts) + " " + d.message + "; after: " + d.failure->Line());
      return;
    case AgentPhase::kTerminated:
      Say(job + ": " + d.message);
      WriteTerminationLog(
          options_,
          {{"reason", "Terminated"}, {"exitCode", d.exit_code}, {"message", "agent " + d.message}});
      return;
    case AgentPhase::kFailed: {
      nlohmann::json msg = d.failure->ToJson();
      msg["restarts"] = restart_;
      // Why it is not restarted (MaxRestartsReached, NonRetryableFailure, NodeLost, ...).
      msg["verdict"] = d.reason;
      msg["verdictMessage"] = d.message;
      WriteTerminationLog(options_, msg);
      return;
    }
  }
}

int NodeAgent::FailAgent(const Status& status, const std::string& reason) {
  const int code = Fail(status);
  // Bad input stays bad; anything else (/dev/shm full) may pass on a new pod. A port in use
  // usually stays in use (a second job on the port, a server left running): retried only when
  // restartPolicy.retryOn names it.
  const bool agent_error = reason == "AgentError";
  const bool retryable =
      agent_error ? code != kExitBadInput : api::IsRetryableFailure(policy_, code, reason);
  nlohmann::json msg = {
      {"reason", reason},
      {"exitCode", code},
      {"message", agent_error ? "the agent failed: " + status.message() : status.message()},
      {"retryable", retryable},
      {"restarts", restart_}};
  if (status_) {
    status_->OnRankFailure(-1, reason, msg);
    status_->OnPhase(AgentPhaseName(AgentPhase::kFailed), 0, 0, restart_);
  }
  WriteTerminationLog(options_, msg);
  return code;
}

int NodeAgent::WaitOutBackoff(milliseconds wait) {
  const Clock::TimePoint deadline = clock_->Now() + wait;
  while (true) {
    if (int sig = signals_->WaitForTermination(milliseconds(0)); sig != 0) return sig;
    const Clock::TimePoint now = clock_->Now();
    if (now >= deadline) return 0;
    clock_->SleepUntil(std::min<Clock::TimePoint>(deadline, now + kBackoffSignalCheck));
  }
}

void NodeAgent::Stop() {
  // The coordinator first: closing this node's own connection to it first would have it
  // decide on this node's loss as it goes, a verdict the other nodes would read late.
  gang_server_.reset();
  gang_.reset();
  endpoint_.reset();  // it serves the status
  status_.reset();    // it reads the pools
  // The pools outlive every attempt; they end with the job.
  pools_.Stop(std::min<milliseconds>(options_.grace_period, milliseconds(5000)));
  if (!pool_root_.empty()) std::filesystem::remove_all(pool_root_);
  pool_root_.clear();
  stall_.reset();
  if (!run_dir_.empty()) std::filesystem::remove_all(run_dir_);
  run_dir_.clear();
}

}  // namespace spawnpoint::agent
