// CPU topology as the agent may use it: the NUMA nodes of the machine restricted to the
// CPUs this process is allowed to run on (its affinity mask, which is the pod's cpuset).
// Pure functions over the file system; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace spawnpoint::devices {

struct NumaNode {
  int id = 0;
  std::vector<int> cpus;  // allowed CPUs on this node, ascending; never empty
};

struct CpuTopology {
  std::vector<NumaNode> nodes;  // ascending id; only nodes with at least one allowed CPU

  // All allowed CPUs, node by node (NUMA-packed order).
  std::vector<int> AllCpus() const;
  // The node holding cpu, or -1.
  int NodeOf(int cpu) const;
  // The node with this id, or nullptr.
  const NumaNode* Node(int id) const;
};

// Parses the kernel's cpulist format ("0-3,8-11", "5", "" = none) into ascending, unique
// CPU numbers.
StatusOr<std::vector<int>> ParseCpuList(std::string_view text);

// Reads <sysfs_root>/devices/system/node/node*/cpulist and keeps allowed_cpus only. With no
// NUMA information there is one node 0 holding all allowed CPUs; an allowed CPU no node lists
// (hot-plugged, odd kernels) joins the first node. Fails if allowed_cpus is empty or a
// cpulist is unreadable or malformed.
StatusOr<CpuTopology> ReadCpuTopology(const std::string& sysfs_root,
                                      const std::vector<int>& allowed_cpus);

// This process's CPU affinity (sched_getaffinity), ascending.
std::vector<int> AllowedCpus();

}  // namespace spawnpoint::devices
