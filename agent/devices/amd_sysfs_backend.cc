// AMD GPUs from sysfs (amdgpu driver). Reads only files under class/drm, class/kfd and the
// PCI device directories, so nothing touches /dev/kfd or creates a HIP context.
#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "agent/devices/gpu_backend.h"
#include "agent/devices/sysfs_util.h"

namespace spawnpoint::devices {
namespace {

using internal::Exists;
using internal::ListDir;
using internal::ReadInt;
using internal::ReadTrimmed;

struct Card {
  int card = -1;
  std::string dir;  // <root>/class/drm/cardN/device
  int render_minor = -1;
  int kfd_node = -1;
};

std::string DevRootFor(const std::string& sysfs_root) {
  std::filesystem::path p = std::filesystem::path(sysfs_root).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  return (p.parent_path() / "dev").string();
}

// ROCr numbers GPUs in KFD topology order, so that order (not card numbers) gives the
// indices ROCR_VISIBLE_DEVICES expects; the KFD node of a GPU is found by its render minor.
std::map<int, int> KfdNodesByRenderMinor(const std::string& root) {
  std::map<int, int> out;
  const std::string nodes = root + "/class/kfd/kfd/topology/nodes";
  for (const std::string& n : ListDir(nodes)) {
    auto props = ReadTrimmed(nodes + "/" + n + "/properties");
    if (!props || n.empty() ||
        !std::all_of(n.begin(), n.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      continue;
    std::istringstream in(*props);
    std::string key;
    long long value = 0;
    while (in >> key >> value) {
      if (key == "drm_render_minor" && value > 0) out[static_cast<int>(value)] = std::stoi(n);
    }
  }
  return out;
}

std::string PciBusIdOf(const std::string& device_dir) {
  std::error_code ec;
  auto target = std::filesystem::read_symlink(device_dir, ec);
  if (!ec && !target.filename().empty()) return NormalisePciBusId(target.filename().string());
  if (auto uevent = ReadTrimmed(device_dir + "/uevent")) {
    std::istringstream in(*uevent);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("PCI_SLOT_NAME=", 0) == 0) return NormalisePciBusId(line.substr(14));
    }
  }
  return "";
}

class AmdSysfsBackend : public GpuBackend {
 public:
  explicit AmdSysfsBackend(std::string root)
      : root_(std::move(root)), dev_root_(DevRootFor(root_)) {}

  std::string Name() const override { return "amd"; }

  StatusOr<std::vector<GpuDevice>> Discover() override {
    std::vector<GpuDevice> gpus;
    for (const Card& c : Cards()) {
      GpuDevice g;
      g.index = static_cast<int>(gpus.size());
      g.vendor = "amd";
      g.pci_bus_id = PciBusIdOf(c.dir);
      g.numa_node = -1;
      if (auto numa = ReadInt(c.dir + "/numa_node"); numa && *numa >= 0) {
        g.numa_node = static_cast<int>(*numa);
      }
      auto uid = ReadTrimmed(c.dir + "/unique_id");
      g.uuid = uid && !uid->empty() ? *uid : g.pci_bus_id;
      auto product = ReadTrimmed(c.dir + "/product_name");
      if (product && !product->empty()) {
        g.name = *product;
      } else {
        g.name = "AMD GPU " + ReadTrimmed(c.dir + "/device").value_or("unknown");
      }
      if (auto total = ReadInt(c.dir + "/mem_info_vram_total"); total && *total > 0) {
        g.memory_total_bytes = static_cast<uint64_t>(*total);
      }
      gpus.push_back(std::move(g));
    }
    SortByTopology(gpus);
    return gpus;
  }

  StatusOr<std::vector<GpuSample>> Sample() override {
    std::vector<GpuSample> samples;
    for (const Card& c : Cards()) {
      GpuSample s;
      s.index = static_cast<int>(samples.size());
      if (auto busy = ReadInt(c.dir + "/gpu_busy_percent"); busy && *busy >= 0) {
        s.utilisation = std::min<int64_t>(*busy, 100) / 100.0;
      }
      if (auto v = ReadInt(c.dir + "/mem_info_vram_total"); v && *v >= 0) {
        s.memory_total_bytes = static_cast<uint64_t>(*v);
      }
      if (auto v = ReadInt(c.dir + "/mem_info_vram_used"); v && *v >= 0) {
        s.memory_used_bytes = static_cast<uint64_t>(*v);
      }
      for (const std::string& h : ListDir(c.dir + "/hwmon")) {
        const std::string hw = c.dir + "/hwmon/" + h;
        if (!s.temperature_celsius) s.temperature_celsius = EdgeTemperature(hw);
        if (!s.power_watts) {
          // power1_average on most boards, power1_input on newer ones; both microwatts.
          auto uw = ReadInt(hw + "/power1_average");
          if (!uw) uw = ReadInt(hw + "/power1_input");
          if (uw && *uw >= 0) s.power_watts = *uw / 1e6;
        }
      }
      samples.push_back(s);
    }
    return samples;
  }

 private:
  static std::optional<double> EdgeTemperature(const std::string& hwmon) {
    for (int i = 1; i <= 8; ++i) {
      const std::string t = hwmon + "/temp" + std::to_string(i);
      if (ReadTrimmed(t + "_label").value_or("") == "edge") {
        if (auto v = ReadInt(t + "_input")) return *v / 1000.0;
      }
    }
    if (auto v = ReadInt(hwmon + "/temp1_input")) return *v / 1000.0;
    return std::nullopt;
  }

  // The AMD GPUs this process can open, in ROCr order (index = position).
  std::vector<Card> Cards() const {
    static const std::regex kCard("card([0-9]+)");
    const std::string drm = root_ + "/class/drm";
    std::vector<Card> cards;
    for (const std::string& entry : ListDir(drm)) {
      std::smatch m;
      if (!std::regex_match(entry, m, kCard)) continue;  // skips cardN-DP-1, renderD*
      Card c;
      c.card = std::stoi(m[1]);
      c.dir = drm + "/" + entry + "/device";
      if (ReadTrimmed(c.dir + "/vendor").value_or("") != "0x1002") continue;
      // Display controllers only (0x03xxxx): the same vendor id covers audio functions.
      if (auto cls = ReadTrimmed(c.dir + "/class"); cls && cls->rfind("0x03", 0) != 0) continue;
      for (const std::string& d : ListDir(c.dir + "/drm")) {
        if (d.rfind("renderD", 0) == 0) c.render_minor = std::atoi(d.c_str() + 7);
      }
      const std::string node = c.render_minor > 0
                                   ? dev_root_ + "/dri/renderD" + std::to_string(c.render_minor)
                                   : dev_root_ + "/dri/" + entry;
      if (!Exists(node)) continue;
      cards.push_back(std::move(c));
    }
    auto kfd = KfdNodesByRenderMinor(root_);
    bool all_in_kfd = !cards.empty();
    for (Card& c : cards) {
      auto it = kfd.find(c.render_minor);
      if (it == kfd.end()) {
        all_in_kfd = false;
      } else {
        c.kfd_node = it->second;
      }
    }
    std::stable_sort(cards.begin(), cards.end(), [&](const Card& a, const Card& b) {
      return all_in_kfd ? a.kfd_node < b.kfd_node : a.card < b.card;
    });
    return cards;
  }

  const std::string root_;
  const std::string dev_root_;
};

}  // namespace

std::unique_ptr<GpuBackend> OpenAmdSysfsBackend(const std::string& sysfs_root) {
  return std::make_unique<AmdSysfsBackend>(sysfs_root.empty() ? "/sys" : sysfs_root);
}

}  // namespace spawnpoint::devices
