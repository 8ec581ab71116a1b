#include "agent/devices/assignment.h"

#include <algorithm>
#include <map>

namespace spawnpoint::devices {
namespace {

// k chunks of pool: contiguous and as even as possible (the first size % k get one more);
// with fewer CPUs than chunks, chunk j gets pool[j % size] so none is empty.
std::vector<std::vector<int>> Split(const std::vector<int>& pool, int k) {
  std::vector<std::vector<int>> chunks(k);
  if (pool.empty() || k <= 0) return chunks;
  const int n = static_cast<int>(pool.size());
  if (n < k) {
    for (int j = 0; j < k; ++j) chunks[j] = {pool[j % n]};
    return chunks;
  }
  int at = 0;
  for (int j = 0; j < k; ++j) {
    const int size = n / k + (j < n % k ? 1 : 0);
    chunks[j].assign(pool.begin() + at, pool.begin() + at + size);
    at += size;
  }
  return chunks;
}

int MajorityNode(const CpuTopology& topo, const std::vector<int>& cpus) {
  std::map<int, int> count;
  for (int c : cpus) ++count[topo.NodeOf(c)];
  int best = -1, best_count = 0;
  for (auto [node, n] : count) {
    if (node >= 0 && n > best_count) best = node, best_count = n;
  }
  return best;
}

std::string Describe(const GpuDevice& g) {
  std::string s = "GPU " + std::to_string(g.index) + " (";
  s += "uuid " + (g.uuid.empty() ? std::string("unknown") : g.uuid);
  s += ", PCI " + (g.pci_bus_id.empty() ? std::string("unknown") : g.pci_bus_id) + ")";
  return s;
}

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ",") + s;
  return out;
}

}  // namespace

