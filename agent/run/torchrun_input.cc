#include "agent/run/torchrun_input.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string_view>

#include "agent/devices/gpu_backend.h"
#include "agent/devices/topology.h"
#include "agent/process/spawner.h"
#include "agent/run/preflight.h"
#include "agent/run/report.h"
#include "api/torchrun_job.h"

namespace spawnpoint::agent {
namespace {

// The interpreter on the first line of `torchrun` on the agent's PATH: the one torchrun
// would have run the ranks with. "" when there is none.
std::string TorchrunPython() {
  const char* path = getenv("PATH");
  auto torchrun = ResolveExecutable("torchrun", path ? path : "/usr/bin:/bin");
  if (!torchrun.ok()) return "";
  const int fd = open(torchrun->c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  char head[1024];
  const ssize_t n = read(fd, head, sizeof head);
  close(fd);
  return n > 0 ? api::PythonFromShebang(std::string_view(head, static_cast<size_t>(n))) : "";
}

// What torchrun's --nproc_per_node and the ranks' interpreter depend on here.
StatusOr<api::TorchrunMachine> ReadMachine(const AgentOptions& o) {
  api::TorchrunMachine machine;
  SP_ASSIGN_OR_RETURN(
      std::unique_ptr<devices::GpuBackend> backend,
      devices::SelectGpuBackend(o.gpu_backend, o.nvml_library, o.sysfs_root, "nvidia.com/gpu"));
  SP_ASSIGN_OR_RETURN(std::vector<devices::GpuDevice> gpus, backend->Discover());
  machine.gpus = static_cast<int>(gpus.size());
  machine.cpus = static_cast<int>(devices::AllowedCpus().size());
  if (const char* python = getenv("PYTHON_EXEC"); python != nullptr) machine.python_exec = python;
  machine.torchrun_python = TorchrunPython();
  return machine;
}

}  // namespace

StatusOr<api::TrainingJob> LoadTorchrunJob(AgentOptions* o) {
  SP_ASSIGN_OR_RETURN(api::TorchrunMachine machine, ReadMachine(*o));
  size_t bad = 0;
  StatusOr<api::TorchrunJob> built = api::TorchrunJobFromCommandLine(
      {.args = o->torchrun, .name = o->job_name, .spec_sets = o->spec_sets}, machine, &bad);
  if (!built.ok()) {
    if (bad < o->torchrun.size() && IsTorchrunAgentFlag(o->torchrun[bad])) {
      return InvalidArgument(o->torchrun[bad] +
                             " is spawnpoint-agent's own flag: give it right after `torchrun`, "
                             "before torchrun's flags (spawnpoint-agent torchrun " +
                             o->torchrun[bad] + " ... --nproc_per_node N script.py)");
    }
    return built.status();
  }
  if (!o->gang_addr.empty() && built->node_rank < 0) {
    return InvalidArgument(
        "--gang is for a job spanning machines: give torchrun's --nnodes and --node_rank too");
  }
  o->node_rank = built->node_rank;
  o->master_addr = built->master_addr;
  o->master_port = built->master_port;
  api::TrainingJob job = std::move(built->job);
  // The script must be there (bad input, not every rank's exit 2); the manifest's field
  // paths would mean nothing on a command line.
  job.spec.trainer.argv_origins.clear();
  std::error_code ec;
  SP_RETURN_IF_ERROR(CheckScript(job.spec.trainer, std::filesystem::current_path(ec).string()));
  Say(job.name + ": " + job.spec.trainer.torchrun->Summary(api::RanksPerNode(job.spec)));
  Say(job.name + ": " + built->summary);
  return job;
}

}  // namespace spawnpoint::agent
