// Which GPUs and CPUs each local rank gets, and the environment that tells the rank. Pure
// functions of their arguments; thread-safe.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "agent/devices/gpu_backend.h"
#include "agent/devices/topology.h"
#include "api/training_job.h"
#include "common/status.h"

namespace spawnpoint::devices {

struct RankDevices {
  int local_rank = 0;
  std::vector<GpuDevice> visible;  // devices this rank sees, in order; empty for CPU ranks
  int device_ordinal = -1;         // index into visible the rank uses; -1 for CPU ranks
  std::vector<int> cpus;           // its CPU affinity, ascending; never empty
  int numa_node = -1;              // its GPU's node, or where most of its CPUs are; -1 unknown
};

// GPU ranks (gpus_per_node > 0; ranks must equal gpus_per_node): GPUs are taken in topology
// order (NUMA node, then PCI bus id). If the pod has exactly `ranks` GPUs all must be
// healthy (it was given exactly these); with more (a whole machine in local mode) unhealthy
// ones are passed over. Shared: every rank sees the chosen GPUs and rank i uses ordinal i.
// Exclusive: rank i sees only its GPU, as ordinal 0. Each rank's CPUs come from its GPU's
// NUMA node, split evenly (contiguously) between the ranks on that node; CPUs of nodes
// with no GPU are shared out to all ranks too rather than left idle. If some GPU's node is
// unknown or has no allowed CPU, all ranks are placed as CPU ranks are.
// CPU ranks (gpus_per_node == 0): the allowed CPUs in NUMA-packed order are cut into
// `ranks` contiguous chunks. With more ranks than CPUs, ranks share CPUs round-robin.
// backend (Describe() of the GPU backend) only improves the no-GPU error message.
// Errors are one line and say how to fix the problem.
StatusOr<std::vector<RankDevices>> AssignRanks(const std::vector<GpuDevice>& gpus,
                                               const CpuTopology& cpus, int ranks,
                                               int gpus_per_node, api::GpuAssignment mode,
                                               const std::string& backend = "");

// The device variables for a rank; empty for CPU ranks (nothing is set, not even an empty
// CUDA_VISIBLE_DEVICES). NVIDIA: CUDA_VISIBLE_DEVICES = the visible UUIDs and
// CUDA_DEVICE_ORDER=PCI_BUS_ID. AMD: ROCR_VISIBLE_DEVICES = the visible devices' indices and
// HIP_VISIBLE_DEVICES = 0..n-1, because ROCr filters first and HIP indexes into what ROCr
// left (the same indices in both would select the wrong or no devices). Both:
// SPAWNPOINT_DEVICE_ORDINAL = device_ordinal.
std::map<std::string, std::string> DeviceEnvironment(const RankDevices& rank);

}  // namespace spawnpoint::devices
