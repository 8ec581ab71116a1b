#include "agent/devices/topology.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <set>

#include "agent/devices/sysfs_util.h"

namespace spawnpoint::devices {

std::vector<int> CpuTopology::AllCpus() const {
  std::vector<int> out;
  for (const NumaNode& n : nodes) out.insert(out.end(), n.cpus.begin(), n.cpus.end());
  return out;
}

int CpuTopology::NodeOf(int cpu) const {
  for (const NumaNode& n : nodes) {
    if (std::binary_search(n.cpus.begin(), n.cpus.end(), cpu)) return n.id;
  }
  return -1;
}

const NumaNode* CpuTopology::Node(int id) const {
  for (const NumaNode& n : nodes) {
    if (n.id == id) return &n;
  }
  return nullptr;
}

namespace {

std::string_view Trim(std::string_view s) {
  const char* ws = " \t\r\n";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

bool ParseNumber(std::string_view s, int& out) {
  s = Trim(s);
  if (s.empty()) return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && ptr == s.data() + s.size() && out >= 0;
}

}  // namespace

StatusOr<std::vector<int>> ParseCpuList(std::string_view text) {
  std::set<int> cpus;
  std::string_view rest = Trim(text);
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    auto bad = [&] {
      return InvalidArgument("bad cpulist '" + std::string(Trim(text)) + "' at '" +
                             std::string(Trim(item)) + "': expected ranges like 0-3,8-11");
    };
    size_t dash = item.find('-');
    int lo = 0, hi = 0;
    if (dash == std::string_view::npos) {
      if (!ParseNumber(item, lo)) return bad();
      hi = lo;
    } else if (!ParseNumber(item.substr(0, dash), lo) || !ParseNumber(item.substr(dash + 1), hi) ||
               hi < lo) {
      return bad();
    }
    if (hi - lo > 1 << 20) return bad();
    for (int c = lo; c <= hi; ++c) cpus.insert(c);
  }
  return std::vector<int>(cpus.begin(), cpus.end());
}

StatusOr<CpuTopology> ReadCpuTopology(const std::string& sysfs_root,
                                      const std::vector<int>& allowed_cpus) {
  if (allowed_cpus.empty()) {
    return FailedPrecondition("no CPU is allowed for this process (empty affinity mask)");
  }
  const std::set<int> allowed(allowed_cpus.begin(), allowed_cpus.end());
  const std::string root = sysfs_root.empty() ? "/sys" : sysfs_root;
  const std::string dir = root + "/devices/system/node";
  CpuTopology topo;
  std::set<int> placed;
  for (const std::string& entry : internal::ListDir(dir)) {
    int id = 0;
    if (entry.rfind("node", 0) != 0 || !ParseNumber(std::string_view(entry).substr(4), id)) {
      continue;
    }
    const std::string path = dir + "/" + entry + "/cpulist";
    auto text = internal::ReadTrimmed(path);
    if (!text) return FailedPrecondition("cannot read " + path);
    auto cpus = ParseCpuList(*text);
    if (!cpus.ok()) return cpus.status().WithPrefix(path);
    NumaNode node{id, {}};
    for (int c : *cpus) {
      if (allowed.count(c) && placed.insert(c).second) node.cpus.push_back(c);
    }
    if (!node.cpus.empty()) topo.nodes.push_back(std::move(node));
  }
  std::sort(topo.nodes.begin(), topo.nodes.end(),
            [](const NumaNode& a, const NumaNode& b) { return a.id < b.id; });
  std::vector<int> unplaced;
  for (int c : allowed) {
    if (!placed.count(c)) unplaced.push_back(c);
  }
  if (!unplaced.empty()) {
    if (topo.nodes.empty()) topo.nodes.push_back(NumaNode{0, {}});
    std::vector<int>& first = topo.nodes.front().cpus;
    first.insert(first.end(), unplaced.begin(), unplaced.end());
    std::sort(first.begin(), first.end());
  }
  return topo;
}

std::vector<int> AllowedCpus() {
  // cpu_set_t holds 1024 CPUs; bigger machines need a larger dynamically sized mask.
  for (int n = 1024; n <= (1 << 22); n *= 2) {
    cpu_set_t* set = CPU_ALLOC(n);
    if (set == nullptr) break;
    const size_t size = CPU_ALLOC_SIZE(n);
    CPU_ZERO_S(size, set);
    if (sched_getaffinity(0, size, set) == 0) {
      std::vector<int> out;
      for (int c = 0; c < n; ++c) {
        if (CPU_ISSET_S(c, size, set)) out.push_back(c);
      }
      CPU_FREE(set);
      return out;
    }
    const int err = errno;
    CPU_FREE(set);
    if (err != EINVAL) break;
  }
  return {};
}

}  // namespace spawnpoint::devices
