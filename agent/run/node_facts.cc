#include "agent/run/node_facts.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "agent/process/spawner.h"
#include "agent/run/preflight.h"
#include "agent/run/self_exe.h"
#include "common/env_parts.h"

namespace spawnpoint::agent {
namespace {

// The manifest's file, or "$VAR" for --job-env, as messages name it.
std::string JobSource(const AgentOptions& o) {
  return o.job_env.empty() ? o.file : "$" + o.job_env;
}

StatusOr<std::vector<api::TrainingJob>> ReadJobs(const AgentOptions& o) {
  // A manifest file is a local run's: nothing resolves valueFrom/envFrom here. --job-env is
  // how the operator starts a pod's agent, whose environment the kubelet has resolved.
  if (o.job_env.empty()) return api::LoadTrainingJobsFile(o.file, {.local = true});
  // One variable, or its parts when the job is longer than one may be (common/env_parts.h).
  StatusOr<std::optional<std::string>> text =
      JoinEnvValue(o.job_env, [](const std::string& var) -> std::optional<std::string> {
        const char* v = getenv(var.c_str());
        return v ? std::optional<std::string>(v) : std::nullopt;
      });
  if (!text.ok()) return InvalidArgument("--job-env " + o.job_env + ": " + text.status().message());
  if (!*text) {
    return InvalidArgument("--job-env " + o.job_env + ": the environment variable is not set");
  }
  return api::ParseTrainingJobs(**text, JobSource(o));
}

std::string JobNames(const std::vector<api::TrainingJob>& jobs) {
  std::string names;
  for (auto& j : jobs) names += (names.empty() ? "" : ", ") + j.name;
  return names;
}

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

// A bare `torchrun` in the command: the ranks run the interpreter of torchrun's shebang
// line (torchrun found on the ranks' PATH), else python3 (api/torchrun_command.h).
void ResolveTorchrunInterpreter(api::TrainingJob* job) {
  api::TrainerContainer& trainer = job->spec.trainer;
  if (!trainer.torchrun || !trainer.torchrun->interpreter_from_launcher) return;
  const char* agent_path = getenv("PATH");
  std::string path = agent_path ? agent_path : "/usr/bin:/bin";
  for (const auto& var : trainer.env) {
    if (var.name == "PATH") path = var.value;
  }
  std::string launcher = trainer.torchrun->launcher_program;
  if (!trainer.working_dir.empty() && launcher.find('/') != std::string::npos &&
      launcher[0] != '/') {
    launcher = trainer.working_dir + "/" + launcher;
  }
  auto resolved = ResolveExecutable(launcher, path);
  if (!resolved.ok()) return;
  int fd = open(resolved->c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  char head[1024];
  ssize_t n = read(fd, head, sizeof head);
  close(fd);
  if (n <= 0) return;
  std::string interpreter = api::PythonFromShebang(std::string_view(head, n));
  if (interpreter.empty()) return;
  trainer.torchrun->interpreter = interpreter;
  trainer.command = trainer.torchrun->RankArgv();
}

StatusOr<api::TrainingJob> PickJob(const AgentOptions& o, std::vector<api::TrainingJob> jobs) {
  if (!o.job_name.empty()) {
    for (auto& j : jobs) {
      if (j.name == o.job_name) return j;
    }
    return InvalidArgument(JobSource(o) + ": no TrainingJob named \"" + o.job_name +
                           "\"; found: " + JobNames(jobs));
  }
  if (jobs.size() > 1) {
    return InvalidArgument(JobSource(o) + " has " + std::to_string(jobs.size()) +
                           " TrainingJobs (" + JobNames(jobs) + "): choose one with --job NAME");
  }
  return jobs.front();
}

}  // namespace

StatusOr<api::TrainingJob> LoadJob(const AgentOptions& o) {
  SP_ASSIGN_OR_RETURN(std::vector<api::TrainingJob> jobs, ReadJobs(o));
  SP_ASSIGN_OR_RETURN(api::TrainingJob job, PickJob(o, std::move(jobs)));
  ResolveTorchrunInterpreter(&job);
  std::error_code ec;
  SP_RETURN_IF_ERROR(CheckScript(job.spec.trainer, std::filesystem::current_path(ec).string()));
  return job;
}

StatusOr<std::unique_ptr<devices::GpuBackend>> OpenGpuBackend(const AgentOptions& o,
                                                              const api::TrainingJob& job) {
  const std::string kind = job.spec.gpus_per_node == 0 ? "none" : o.gpu_backend;
  return devices::SelectGpuBackend(kind, o.nvml_library, o.sysfs_root, job.spec.gpu_resource);
}

StatusOr<NodeFacts> DiscoverNode(const AgentOptions& o, api::TrainingJob job,
                                 std::shared_ptr<devices::GpuBackend> backend) {
  NodeFacts n;
  n.job = std::move(job);
  n.gpu_backend = backend->Describe();
  SP_ASSIGN_OR_RETURN(n.gpus, backend->Discover());
  n.backend = std::move(backend);
  SP_ASSIGN_OR_RETURN(n.cpus, devices::ReadCpuTopology(o.sysfs_root, devices::AllowedCpus()));
  n.trainer_embeds_loader = EmbedsLoaderWorker(TrainerPath(n.job));
  return n;
}

int NodeCount(const AgentOptions& o, const api::TrainingJob& job) {
  return o.nnodes > 0 ? o.nnodes : job.spec.nodes;
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

bool IsLoopbackAddress(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

StatusOr<int> RendezvousPort(const AgentOptions& o, const api::TrainingJob& job) {
  const int port = o.master_port >= 0 ? o.master_port : job.spec.rendezvous_port;
  if (port != 0) return port;
  return FreePort();
}

std::string MasterAddress(const AgentOptions& o) {
  return o.master_addr.empty() ? "127.0.0.1" : o.master_addr;
}

PlanRequest MakeRequest(const AgentOptions& o, const NodeFacts& n, int node_rank, int restart_count,
                        int master_port, const std::string& pool_root) {
  PlanRequest r;
  r.job = &n.job;
  r.node_rank = node_rank;
  r.nnodes = o.nnodes;
  r.master_addr = MasterAddress(o);
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

Status CheckCommand(const RankPlan& rank) {
  auto resolved = ResolveRankExecutable(rank);
  if (!resolved.ok()) {
    return InvalidArgument("the trainer container's " + resolved.status().message());
  }
  return Status::Ok();
}

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

}  // namespace spawnpoint::agent
