#include "agent/devices/gpu_backend.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <tuple>
#include <utility>

namespace spawnpoint::devices {

GpuBackend::~GpuBackend() = default;

namespace {

class NoGpu : public GpuBackend {
 public:
  explicit NoGpu(std::string why) : why_(std::move(why)) {}
  std::string Name() const override { return "none"; }
  std::string Describe() const override { return why_.empty() ? "none" : "none (" + why_ + ")"; }
  StatusOr<std::vector<GpuDevice>> Discover() override { return std::vector<GpuDevice>{}; }
  StatusOr<std::vector<GpuSample>> Sample() override { return std::vector<GpuSample>{}; }

 private:
  const std::string why_;
};

// Auto-detection accepts a backend only if it actually sees a GPU; otherwise says why not.
StatusOr<std::unique_ptr<GpuBackend>> WithGpus(StatusOr<std::unique_ptr<GpuBackend>> backend,
                                               const std::string& where) {
  if (!backend.ok()) return backend.status();
  auto gpus = (*backend)->Discover();
  if (!gpus.ok()) return gpus.status();
  if (gpus->empty()) return NotFound("no GPU found " + where);
  return backend;
}

}  // namespace

std::unique_ptr<GpuBackend> NoGpuBackend() { return std::make_unique<NoGpu>(""); }

StatusOr<std::unique_ptr<GpuBackend>> SelectGpuBackend(const std::string& kind,
                                                       const std::string& nvml_library,
                                                       const std::string& sysfs_root,
                                                       const std::string& gpu_resource) {
  const std::string root = sysfs_root.empty() ? "/sys" : sysfs_root;
  if (kind == "none") return NoGpuBackend();
  if (kind == "amd") return OpenAmdSysfsBackend(root);
  if (kind == "nvml") return OpenNvmlBackend(nvml_library, root);
  if (kind != "auto" && !kind.empty()) {
    return InvalidArgument("unknown GPU backend '" + kind +
                           "': use --gpu-backend with auto, nvml, amd or none");
  }
  auto try_nvml = [&] { return WithGpus(OpenNvmlBackend(nvml_library, root), "by NVML"); };
  auto try_amd = [&] {
    return WithGpus(OpenAmdSysfsBackend(root), "under " + root + "/class/drm");
  };
  const bool amd_first = gpu_resource == "amd.com/gpu";
  auto first = amd_first ? try_amd() : try_nvml();
  if (first.ok()) return first;
  auto second = amd_first ? try_nvml() : try_amd();
  if (second.ok()) return second;
  const Status& nvml = amd_first ? second.status() : first.status();
  const Status& amd = amd_first ? first.status() : second.status();
  return std::unique_ptr<GpuBackend>(
      std::make_unique<NoGpu>("auto: nvml: " + nvml.message() + "; amd: " + amd.message()));
}

void SortByTopology(std::vector<GpuDevice>& gpus) {
  std::stable_sort(gpus.begin(), gpus.end(), [](const GpuDevice& a, const GpuDevice& b) {
    return std::tie(a.numa_node, a.pci_bus_id, a.index) <
           std::tie(b.numa_node, b.pci_bus_id, b.index);
  });
}

std::string NormalisePciBusId(const std::string& bus_id) {
  unsigned domain = 0, bus = 0, dev = 0, fn = 0;
  char tail = 0;
  if (std::sscanf(bus_id.c_str(), "%x:%x:%x.%x%c", &domain, &bus, &dev, &fn, &tail) == 4) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", domain, bus, dev, fn);
    return buf;
  }
  std::string out = bus_id;
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace spawnpoint::devices
