#include "agent/cli/commands.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "agent/cli/preflight.h"
#include "agent/cli/self_exe.h"
#include "agent/loader/contract.h"
#include "agent/loader/pool_supervisor.h"
#include "agent/plan/node_plan.h"
#include "agent/process/spawner.h"
#include "agent/status/agent_endpoint.h"
#include "agent/supervisor/gang.h"
#include "agent/supervisor/restart_policy.h"

namespace spawnpoint::agent {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

void Say(const std::string& line) {
  std::string s = "[spawnpoint] " + line + "\n";
  (void)!write(2, s.data(), s.size());
}

int ExitCodeFor(const Status& status) {
  return status.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

int Fail(const Status& status) {
  Say("error: " + status.message());
  return ExitCodeFor(status);
}

// The manifest's file, or "$VAR" for --job-env, as messages name it.
std::string JobSource(const AgentOptions& o) {
  return o.job_env.empty() ? o.file : "$" + o.job_env;
}

StatusOr<std::vector<api::TrainingJob>> ReadJobs(const AgentOptions& o) {
  if (o.job_env.empty()) return api::LoadTrainingJobsFile(o.file);
  const char* text = getenv(o.job_env.c_str());
  if (text == nullptr) {
    return InvalidArgument("--job-env " + o.job_env + ": the environment variable is not set");
  }
  return api::ParseTrainingJobs(text, JobSource(o));
}

StatusOr<api::TrainingJob> LoadJob(const AgentOptions& o) {
  SP_ASSIGN_OR_RETURN(std::vector<api::TrainingJob> jobs, ReadJobs(o));
  if (!o.job_name.empty()) {
    for (auto& j : jobs) {
      if (j.name == o.job_name) return j;
    }
    std::string names;
    for (auto& j : jobs) names += (names.empty() ? "" : ", ") + j.name;
    return InvalidArgument(JobSource(o) + ": no TrainingJob named \"" + o.job_name +
                           "\"; found: " + names);
  }
  if (jobs.size() > 1) {
    std::string names;
    for (auto& j : jobs) names += (names.empty() ? "" : ", ") + j.name;
    return InvalidArgument(JobSource(o) + " has " + std::to_string(jobs.size()) +
                           " TrainingJobs (" + names + "): choose one with --job NAME");
  }
  return jobs.front();
}

struct Node {
  api::TrainingJob job;
  std::string gpu_backend;
  std::vector<devices::GpuDevice> gpus;
  devices::CpuTopology cpus;
  bool trainer_embeds_loader = false;
  std::shared_ptr<devices::GpuBackend> backend;  // kept open: the metrics sample the GPUs
};

// The trainer's program on disk, as the ranks will run it (PATH and workingDir applied).
std::string TrainerPath(const api::TrainingJob& job) {
  std::vector<std::string> command = job.spec.trainer.command;
  command.insert(command.end(), job.spec.trainer.args.begin(), job.spec.trainer.args.end());
  if (command.empty()) return "";
  std::string name = command.front();
  const std::string& dir = job.spec.trainer.working_dir;
  if (!dir.empty() && name.find('/') != std::string::npos && name[0] != '/') {
    name = dir + "/" + name;
  }
  const char* path = getenv("PATH");
  auto resolved = ResolveExecutable(name, path ? path : "/usr/bin:/bin");
  return resolved.ok() ? *resolved : "";
}

// Whether the program can serve as its own loader worker: every program that links the
// loader's worker entry point carries the name of the variable that switches it on.
bool EmbedsLoaderWorker(const std::string& path) {
  if (path.empty()) return false;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  bool found = false;
  if (fstat(fd, &st) == 0 && st.st_size > 0) {
    void* map = mmap(nullptr, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map != MAP_FAILED) {
      static constexpr char kMarker[] = "SPAWNPOINT_LOADER_LISTEN_FD";
      found = memmem(map, st.st_size, kMarker, sizeof(kMarker) - 1) != nullptr;
      munmap(map, st.st_size);
    }
  }
  close(fd);
  return found;
}

// When every node runs on this machine, each node agent gets its own share of the CPUs
// (as its affinity), so the nodes' ranks do not oversubscribe the cores between them.
std::vector<std::vector<int>> SplitCpusAcrossNodes(const std::vector<int>& cpus, int nnodes) {
  std::vector<std::vector<int>> shares(nnodes);
  if (cpus.empty()) return shares;
  if (static_cast<int>(cpus.size()) < nnodes) {
    for (int i = 0; i < nnodes; ++i) shares[i] = {cpus[i % cpus.size()]};
    return shares;
  }
  const size_t base = cpus.size() / nnodes, extra = cpus.size() % nnodes;
  size_t next = 0;
  for (int i = 0; i < nnodes; ++i) {
    const size_t n = base + (static_cast<size_t>(i) < extra ? 1 : 0);
    shares[i].assign(cpus.begin() + next, cpus.begin() + next + n);
    next += n;
  }
  return shares;
}

StatusOr<Node> DiscoverNode(const AgentOptions& o) {
  Node n;
  SP_ASSIGN_OR_RETURN(n.job, LoadJob(o));
  // A CPU-only job needs no GPU backend: do not even load NVML.
  const std::string kind = n.job.spec.gpus_per_node == 0 ? "none" : o.gpu_backend;
  SP_ASSIGN_OR_RETURN(auto backend, devices::SelectGpuBackend(kind, o.nvml_library, o.sysfs_root,
                                                              n.job.spec.gpu_resource));
  n.gpu_backend = backend->Describe();
  SP_ASSIGN_OR_RETURN(n.gpus, backend->Discover());
  n.backend = std::move(backend);
  SP_ASSIGN_OR_RETURN(n.cpus, devices::ReadCpuTopology(o.sysfs_root, devices::AllowedCpus()));
  n.trainer_embeds_loader = EmbedsLoaderWorker(TrainerPath(n.job));
  return n;
}

// The shim ships beside the agent: <prefix>/bin/spawnpoint-agent and
// <prefix>/share/spawnpoint/python/sitecustomize.py (the build tree and the agent bundle
// share this layout). SPAWNPOINT_PYTHON_SHIM_DIR overrides it.
std::string PythonShimDir() {
  if (const char* dir = getenv("SPAWNPOINT_PYTHON_SHIM_DIR"); dir != nullptr) return dir;
  std::filesystem::path exe = SelfExecutablePath();
  if (exe.empty()) return "";
  std::error_code ec;
  auto dir = exe.parent_path().parent_path() / "share" / "spawnpoint" / "python";
  if (!std::filesystem::exists(dir / "sitecustomize.py", ec)) return "";
  return dir.string();
}

PlanRequest MakeRequest(const AgentOptions& o, const Node& n, int node_rank, int restart_count,
                        int master_port, const std::string& pool_root = "") {
  PlanRequest r;
  r.job = &n.job;
  r.node_rank = node_rank;
  r.nnodes = o.nnodes;
  r.master_addr = o.master_addr.empty() ? "127.0.0.1" : o.master_addr;
  r.master_port = master_port;
  r.restart_count = restart_count;
  r.max_restarts = o.max_restarts;
  r.base_env = CurrentEnvironment();
  r.gpus = n.gpus;
  r.gpu_backend = n.gpu_backend;
  r.cpus = n.cpus;
  r.python_shim_dir = PythonShimDir();
  r.pool_root = pool_root;
  r.trainer_embeds_loader = n.trainer_embeds_loader;
  return r;
}

// The command must be runnable before anything starts: a typo fails now, not per rank.
Status CheckCommand(const RankPlan& rank) {
  std::string name = rank.argv.front();
  if (!rank.working_dir.empty() && name.find('/') != std::string::npos && name[0] != '/') {
    name = rank.working_dir + "/" + name;
  }
  auto path = rank.env.count("PATH") ? rank.env.at("PATH") : std::string("/usr/bin:/bin");
  auto resolved = ResolveExecutable(name, path);
  if (!resolved.ok()) {
    return InvalidArgument("the trainer container's " + resolved.status().message());
  }
  return Status::Ok();
}

StatusOr<int> FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Internal("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  if (port <= 0) return Internal("cannot find a free port");
  return port;
}

std::string Elapsed(SteadyClock::time_point start) {
  auto s = std::chrono::duration_cast<std::chrono::seconds>(SteadyClock::now() - start).count();
  char buf[32];
  snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
           static_cast<long long>((s / 60) % 60), static_cast<long long>(s % 60));
  return buf;
}

bool ShouldWriteTerminationLog(const AgentOptions& o) {
  if (o.termination_log.empty()) return false;
  if (o.termination_log_explicit) return true;
  struct stat st {};
  return stat(o.termination_log.c_str(), &st) == 0;  // the kubelet creates it in pods
}

void WriteTerminationLog(const AgentOptions& o, const nlohmann::json& message) {
  if (!ShouldWriteTerminationLog(o)) return;
  std::ofstream out(o.termination_log, std::ios::trunc);
  // Kubernetes keeps at most 4096 bytes of it.
  std::string text = message.dump();
  if (text.size() > 4000) text = text.substr(0, 4000);
  out << text << "\n";
  if (!out) Say("warning: cannot write the termination log " + o.termination_log);
}

// Runs attempts of one gang under the job's restart policy. `make_members` builds the
// members of attempt `restart_count`; `read_failure` may refine the failing member's
// report (a node agent's own termination log names the rank).
struct AttemptHooks {
  std::function<StatusOr<std::vector<GangMember>>(int restart)> make_members;
  // May refine the failing member's report (a node agent's own termination log names the rank).
  std::function<void(RankFailure&)> refine_failure;
  // Processes that live across attempts (loader pools): see GangOptions.
  std::function<bool(pid_t, int)> on_other_exit;
  std::function<std::vector<pid_t>()> keep_pids;
  std::function<void()> on_tick;
  std::function<std::string()> status_suffix;     // appended to the status line
  std::function<nlohmann::json()> loader_status;  // per-rank loader statistics
  // The metrics endpoint's view (agent/status): every status-file event, and failures.
  std::function<void(const std::string& phase, int up, int total, int restarts)> on_phase;
  std::function<void(const RankFailure&)> on_failure;
};

// The --status-file document; written atomically so a reader never sees half of it.
void WriteStatusFile(const AgentOptions& o, const api::TrainingJob& job, const std::string& phase,
                     int up, int total, int restarts, SteadyClock::time_point start,
                     const AttemptHooks& hooks) {
  if (hooks.on_phase) hooks.on_phase(phase, up, total, restarts);
  if (o.status_file.empty()) return;
  nlohmann::json j = {
      {"job", job.name},
      {"namespace", job.namespace_},
      {"nodeRank", std::max(0, o.node_rank)},
      {"phase", phase},
      {"membersUp", up},
      {"members", total},
      {"restarts", restarts},
      {"elapsedSeconds", std::chrono::duration<double>(SteadyClock::now() - start).count()},
  };
  if (hooks.loader_status) j["loader"] = hooks.loader_status();
  const std::string tmp = o.status_file + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump() << "\n";
  }
  if (rename(tmp.c_str(), o.status_file.c_str()) != 0) {
    Say("warning: cannot write the status file " + o.status_file + ": " + strerror(errno));
  }
}

