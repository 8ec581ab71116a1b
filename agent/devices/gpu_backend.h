// GPU discovery behind one interface: NVML loaded at run time with dlopen (never linked, so
// the agent runs on machines without the NVIDIA driver), AMD through sysfs, or none. No
// backend ever creates a CUDA or HIP context: the agent must not touch the GPU before it
// spawns the ranks. Every backend is thread-safe; Discover() and Sample() may be called
// concurrently from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace spawnpoint::devices {

struct GpuDevice {
  // NVML: the NVML device index. AMD: the ROCr/HIP ordinal among the GPUs this process can
  // open (what ROCR_VISIBLE_DEVICES takes).
  int index = -1;
  std::string uuid;
  std::string pci_bus_id;  // normalised lowercase domain:bus:dev.fn, e.g. "0000:3b:00.0"
  std::string name;
  std::string vendor;  // "nvidia" | "amd"
  int numa_node = -1;  // -1: unknown
  bool healthy = true;
  std::string unhealthy_reason;
  uint64_t memory_total_bytes = 0;
};

// One reading per device; a value the device cannot report right now is nullopt.
struct GpuSample {
  int index = -1;
  std::optional<double> utilisation;  // 0..1
  std::optional<uint64_t> memory_used_bytes, memory_total_bytes;
  std::optional<double> power_watts, temperature_celsius;
};

class GpuBackend {
 public:
  virtual ~GpuBackend();
  // "nvml", "amd" or "none".
  virtual std::string Name() const = 0;
  // Name() plus why the backend was chosen when auto-detection fell through, for error
  // messages ("none (auto: nvml: cannot load ...; amd: no AMD GPU ...)").
  virtual std::string Describe() const { return Name(); }
  // Devices in topology order (NUMA node, then PCI bus id). A device that is present but
  // broken is returned with healthy = false and a reason, not as an error.
  virtual StatusOr<std::vector<GpuDevice>> Discover() = 0;
  virtual StatusOr<std::vector<GpuSample>> Sample() = 0;
};

// Loads NVML from library_path ("" = "libnvidia-ml.so.1", found by the dynamic loader) and
// initialises it; shut down and unloaded when the backend is destroyed. sysfs_root ("" =
// "/sys") is where the GPUs' NUMA nodes are read. Fails with the loader's or NVML's message.
StatusOr<std::unique_ptr<GpuBackend>> OpenNvmlBackend(const std::string& library_path,
                                                      const std::string& sysfs_root);

// Reads <sysfs_root>/class/drm/card*. Only cards whose render node exists in the /dev next
// to sysfs_root ("/sys" -> "/dev", "/tmp/x/sys" -> "/tmp/x/dev") count: sysfs is not
// namespaced, so a container sees every card of the host but can open only its own.
std::unique_ptr<GpuBackend> OpenAmdSysfsBackend(const std::string& sysfs_root);

std::unique_ptr<GpuBackend> NoGpuBackend();

// kind: "nvml" | "amd" | "none" | "auto". Auto takes NVML if it loads, initialises and has at
// least one device, else AMD sysfs with at least one GPU, else none (whose Describe() says
// what was tried). gpu_resource "amd.com/gpu" makes auto try AMD first.
StatusOr<std::unique_ptr<GpuBackend>> SelectGpuBackend(const std::string& kind,
                                                       const std::string& nvml_library,
                                                       const std::string& sysfs_root,
                                                       const std::string& gpu_resource);

// Sorts into topology order: NUMA node (unknown first), then PCI bus id, then index.
void SortByTopology(std::vector<GpuDevice>& gpus);

// "0000:3B:00.0", "00000000:3b:00.0" -> "0000:3b:00.0"; unparseable input is lowercased.
std::string NormalisePciBusId(const std::string& bus_id);

}  // namespace spawnpoint::devices