StatusOr<std::vector<RankDevices>> AssignRanks(const std::vector<GpuDevice>& gpus,
                                               const CpuTopology& cpus, int ranks,
                                               int gpus_per_node, api::GpuAssignment mode,
                                               const std::string& backend) {
  if (ranks < 1) {
    return InvalidArgument("need at least one local rank, got " + std::to_string(ranks) +
                           ": set gpusPerNode or procsPerNode >= 1");
  }
  if (gpus_per_node < 0) {
    return InvalidArgument("gpusPerNode must be >= 0, got " + std::to_string(gpus_per_node));
  }
  const std::vector<int> all_cpus = cpus.AllCpus();
  if (all_cpus.empty()) {
    return FailedPrecondition("no CPU is available to place the ranks on: give the pod CPUs");
  }
  std::vector<RankDevices> out(ranks);
  for (int r = 0; r < ranks; ++r) out[r].local_rank = r;

  auto place_like_cpu_ranks = [&] {
    auto chunks = Split(all_cpus, ranks);
    for (int r = 0; r < ranks; ++r) {
      out[r].cpus = std::move(chunks[r]);
      std::sort(out[r].cpus.begin(), out[r].cpus.end());
      if (out[r].visible.empty()) out[r].numa_node = MajorityNode(cpus, out[r].cpus);
    }
  };

  if (gpus_per_node == 0) {
    place_like_cpu_ranks();
    return out;
  }

  if (ranks != gpus_per_node) {
    return InvalidArgument("local ranks (" + std::to_string(ranks) + ") must equal gpusPerNode (" +
                           std::to_string(gpus_per_node) +
                           ") when GPUs are used: DDP runs one rank per GPU");
  }
  const std::string tried = backend.empty() ? "" : " (GPU backend: " + backend + ")";
  if (gpus.empty()) {
    return FailedPrecondition(
        "gpusPerNode is " + std::to_string(gpus_per_node) + " but no GPU was found" + tried +
        ": give the pod GPUs (resources.limits nvidia.com/gpu or amd.com/gpu), choose the GPU "
        "backend with --gpu-backend=nvml|amd, or set gpusPerNode: 0 to run CPU ranks");
  }
  if (static_cast<int>(gpus.size()) < ranks) {
    return FailedPrecondition("gpusPerNode is " + std::to_string(gpus_per_node) + " but only " +
                              std::to_string(gpus.size()) + " GPU" +
                              (gpus.size() == 1 ? " was" : "s were") + " found" + tried +
                              ": lower gpusPerNode to " + std::to_string(gpus.size()) +
                              " or give each pod " + std::to_string(gpus_per_node) + " GPUs");
  }
  std::vector<GpuDevice> sorted = gpus;
  SortByTopology(sorted);
  std::vector<GpuDevice> chosen;
  std::vector<const GpuDevice*> broken;
  for (const GpuDevice& g : sorted) {
    if (!g.healthy) {
      broken.push_back(&g);
    } else if (static_cast<int>(chosen.size()) < ranks) {
      chosen.push_back(g);
    }
  }
  // A pod holds exactly the GPUs it was given, so a broken one among them is fatal there.
  if (!broken.empty() &&
      (static_cast<int>(chosen.size()) < ranks || static_cast<int>(sorted.size()) == ranks)) {
    const GpuDevice& g = *broken.front();
    std::string more =
        broken.size() > 1 ? " (and " + std::to_string(broken.size() - 1) + " more unhealthy)" : "";
    return FailedPrecondition(
        std::to_string(ranks) + " ranks need " + std::to_string(ranks) + " healthy GPUs but only " +
        std::to_string(sorted.size() - broken.size()) + " of " + std::to_string(sorted.size()) +
        " are healthy: " + Describe(g) + " is unhealthy" + more + ": " +
        (g.unhealthy_reason.empty() ? "drain the node and check the GPU" : g.unhealthy_reason));
  }

  for (int r = 0; r < ranks; ++r) {
    if (mode == api::GpuAssignment::kExclusive) {
      out[r].visible = {chosen[r]};
      out[r].device_ordinal = 0;
    } else {
      out[r].visible = chosen;
      out[r].device_ordinal = r;
    }
    out[r].numa_node = chosen[r].numa_node;
  }

  std::map<int, std::vector<int>> ranks_on_node;  // node -> local ranks, ascending
  for (int r = 0; r < ranks; ++r) {
    const int node = chosen[r].numa_node;
    if (node < 0 || cpus.Node(node) == nullptr) {
      place_like_cpu_ranks();
      return out;
    }
    ranks_on_node[node].push_back(r);
  }
  std::vector<int> leftover;
  for (const NumaNode& node : cpus.nodes) {
    auto it = ranks_on_node.find(node.id);
    if (it == ranks_on_node.end()) {
      leftover.insert(leftover.end(), node.cpus.begin(), node.cpus.end());
      continue;
    }
    auto chunks = Split(node.cpus, static_cast<int>(it->second.size()));
    for (size_t j = 0; j < it->second.size(); ++j) out[it->second[j]].cpus = std::move(chunks[j]);
  }
  if (!leftover.empty()) {
    auto extra = Split(leftover, std::min<int>(ranks, static_cast<int>(leftover.size())));
    for (size_t r = 0; r < extra.size(); ++r) {
      out[r].cpus.insert(out[r].cpus.end(), extra[r].begin(), extra[r].end());
    }
  }
  for (RankDevices& rd : out) std::sort(rd.cpus.begin(), rd.cpus.end());
  return out;
}

std::map<std::string, std::string> DeviceEnvironment(const RankDevices& rank) {
  std::map<std::string, std::string> env;
  if (rank.visible.empty()) return env;
  std::vector<std::string> ids;
  if (rank.visible.front().vendor == "amd") {
    std::vector<std::string> hip;
    for (size_t i = 0; i < rank.visible.size(); ++i) {
      ids.push_back(std::to_string(rank.visible[i].index));
      hip.push_back(std::to_string(i));
    }
    env["ROCR_VISIBLE_DEVICES"] = Join(ids);
    env["HIP_VISIBLE_DEVICES"] = Join(hip);
  } else {
    for (const GpuDevice& g : rank.visible) ids.push_back(g.uuid);
    env["CUDA_VISIBLE_DEVICES"] = Join(ids);
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID";
  }
  env["SPAWNPOINT_DEVICE_ORDINAL"] = std::to_string(rank.device_ordinal);
  return env;
}

}  // namespace spawnpoint::devices