int RunWithRestarts(const AgentOptions& o, const api::TrainingJob& job, bool owns_gang,
                    const std::string& what, SignalWatcher* signals, ProcessSpawner* spawner,
                    const AttemptHooks& hooks) {
  const auto& make_members = hooks.make_members;
  const auto& refine_failure = hooks.refine_failure;
  const auto start = SteadyClock::now();
  api::RestartPolicy policy = job.spec.restart_policy;
  if (o.max_restarts >= 0) policy.max_restarts = o.max_restarts;
  int restart = o.restart_count;
  int local_restarts = 0;
  while (true) {
    auto members = make_members(restart);
    if (!members.ok()) return Fail(members.status());
    GangOptions go;
    go.grace_period = o.grace_period;
    go.status_interval = o.status_interval;
    go.memory_events_path = o.memory_events;
    go.what = what;
    go.on_status = [&](int up, int total) {
      WriteStatusFile(o, job, "Running", up, total, restart, start, hooks);
      Say(job.name + ": " + std::to_string(up) + "/" + std::to_string(total) + " " + what +
          " up, restarts " + std::to_string(restart) + ", elapsed " + Elapsed(start) +
          (hooks.status_suffix ? hooks.status_suffix() : ""));
    };
    go.on_other_exit = hooks.on_other_exit;
    go.keep_pids = hooks.keep_pids;
    go.on_tick = hooks.on_tick;
    Gang gang(spawner, signals, go);
    GangResult result = gang.Run(std::move(*members));
    if (result.outcome == GangOutcome::kSucceeded) {
      WriteStatusFile(o, job, "Succeeded", 0, 0, restart, start, hooks);
      Say(job.name + ": all " + what + " succeeded, restarts " + std::to_string(restart) +
          ", elapsed " + Elapsed(start));
      return 0;
    }
    if (result.outcome == GangOutcome::kInterrupted) {
      WriteStatusFile(o, job, "Terminated", 0, 0, restart, start, hooks);
      Say(job.name + ": stopped by " + SignalName(result.interrupt_signal));
      WriteTerminationLog(o,
                          {{"reason", "Terminated"},
                           {"exitCode", result.ExitCode()},
                           {"message", "agent stopped by " + SignalName(result.interrupt_signal)}});
      return result.ExitCode();
    }
    RankFailure failure = *result.failure;
    if (refine_failure) refine_failure(failure);
    if (hooks.on_failure) hooks.on_failure(failure);
    const int code = failure.status.ShellCode();
    if (owns_gang && ShouldRestart(policy, local_restarts, code)) {
      ++local_restarts;
      ++restart;
      WriteStatusFile(o, job, "Restarting", 0, 0, restart, start, hooks);
      const milliseconds wait = RestartBackoff(policy, local_restarts);
      Say(job.name + ": restart " + std::to_string(local_restarts) + " of " +
          std::to_string(policy.max_restarts) + " in " +
          std::to_string(wait.count() / 1000.0).substr(0, 4) + "s after: " + failure.Line());
      if (int sig = signals->WaitForTermination(wait); sig != 0) {
        Say(job.name + ": stopped by " + SignalName(sig) + " during restart backoff");
        return 128 + sig;
      }
      continue;
    }
    std::string why = !owns_gang ? "the gang spans several nodes: the operator restarts it"
                      : !IsRetryableExitCode(policy, code)
                          ? "exit code " + std::to_string(code) + " is not retryable"
                          : "maxRestarts (" + std::to_string(policy.max_restarts) + ") reached";
    Say(job.name + ": failed: " + failure.Line() + " (not restarted: " + why + ")");
    WriteStatusFile(o, job, "Failed", 0, 0, restart, start, hooks);
    nlohmann::json msg = failure.ToJson();
    msg["restarts"] = restart;
    WriteTerminationLog(o, msg);
    return code;
  }
}

