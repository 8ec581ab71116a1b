// Malformed sysfs files as the agent's device code reads them: one AMD card, its KFD node
// and a NUMA node laid out by the tests' FakeSysfs in a temp directory, each file's content
// a part of the input ("\n--\n" between parts, in the order of kFiles), then the AMD sysfs
// backend's Discover and Sample and ReadCpuTopology over that tree; ParseCpuList on the
// whole input. Every file is rewritten (or removed) for each input, so runs are independent.
#include <cstdio>
#include <memory>
#include <string>

#include "agent/devices/gpu_backend.h"
#include "agent/devices/topology.h"
#include "tests/fakes/fake_sysfs.h"
#include "tests/fuzz/fuzz_input.h"

namespace devices = spawnpoint::devices;

namespace {

const char* const kDev = "sys/devices/pci0000:00/0000:03:00.0/";
// Relative to kDev unless they start with "sys/".
const char* const kFiles[] = {
    "vendor",
    "class",
    "device",
    "unique_id",
    "product_name",
    "mem_info_vram_total",
    "mem_info_vram_used",
    "gpu_busy_percent",
    "numa_node",
    "hwmon/hwmon0/temp1_label",
    "hwmon/hwmon0/temp1_input",
    "hwmon/hwmon0/power1_average",
    "sys/class/kfd/kfd/topology/nodes/0/properties",
    "sys/devices/system/node/node0/cpulist",
};
constexpr size_t kNumFiles = sizeof(kFiles) / sizeof(kFiles[0]);

spawnpoint::testing::FakeSysfs& Tree() {
  static spawnpoint::testing::FakeSysfs tree;
  static const bool laid_out = [] {
    spawnpoint::testing::FakeSysfs::AmdCard card;
    card.pci_bus_id = "0000:03:00.0";
    card.kfd_node = 0;
    card.temp_millicelsius = 40000;
    card.power_microwatts = 1;
    card.busy_percent = 1;
    tree.AddAmdCard(card);
    tree.AddNumaNode(0, "0-3");
    return true;
  }();
  (void)laid_out;
  return tree;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto& tree = Tree();
  const auto parts = spawnpoint::fuzz::SplitParts(data, size, kNumFiles);
  for (size_t i = 0; i < kNumFiles; ++i) {
    std::string relative = kFiles[i];
    if (relative.rfind("sys/", 0) != 0) relative = kDev + relative;
    if (i < parts.size()) {
      tree.WriteFile(relative, parts[i]);
    } else {
      std::remove((tree.root() + "/" + relative).c_str());  // fewer parts: files missing
    }
  }
  auto backend = devices::OpenAmdSysfsBackend(tree.sysfs_root());
  if (backend) {
    (void)backend->Describe();
    if (auto gpus = backend->Discover(); gpus.ok()) {
      for (const auto& gpu : *gpus) (void)gpu.name.size();
    }
    (void)backend->Sample();
  }
  (void)devices::ReadCpuTopology(tree.sysfs_root(), {0, 1, 2, 3});
  (void)devices::ParseCpuList(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
