#include "tests/fakes/fake_sysfs.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

namespace fs = std::filesystem;

namespace spawnpoint::testing {
namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "FakeSysfs: %s\n", what.c_str());
  std::abort();
}

void MakeDirs(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) Die("mkdir " + path + ": " + ec.message());
}

void Symlink(const std::string& target, const std::string& link) {
  std::error_code ec;
  fs::remove(link, ec);
  fs::create_directory_symlink(target, link, ec);
  if (ec) Die("symlink " + link + ": " + ec.message());
}

}  // namespace

FakeSysfs::FakeSysfs() {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/fake-sysfs-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) Die("mkdtemp " + tmpl + " failed");
  root_ = buf.data();
  MakeDirs(sysfs_root());
  MakeDirs(dev_root());
}

FakeSysfs::~FakeSysfs() {
  std::error_code ec;
  fs::remove_all(root_, ec);
}

std::string FakeSysfs::WriteFile(const std::string& relative, const std::string& content) {
  const std::string path = root_ + "/" + relative;
  MakeDirs(fs::path(path).parent_path().string());
  std::ofstream out(path, std::ios::trunc);
  out << content;
  if (!out) Die("write " + path);
  return path;
}

void FakeSysfs::AddNumaNode(int id, const std::string& cpulist) {
  WriteFile("sys/devices/system/node/node" + std::to_string(id) + "/cpulist", cpulist + "\n");
}

void FakeSysfs::AddPciDevice(const std::string& bus_id, int numa_node) {
  const std::string dev = "sys/devices/pci0000:00/" + bus_id;
  WriteFile(dev + "/numa_node", std::to_string(numa_node) + "\n");
  MakeDirs(sysfs_root() + "/bus/pci/devices");
  Symlink(root_ + "/" + dev, sysfs_root() + "/bus/pci/devices/" + bus_id);
}

void FakeSysfs::AddAmdCard(const AmdCard& c) {
  const int minor = c.render_minor >= 0 ? c.render_minor : 128 + c.card;
  const std::string card = "card" + std::to_string(c.card);
  const std::string render = "renderD" + std::to_string(minor);
  const std::string drm = "sys/class/drm/";
  std::string dev;  // the PCI device directory, relative to root_
  if (c.uevent_only) {
    dev = drm + card + "/device";
    WriteFile(dev + "/uevent", "DRIVER=amdgpu\nPCI_SLOT_NAME=" + c.pci_bus_id + "\n");
    WriteFile(dev + "/numa_node", std::to_string(c.numa_node) + "\n");
  } else {
    AddPciDevice(c.pci_bus_id, c.numa_node);
    dev = "sys/devices/pci0000:00/" + c.pci_bus_id;
    MakeDirs(sysfs_root() + "/class/drm/" + card);
    Symlink(root_ + "/" + dev, root_ + "/" + drm + card + "/device");
  }
  WriteFile(dev + "/vendor", c.vendor + "\n");
  WriteFile(dev + "/class", c.pci_class + "\n");
  WriteFile(dev + "/device", c.device_id + "\n");
  MakeDirs(root_ + "/" + dev + "/drm/" + card);
  MakeDirs(root_ + "/" + dev + "/drm/" + render);
  if (!c.unique_id.empty()) WriteFile(dev + "/unique_id", c.unique_id + "\n");
  if (!c.product_name.empty()) WriteFile(dev + "/product_name", c.product_name + "\n");
  WriteFile(dev + "/mem_info_vram_total", std::to_string(c.vram_total) + "\n");
  WriteFile(dev + "/mem_info_vram_used", std::to_string(c.vram_used) + "\n");
  if (c.busy_percent >= 0) WriteFile(dev + "/gpu_busy_percent", std::to_string(c.busy_percent));
  if (c.temp_millicelsius >= 0) {
    WriteFile(dev + "/hwmon/hwmon" + std::to_string(c.card) + "/temp1_label", "edge\n");
    WriteFile(dev + "/hwmon/hwmon" + std::to_string(c.card) + "/temp1_input",
              std::to_string(c.temp_millicelsius) + "\n");
  }
  if (c.power_microwatts >= 0) {
    WriteFile(dev + "/hwmon/hwmon" + std::to_string(c.card) + "/power1_average",
              std::to_string(c.power_microwatts) + "\n");
  }
  // Entries the backend must skip: a connector and the render node's own class entry.
  WriteFile(drm + card + "-DP-1/status", "disconnected\n");
  WriteFile(drm + render + "/dev", "226:" + std::to_string(minor) + "\n");
  if (c.kfd_node >= 0) {
    WriteFile(
        "sys/class/kfd/kfd/topology/nodes/" + std::to_string(c.kfd_node) + "/properties",
        "cpu_cores_count 0\nsimd_count 304\ndrm_render_minor " + std::to_string(minor) + "\n");
  }
  if (c.accessible) WriteFile("dev/dri/" + render, "");
}

void FakeSysfs::AddEightGpuTwoNumaTopology() {
  AddNumaNode(0, "0-15");
  AddNumaNode(1, "16-31");
  for (const char* bus : {"07", "0f", "47", "4e"})
    AddPciDevice("0000:" + std::string(bus) + ":00.0", 0);
  for (const char* bus : {"87", "90", "b7", "bd"})
    AddPciDevice("0000:" + std::string(bus) + ":00.0", 1);
}

std::string FakeNvmlConfig(const std::string& name) {
  return std::string(FAKE_NVML_CONFIG_DIR) + "/" + name;
}

}  // namespace spawnpoint::testing