int RunLocalNodes(const AgentOptions& o, const Node& n, SignalWatcher* signals) {
  const int nnodes = o.nnodes > 0 ? o.nnodes : n.job.spec.nodes;
  int port = o.master_port >= 0 ? o.master_port : n.job.spec.rendezvous_port;
  if (port == 0) {
    auto p = FreePort();
    if (!p.ok()) return Fail(p.status());
    port = *p;
  }
  // Validate every node's plan now, so bad input fails before any agent starts.
  for (int i = 0; i < nnodes; ++i) {
    auto plan = MakeNodePlan(MakeRequest(o, n, i, o.restart_count, port));
    if (!plan.ok()) return Fail(plan.status());
  }
  char tmpl[] = "/tmp/spawnpoint-nodes-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return Fail(Internal("mkdtemp failed"));
  const std::string dir = tmpl;
  const std::string self = SelfExecutablePath();
  if (self.empty()) return Fail(Internal("cannot read /proc/self/exe"));
  const auto shares = SplitCpusAcrossNodes(n.cpus.AllCpus(), nnodes);
  Say(n.job.name + ": running " + std::to_string(nnodes) + " nodes locally, rendezvous on " +
      (o.master_addr.empty() ? "127.0.0.1" : o.master_addr) + ":" + std::to_string(port));

  auto make_members = [&](int restart) -> StatusOr<std::vector<GangMember>> {
    std::vector<GangMember> members;
    for (int i = 0; i < nnodes; ++i) {
      std::string log = dir + "/node-" + std::to_string(i) + ".json";
      unlink(log.c_str());
      GangMember m;
      m.label = "node " + std::to_string(i);
      m.rank = -1;
      m.node_rank = i;
      m.prefix_output = false;  // node agents prefix their ranks' lines themselves
      m.spawn.cpus = shares[i];
      m.spawn.argv = {self,
                      "run",
                      o.job_env.empty() ? "-f" : "--job-env",
                      o.job_env.empty() ? o.file : o.job_env,
                      "--node-rank",
                      std::to_string(i),
                      "--nnodes",
                      std::to_string(nnodes),
                      "--master-addr",
                      o.master_addr.empty() ? "127.0.0.1" : o.master_addr,
                      "--master-port",
                      std::to_string(port),
                      "--max-restarts",
                      "0",
                      "--restart-count",
                      std::to_string(restart),
                      "--termination-log",
                      log,
                      "--grace-period",
                      std::to_string(o.grace_period.count() / 1000.0),
                      "--status-interval",
                      std::to_string(o.status_interval.count() / 1000.0),
                      "--gpu-backend",
                      o.gpu_backend,
                      "--sysfs-root",
                      o.sysfs_root,
                      "--shm-path",
                      o.shm_path,
                      "--cgroup-memory-events",
                      o.memory_events};
      m.spawn.argv.push_back("--metrics-addr");  // each node agent on its own port
      m.spawn.argv.push_back(LocalNodeMetricsAddress(o.metrics_addr, i));
      if (o.dcgm_compatible_names) m.spawn.argv.push_back("--dcgm-compatible-names");
      if (!o.nvml_library.empty()) {
        m.spawn.argv.push_back("--nvml-library");
        m.spawn.argv.push_back(o.nvml_library);
      }
      if (!o.job_name.empty()) {
        m.spawn.argv.push_back("--job");
        m.spawn.argv.push_back(o.job_name);
      }
      for (const auto& [k, v] : CurrentEnvironment()) m.spawn.env.push_back(k + "=" + v);
      members.push_back(std::move(m));
    }
    return members;
  };
  auto refine = [&](RankFailure& f) {
    std::ifstream in(dir + "/node-" + std::to_string(f.node_rank) + ".json");
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.contains("rank")) return;
    f.rank = j.value("rank", f.rank);
    f.local_rank = j.value("localRank", f.local_rank);
    f.cause.message = j.value("message", f.cause.message);
    std::string reason = j.value("reason", "");
    for (auto r : {ExitReason::kUserError, ExitReason::kOomKilled, ExitReason::kShmExhausted,
                   ExitReason::kKilled, ExitReason::kTerminated, ExitReason::kCrashed}) {
      if (reason == ExitReasonName(r)) f.cause.reason = r;
    }
  };
  auto spawner = MakeVforkSpawner();
  AttemptHooks hooks;
  hooks.make_members = make_members;
  hooks.refine_failure = refine;
  int code = RunWithRestarts(o, n.job, /*owns_gang=*/true, "nodes", signals, spawner.get(), hooks);
  std::filesystem::remove_all(dir);
  return code;
}

