// NVML through dlopen/dlsym, with nvml.h's types and entry points as agent/devices/nvml_abi.h
// declares them (checked against NVIDIA's header by the test nvml_header_abi), so neither the
// CUDA toolkit nor the driver is needed to build, and a machine without the driver gets an
// error instead of a loader failure at start-up.
//
// What an NVML error means here: a query of a device's identity (handle, UUID, PCI) that
// fails makes Discover() fail, except GPU_IS_LOST and, for the handle, NO_PERMISSION, which
// report that device unhealthy with the reason; any other query that fails (NOT_SUPPORTED,
// NO_PERMISSION, UNINITIALIZED, GPU_IS_LOST, ...) leaves its value absent (nullopt, or 0 for
// GpuDevice::memory_total_bytes), and GPU_IS_LOST also marks the device unhealthy in
// Discover(). A value is taken only from a call that returned NVML_SUCCESS.
#include "agent/devices/nvml_abi.h"

#include <dlfcn.h>

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "agent/devices/gpu_backend.h"
#include "agent/devices/sysfs_util.h"

namespace spawnpoint::devices {
namespace {

// nvml.h's names, unqualified as in C.
using namespace nvml_abi;  // NOLINT(google-build-using-namespace)

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
constexpr const char* kNoPermissionFix =
    "this process may not open the GPU (its /dev/nvidia* node or the device cgroup): give the "
    "pod the GPU through the NVIDIA container runtime, or run where the GPU is accessible";

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
      nvmlDevice_t dev{};
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
  // "GPU is lost (NVML error 15)".
  std::string Describe(nvmlReturn_t rc) const {
    const char* text = api_.ErrorString(rc);
    return std::string(text != nullptr ? text : "unknown error") + " (NVML error " +
           std::to_string(rc) + ")";
  }

  Status Error(const std::string& call, nvmlReturn_t rc) const {
    return Unavailable("NVML " + call + " failed: " + Describe(rc));
  }

  void MarkFailed(GpuDevice& gpu, const char* call, nvmlReturn_t rc, const char* fix) const {
    MarkUnhealthy(gpu, std::string(call) + ": " + Describe(rc) + "; " + fix);
  }

  void MarkLost(GpuDevice& gpu, const char* call, nvmlReturn_t rc) const {
    MarkFailed(gpu, call, rc, kLostFix);
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
    nvmlDevice_t dev{};
    if (nvmlReturn_t rc = api_.GetHandleByIndex(i, &dev); rc != NVML_SUCCESS) {
      // A lost GPU may not even yield a handle, nor one this process may not open; report
      // it, the assignment decides (it uses the others when there are enough).
      if (rc == NVML_ERROR_GPU_IS_LOST) {
        MarkLost(gpu, "nvmlDeviceGetHandleByIndex_v2", rc);
        return gpu;
      }
      if (rc == NVML_ERROR_NO_PERMISSION) {
        MarkFailed(gpu, "nvmlDeviceGetHandleByIndex_v2", rc, kNoPermissionFix);
        return gpu;
      }
      return Error("nvmlDeviceGetHandleByIndex_v2" + at, rc);
    }
    char buf[SPAWNPOINT_NVML_UUID_BUFFER_SIZE] = {};
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
    char name[SPAWNPOINT_NVML_NAME_BUFFER_SIZE] = {};
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
#define SPAWNPOINT_NVML_BIND(symbol, member, ret, params, required) \
  if (!Bind(lib, #symbol, api.member) && (required) && missing.empty()) missing = #symbol;
  SPAWNPOINT_NVML_ENTRY_POINTS(SPAWNPOINT_NVML_BIND)
#undef SPAWNPOINT_NVML_BIND
  // _v3 and _v2 share nvmlPciInfo_t; _v3 only stops filling the legacy field.
  if (api.GetPciInfo == nullptr) api.GetPciInfo = api.GetPciInfoV2;
  if (api.GetPciInfo == nullptr && missing.empty()) missing = "nvmlDeviceGetPciInfo_v3";
  if (!missing.empty()) {
    dlclose(lib);
    return FailedPrecondition("NVML library '" + path + "' has no symbol " + missing +
                              ": the driver is too old; upgrade the NVIDIA driver");
  }
  if (nvmlReturn_t rc = api.Init(); rc != NVML_SUCCESS) {
    const char* text = api.ErrorString(rc);
    std::string msg = std::string("nvmlInit_v2 failed: ") + (text ? text : "unknown error") +
                      " (NVML error " + std::to_string(rc) + ") using '" + path + "'; " + fix;
    dlclose(lib);
    return FailedPrecondition(msg);
  }
  return std::unique_ptr<GpuBackend>(std::make_unique<NvmlBackend>(
      lib, api, sysfs_root.empty() ? std::string("/sys") : sysfs_root));
}

}  // namespace spawnpoint::devices
