// NVML through dlopen/dlsym. The few types and entry points used are declared here with
// the ABI of nvml.h, so neither the CUDA toolkit nor the driver is needed to build, and a
// machine without the driver gets an error instead of a loader failure at start-up.
#include <dlfcn.h>

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "agent/devices/gpu_backend.h"
#include "agent/devices/sysfs_util.h"

namespace spawnpoint::devices {
namespace {

// --- the subset of nvml.h we use (same layout and calling convention) ---
using nvmlReturn_t = int;
constexpr nvmlReturn_t NVML_SUCCESS = 0;
constexpr nvmlReturn_t NVML_ERROR_GPU_IS_LOST = 15;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];
};
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};
enum nvmlTemperatureSensors_t { NVML_TEMPERATURE_GPU = 0 };
enum nvmlEnableState_t { NVML_FEATURE_DISABLED = 0, NVML_FEATURE_ENABLED = 1 };
constexpr unsigned int kNvmlStringBuffer = 96;  // NVML_DEVICE_{UUID,NAME}_V2_BUFFER_SIZE

struct NvmlApi {
  nvmlReturn_t (*Init)() = nullptr;
  nvmlReturn_t (*Shutdown)() = nullptr;
  const char* (*ErrorString)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*GetCount)(unsigned int*) = nullptr;
  nvmlReturn_t (*GetHandleByIndex)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*GetUUID)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*GetName)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*GetPciInfo)(nvmlDevice_t, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*GetMemoryInfo)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  // Optional: absent in old drivers or unsupported on some boards.
  nvmlReturn_t (*GetUtilizationRates)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*GetPowerUsage)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*GetTemperature)(nvmlDevice_t, nvmlTemperatureSensors_t, unsigned int*) = nullptr;
  nvmlReturn_t (*GetRetiredPagesPendingStatus)(nvmlDevice_t, nvmlEnableState_t*) = nullptr;
  nvmlReturn_t (*GetRemappedRows)(nvmlDevice_t, unsigned int*, unsigned int*, unsigned int*,
                                  unsigned int*) = nullptr;
};

template <typename Fn>
bool Bind(void* lib, const char* symbol, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(lib, symbol));
  return fn != nullptr;
}

std::string CString(const char* buf, size_t size) {
  size_t n = 0;
  while (n < size && buf[n] != '\0') ++n;
  return std::string(buf, n);
}

constexpr const char* kLostFix =
    "the GPU fell off the bus or stopped responding: drain the node and reset or replace the GPU";

class NvmlBackend : public GpuBackend {
 public:
  NvmlBackend(void* lib, NvmlApi api, std::string sysfs_root)
      : lib_(lib), api_(api), sysfs_root_(std::move(sysfs_root)) {}
  ~NvmlBackend() override {
    api_.Shutdown();
    dlclose(lib_);
  }

  std::string Name() const override { return "nvml"; }

  StatusOr<std::vector<GpuDevice>> Discover() override {
    std::lock_guard<std::mutex> lock(mu_);
    unsigned int count = 0;
    if (nvmlReturn_t rc = api_.GetCount(&count); rc != NVML_SUCCESS) {
      return Error("nvmlDeviceGetCount_v2()", rc);
    }
    std::vector<GpuDevice> gpus;
    for (unsigned int i = 0; i < count; ++i) {
      SP_ASSIGN_OR_RETURN(GpuDevice gpu, DiscoverOne(i));
      gpus.push_back(std::move(gpu));
    }
    SortByTopology(gpus);
    return gpus;
  }

  StatusOr<std::vector<GpuSample>> Sample() override {
    std::lock_guard<std::mutex> lock(mu_);
    unsigned int count = 0;
    if (nvmlReturn_t rc = api_.GetCount(&count); rc != NVML_SUCCESS) {
      return Error("nvmlDeviceGetCount_v2()", rc);
    }
    std::vector<GpuSample> samples;
    for (unsigned int i = 0; i < count; ++i) {
      GpuSample s;
      s.index = static_cast<int>(i);
      nvmlDevice_t dev = nullptr;
      if (api_.GetHandleByIndex(i, &dev) == NVML_SUCCESS) {
        nvmlMemory_t mem{};
        if (api_.GetMemoryInfo(dev, &mem) == NVML_SUCCESS) {
          s.memory_total_bytes = mem.total;
          s.memory_used_bytes = mem.used;
        }
        nvmlUtilization_t util{};
        if (api_.GetUtilizationRates && api_.GetUtilizationRates(dev, &util) == NVML_SUCCESS) {
          s.utilisation = util.gpu / 100.0;
        }
        unsigned int milliwatts = 0;
        if (api_.GetPowerUsage && api_.GetPowerUsage(dev, &milliwatts) == NVML_SUCCESS) {
          s.power_watts = milliwatts / 1000.0;
        }
        unsigned int celsius = 0;
        if (api_.GetTemperature &&
            api_.GetTemperature(dev, NVML_TEMPERATURE_GPU, &celsius) == NVML_SUCCESS) {
          s.temperature_celsius = celsius;
        }
      }
      samples.push_back(s);
    }
    return samples;
  }