// Starts every rank's loader pool before any rank, so workers are warm when ranks connect.
StatusOr<std::vector<std::unique_ptr<loader::PoolSupervisor>>> StartPools(const NodePlan& plan,
                                                                          ProcessSpawner* spawner,
                                                                          const AgentOptions& o) {
  std::vector<std::unique_ptr<loader::PoolSupervisor>> pools;
  for (const auto& r : plan.ranks) {
    if (!r.pool) {
      if (!r.pool_skipped.empty() && r.local_rank == 0) {
        Say(plan.job_name + ": no agent-owned loader workers: " + r.pool_skipped);
      }
      continue;
    }
    loader::PoolSpec spec;
    spec.rank = r.rank;
    spec.workers = r.pool->workers;
    spec.dir = r.pool->dir;
    spec.argv = r.pool->argv;
    spec.env = r.pool->env;
    spec.cpus = r.devices.cpus;
    spec.sink_fd = 2;
    spec.memory_events_path = o.memory_events;
    auto pool = std::make_unique<loader::PoolSupervisor>(spawner, spec);
    if (Status s = pool->Start(); !s.ok()) {
      pool->StopAndReap(milliseconds(1000));
      for (auto& p : pools) p->StopAndReap(milliseconds(1000));
      return s.WithPrefix("rank " + std::to_string(r.rank) + " loader workers");
    }
    pools.push_back(std::move(pool));
  }
  if (!pools.empty()) {
    Say(plan.job_name + ": " + std::to_string(pools.size()) + " loader pools of " +
        std::to_string(pools.front()->spec().workers) + " workers started" +
        (plan.ranks.front().pool->auto_workers ? " (workersPerRank auto: ranks pick the knee)"
                                               : ""));
  }
  return pools;
}

