// Test helper: a throw-away directory laid out like /sys (and the /dev next to it) with only
// what spawnpoint's device code reads: NUMA node cpulists, PCI device numa_node files, AMD
// drm cards with their render nodes, KFD topology and hwmon. Production code is pointed at
// sysfs_root() and runs unchanged. Removed on destruction. Not thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace spawnpoint::testing {

class FakeSysfs {
 public:
  FakeSysfs();  // creates a fresh directory under $TMPDIR (or /tmp); aborts on failure
  ~FakeSysfs();
  FakeSysfs(const FakeSysfs&) = delete;
  FakeSysfs& operator=(const FakeSysfs&) = delete;

  const std::string& root() const { return root_; }  // holds sys/ and dev/
  std::string sysfs_root() const { return root_ + "/sys"; }
  std::string dev_root() const { return root_ + "/dev"; }

  // sys/devices/system/node/node<id>/cpulist.
  void AddNumaNode(int id, const std::string& cpulist);
  // sys/devices/pci0000:00/<bus_id>/numa_node, reachable as sys/bus/pci/devices/<bus_id>.
  void AddPciDevice(const std::string& bus_id, int numa_node);

  struct AmdCard {
    int card = 0;                 // class/drm/card<card>
    std::string pci_bus_id = "";  // "0000:03:00.0"
    int numa_node = -1;
    std::string vendor = "0x1002";
    std::string pci_class = "0x030000";
    std::string device_id = "0x740f";
    std::string unique_id = "";     // empty: no unique_id file
    std::string product_name = "";  // empty: no product_name file
    uint64_t vram_total = 0, vram_used = 0;
    int busy_percent = -1;           // < 0: no file
    int64_t temp_millicelsius = -1;  // < 0: no hwmon temperature
    int64_t power_microwatts = -1;   // < 0: no hwmon power
    int render_minor = -1;           // -1: 128 + card
    int kfd_node = -1;               // >= 0: a KFD topology node with this id
    bool accessible = true;          // its dev/dri/renderD<minor> exists
    bool uevent_only = false;        // device is a plain directory (bus id only in uevent)
  };
  // class/drm/card<N> (+ a card<N>-DP-1 connector and renderD<minor>), the PCI device with
  // its amdgpu files, and dev/dri/renderD<minor> if accessible.
  void AddAmdCard(const AmdCard& card);

  // The machine that nvml/eight_gpus_two_numa.conf describes: node 0 = CPUs 0-15 with GPUs on
  // buses 07, 0f, 47, 4e; node 1 = CPUs 16-31 with buses 87, 90, b7, bd.
  void AddEightGpuTwoNumaTopology();

  // Writes root()/relative (parents created) and returns its absolute path.
  std::string WriteFile(const std::string& relative, const std::string& content);

 private:
  std::string root_;
};

// Absolute path of a config shipped in tests/fakes/nvml/, e.g. "eight_gpus_two_numa.conf".
std::string FakeNvmlConfig(const std::string& name);

}  // namespace spawnpoint::testing