 private:
  Status Error(const std::string& call, nvmlReturn_t rc) const {
    return Unavailable("NVML " + call + " failed: " + api_.ErrorString(rc) + " (NVML error " +
                       std::to_string(rc) + ")");
  }

  void MarkLost(GpuDevice& gpu, const char* call, nvmlReturn_t rc) const {
    if (!gpu.healthy) return;
    gpu.healthy = false;
    gpu.unhealthy_reason = std::string(call) + ": " + api_.ErrorString(rc) + " (NVML error " +
                           std::to_string(rc) + "); " + kLostFix;
  }

  void MarkUnhealthy(GpuDevice& gpu, std::string reason) const {
    if (!gpu.healthy) return;
    gpu.healthy = false;
    gpu.unhealthy_reason = std::move(reason);
  }

  StatusOr<GpuDevice> DiscoverOne(unsigned int i) {
    GpuDevice gpu;
    gpu.index = static_cast<int>(i);
    gpu.vendor = "nvidia";
    const std::string at = "(index " + std::to_string(i) + ")";
    nvmlDevice_t dev = nullptr;
    if (nvmlReturn_t rc = api_.GetHandleByIndex(i, &dev); rc != NVML_SUCCESS) {
      // A lost GPU may not even yield a handle; report it, the assignment decides.
      if (rc == NVML_ERROR_GPU_IS_LOST) {
        MarkLost(gpu, "nvmlDeviceGetHandleByIndex_v2", rc);
        return gpu;
      }
      return Error("nvmlDeviceGetHandleByIndex_v2" + at, rc);
    }
    char buf[kNvmlStringBuffer] = {};
    if (nvmlReturn_t rc = api_.GetUUID(dev, buf, sizeof buf); rc == NVML_SUCCESS) {
      gpu.uuid = CString(buf, sizeof buf);
    } else if (rc == NVML_ERROR_GPU_IS_LOST) {
      MarkLost(gpu, "nvmlDeviceGetUUID", rc);
    } else {
      return Error("nvmlDeviceGetUUID" + at, rc);
    }
    nvmlPciInfo_t pci{};
    if (nvmlReturn_t rc = api_.GetPciInfo(dev, &pci); rc == NVML_SUCCESS) {
      gpu.pci_bus_id = NormalisePciBusId(CString(pci.busId, sizeof pci.busId));
      gpu.numa_node = internal::PciNumaNode(sysfs_root_, gpu.pci_bus_id);
    } else if (rc == NVML_ERROR_GPU_IS_LOST) {
      MarkLost(gpu, "nvmlDeviceGetPciInfo", rc);
    } else {
      return Error("nvmlDeviceGetPciInfo" + at, rc);
    }
    char name[kNvmlStringBuffer] = {};
    if (nvmlReturn_t rc = api_.GetName(dev, name, sizeof name); rc == NVML_SUCCESS) {
      gpu.name = CString(name, sizeof name);
    } else if (rc == NVML_ERROR_GPU_IS_LOST) {
      MarkLost(gpu, "nvmlDeviceGetName", rc);
    }
    nvmlMemory_t mem{};
    if (nvmlReturn_t rc = api_.GetMemoryInfo(dev, &mem); rc == NVML_SUCCESS) {
      gpu.memory_total_bytes = mem.total;
    } else if (rc == NVML_ERROR_GPU_IS_LOST) {
      MarkLost(gpu, "nvmlDeviceGetMemoryInfo", rc);
    }
    // Pending page retirement / row remapping: an uncorrectable ECC error happened and the
    // memory stays suspect until the GPU is reset, so DDP on it would fail again.
    if (api_.GetRetiredPagesPendingStatus) {
      nvmlEnableState_t pending = NVML_FEATURE_DISABLED;
      nvmlReturn_t rc = api_.GetRetiredPagesPendingStatus(dev, &pending);
      if (rc == NVML_ERROR_GPU_IS_LOST) {
        MarkLost(gpu, "nvmlDeviceGetRetiredPagesPendingStatus", rc);
      } else if (rc == NVML_SUCCESS && pending == NVML_FEATURE_ENABLED) {
        MarkUnhealthy(gpu,
                      "page retirement pending after an uncorrectable ECC error: reset the GPU "
                      "(nvidia-smi -r) or drain the node");
      }
    }
    if (api_.GetRemappedRows) {
      unsigned int corr = 0, unc = 0, pending = 0, failed = 0;
      nvmlReturn_t rc = api_.GetRemappedRows(dev, &corr, &unc, &pending, &failed);
      if (rc == NVML_ERROR_GPU_IS_LOST) {
        MarkLost(gpu, "nvmlDeviceGetRemappedRows", rc);
      } else if (rc == NVML_SUCCESS && failed) {
        MarkUnhealthy(gpu, "memory row remapping failed: the GPU needs to be replaced");
      } else if (rc == NVML_SUCCESS && pending) {
        MarkUnhealthy(gpu,
                      "memory row remapping pending after an uncorrectable error: reset the GPU "
                      "(nvidia-smi -r) or drain the node");
      }
    }
    return gpu;
  }