// ", data stall 4%, 1234 samples/s" from the ranks' loader statistics, when there are any.
std::string LoaderSummary(const NodePlan& plan) {
  double stall = 0, samples = 0;
  int reporting = 0;
  for (const auto& r : plan.ranks) {
    if (!r.pool) continue;
    std::ifstream in(loader::StatsPath(r.pool->dir));
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    stall += j.value("dataStall", 0.0);
    samples += j.value("samplesPerSecond", 0.0);
    ++reporting;
  }
  if (reporting == 0) return "";
  char buf[96];
  snprintf(buf, sizeof(buf), ", data stall %.0f%%, %.0f samples/s", 100.0 * stall / reporting,
           samples);
  return buf;
}

}  // namespace

int PlanCommand(const AgentOptions& o) {
  auto node = DiscoverNode(o);
  if (!node.ok()) return Fail(node.status());
  const int nnodes = o.nnodes > 0 ? o.nnodes : node->job.spec.nodes;
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
  auto node = DiscoverNode(o);
  if (!node.ok()) return Fail(node.status());
  if (Status s = BecomeSubreaper(); !s.ok()) Say("warning: " + s.message());
  const int nnodes = o.nnodes > 0 ? o.nnodes : node->job.spec.nodes;
  if (nnodes > 1 && o.node_rank < 0) return RunLocalNodes(o, *node, signals);

  int port = o.master_port >= 0 ? o.master_port : node->job.spec.rendezvous_port;
  if (port == 0) {
    auto p = FreePort();
    if (!p.ok()) return Fail(p.status());
    port = *p;
  }
  const int node_rank = std::max(0, o.node_rank);
  std::string pool_root;
  if (node->job.spec.loader.workers_per_rank != 0) {
    // Short: a pool's socket paths must fit a sockaddr_un (107 bytes).
    std::string tmpl = (std::filesystem::temp_directory_path() / "spawnpoint-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) return Fail(Internal("mkdtemp " + tmpl + " failed"));
    pool_root = tmpl;
  }
  auto first = MakeNodePlan(MakeRequest(o, *node, node_rank, o.restart_count, port, pool_root));
  if (!first.ok()) return Fail(first.status());
  if (Status s = CheckCommand(first->ranks.front()); !s.ok()) return Fail(s);
  const int cpus_per_rank = static_cast<int>(first->ranks.front().devices.cpus.size());
  if (Status s =
          CheckSharedMemory(node->job.spec, first->ranks_per_node, cpus_per_rank, o.shm_path);
      !s.ok()) {
    return Fail(s);
  }
  Say(node->job.name + ": node " + std::to_string(node_rank) + "/" + std::to_string(nnodes) + ", " +
      std::to_string(first->ranks_per_node) + " ranks of " + std::to_string(first->world_size) +
      ", backend " + first->backend + ", GPUs: " + node->gpu_backend + ", rendezvous " +
      first->master_addr + ":" + std::to_string(port));

  auto spawner = MakeVforkSpawner();
  auto pools = StartPools(*first, spawner.get(), o);
  if (!pools.ok()) return Fail(pools.status());
  auto endpoint = StartAgentEndpoint(o.metrics_addr, o.dcgm_compatible_names, *first,
                                     node->backend.get(), &*pools);

  AttemptHooks hooks;
  if (endpoint) {
    hooks.on_phase = [&](const std::string& phase, int up, int total, int restarts) {
      endpoint->OnPhase(phase, up, total, restarts);
    };
    hooks.on_failure = [&](const RankFailure& f) {
      endpoint->OnRankFailure(f.rank, ExitReasonName(f.cause.reason));
    };
  }
  hooks.make_members = [&](int restart) -> StatusOr<std::vector<GangMember>> {
    SP_ASSIGN_OR_RETURN(NodePlan plan,
                        MakeNodePlan(MakeRequest(o, *node, node_rank, restart, port, pool_root)));
    std::vector<GangMember> members;
    for (const auto& r : plan.ranks) {
      GangMember m;
      m.label = "rank " + std::to_string(r.rank);
      m.rank = r.rank;
      m.local_rank = r.local_rank;
      m.node_rank = node_rank;
      m.spawn.argv = r.argv;
      m.spawn.env = r.EnvList();
      m.spawn.working_dir = r.working_dir;
      m.spawn.cpus = r.devices.cpus;
      members.push_back(std::move(m));
    }
    return members;
  };
  hooks.on_other_exit = [&](pid_t pid, int status) {
    for (auto& p : *pools) {
      if (p->OnChildExited(pid, status)) return true;
    }
    return false;
  };
  hooks.keep_pids = [&] {
    std::vector<pid_t> pids;
    for (auto& p : *pools) {
      auto more = p->Pids();
      pids.insert(pids.end(), more.begin(), more.end());
    }
    return pids;
  };
  hooks.on_tick = [&] {
    for (auto& p : *pools) p->Tick();
  };
  hooks.status_suffix = [&] { return LoaderSummary(*first); };
  hooks.loader_status = [&] {
    nlohmann::json ranks = nlohmann::json::array();
    for (const auto& r : first->ranks) {
      nlohmann::json entry = {{"rank", r.rank}};
      if (r.pool) {
        std::ifstream in(loader::StatsPath(r.pool->dir));
        nlohmann::json stats = nlohmann::json::parse(in, nullptr, false);
        if (!stats.is_discarded()) entry["stats"] = stats;
        for (auto& p : *pools) {
          if (p->spec().rank == r.rank) entry["pool"] = p->StatusJson();
        }
      }
      ranks.push_back(entry);
    }
    return ranks;
  };
  int code = RunWithRestarts(o, node->job, /*owns_gang=*/nnodes == 1, "ranks", signals,
                             spawner.get(), hooks);
  endpoint.reset();  // it reads the pools
  // The pools outlive every attempt; they end with the job.
  for (auto& p : *pools) p->StopAndReap(std::min<milliseconds>(o.grace_period, milliseconds(5000)));
  pools->clear();
  if (!pool_root.empty()) std::filesystem::remove_all(pool_root);
  return code;
}

}  // namespace spawnpoint::agent