  std::mutex mu_;
  void* const lib_;
  const NvmlApi api_;
  const std::string sysfs_root_;
};

}  // namespace

StatusOr<std::unique_ptr<GpuBackend>> OpenNvmlBackend(const std::string& library_path,
                                                      const std::string& sysfs_root) {
  const std::string path = library_path.empty() ? "libnvidia-ml.so.1" : library_path;
  const std::string fix =
      "install the NVIDIA driver and run the pod with the NVIDIA container runtime, pick "
      "another --gpu-backend (amd, none), or set gpusPerNode: 0";
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    return FailedPrecondition("cannot load NVML library '" + path +
                              "': " + (err ? err : "unknown dlopen error") + "; " + fix);
  }
  NvmlApi api;
  std::string missing;
  auto need = [&](const char* symbol, auto& fn) {
    if (!Bind(lib, symbol, fn) && missing.empty()) missing = symbol;
  };
  need("nvmlInit_v2", api.Init);
  need("nvmlShutdown", api.Shutdown);
  need("nvmlErrorString", api.ErrorString);
  need("nvmlDeviceGetCount_v2", api.GetCount);
  need("nvmlDeviceGetHandleByIndex_v2", api.GetHandleByIndex);
  need("nvmlDeviceGetUUID", api.GetUUID);
  need("nvmlDeviceGetName", api.GetName);
  need("nvmlDeviceGetMemoryInfo", api.GetMemoryInfo);
  // _v3 and _v2 share nvmlPciInfo_t; _v3 only stops filling the legacy field.
  if (!Bind(lib, "nvmlDeviceGetPciInfo_v3", api.GetPciInfo)) {
    need("nvmlDeviceGetPciInfo_v2", api.GetPciInfo);
  }
  Bind(lib, "nvmlDeviceGetUtilizationRates", api.GetUtilizationRates);
  Bind(lib, "nvmlDeviceGetPowerUsage", api.GetPowerUsage);
  Bind(lib, "nvmlDeviceGetTemperature", api.GetTemperature);
  Bind(lib, "nvmlDeviceGetRetiredPagesPendingStatus", api.GetRetiredPagesPendingStatus);
  Bind(lib, "nvmlDeviceGetRemappedRows", api.GetRemappedRows);
  if (!missing.empty()) {
    dlclose(lib);
    return FailedPrecondition("NVML library '" + path + "' has no symbol " + missing +
                              ": the driver is too old; upgrade the NVIDIA driver");
  }
  if (nvmlReturn_t rc = api.Init(); rc != NVML_SUCCESS) {
    std::string msg = std::string("nvmlInit_v2 failed: ") + api.ErrorString(rc) + " (NVML error " +
                      std::to_string(rc) + ") using '" + path + "'; " + fix;
    dlclose(lib);
    return FailedPrecondition(msg);
  }
  return std::unique_ptr<GpuBackend>(std::make_unique<NvmlBackend>(
      lib, api, sysfs_root.empty() ? std::string("/sys") : sysfs_root));
}

}  // namespace spawnpoint::devices
