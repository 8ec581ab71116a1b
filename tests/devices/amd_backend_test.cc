#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/devices/gpu_backend.h"
#include "tests/fakes/fake_sysfs.h"

namespace spawnpoint::devices {
namespace {

using testing::FakeSysfs;

FakeSysfs::AmdCard Mi300(int card, const std::string& bus, int numa) {
  FakeSysfs::AmdCard c;
  c.card = card;
  c.pci_bus_id = bus;
  c.numa_node = numa;
  c.unique_id = "0x" + std::to_string(1000 + card);
  c.product_name = "AMD Instinct MI300X";
  c.vram_total = 206158430208ull;
  c.vram_used = 1073741824ull * (card + 1);
  c.busy_percent = 42 + card;
  c.temp_millicelsius = 55000 + card * 1000;
  c.power_microwatts = 120500000;
  return c;
}

TEST(AmdSysfsBackendTest, DiscoversAccessibleAmdGpusOnly) {
  FakeSysfs sys;
  sys.AddAmdCard(Mi300(1, "0000:c1:00.0", 1));
  sys.AddAmdCard(Mi300(0, "0000:11:00.0", 0));
  FakeSysfs::AmdCard bare;  // consumer card: no unique_id, no product_name
  bare.card = 2;
  bare.pci_bus_id = "0000:21:00.0";
  bare.numa_node = 0;
  bare.vram_total = 17179869184ull;
  sys.AddAmdCard(bare);
  FakeSysfs::AmdCard other_pod = Mi300(3, "0000:31:00.0", 0);
  other_pod.accessible = false;  // the host's card, but not mounted into this container
  sys.AddAmdCard(other_pod);
  FakeSysfs::AmdCard nvidia = Mi300(4, "0000:41:00.0", 0);
  nvidia.vendor = "0x10de";
  sys.AddAmdCard(nvidia);

  auto backend = OpenAmdSysfsBackend(sys.sysfs_root());
  EXPECT_EQ(backend->Name(), "amd");
  auto gpus = backend->Discover();
  ASSERT_TRUE(gpus.ok()) << gpus.status().ToString();
  ASSERT_EQ(gpus->size(), 3u);
  // Topology order: node 0 (buses 11, 21), then node 1 (bus c1).
  EXPECT_EQ((*gpus)[0].pci_bus_id, "0000:11:00.0");
  EXPECT_EQ((*gpus)[1].pci_bus_id, "0000:21:00.0");
  EXPECT_EQ((*gpus)[2].pci_bus_id, "0000:c1:00.0");
  // Without KFD topology the ROCr index follows card numbers among accessible cards.
  EXPECT_EQ((*gpus)[0].index, 0);
  EXPECT_EQ((*gpus)[1].index, 2);
  EXPECT_EQ((*gpus)[2].index, 1);
  EXPECT_EQ((*gpus)[0].uuid, "0x1000");
  EXPECT_EQ((*gpus)[0].name, "AMD Instinct MI300X");
  EXPECT_EQ((*gpus)[0].vendor, "amd");
  EXPECT_EQ((*gpus)[0].numa_node, 0);
  EXPECT_EQ((*gpus)[0].memory_total_bytes, 206158430208ull);
  EXPECT_TRUE((*gpus)[0].healthy);
  EXPECT_EQ((*gpus)[1].uuid, "0000:21:00.0");  // falls back to the PCI bus id
  EXPECT_EQ((*gpus)[1].name, "AMD GPU 0x740f");
  EXPECT_EQ((*gpus)[2].numa_node, 1);
}

TEST(AmdSysfsBackendTest, IndexFollowsKfdTopologyOrder) {
  FakeSysfs sys;
  auto a = Mi300(0, "0000:11:00.0", 0);
  a.kfd_node = 3;
  auto b = Mi300(1, "0000:c1:00.0", 1);
  b.kfd_node = 2;
  sys.AddAmdCard(a);
  sys.AddAmdCard(b);
  auto gpus = OpenAmdSysfsBackend(sys.sysfs_root())->Discover();
  ASSERT_TRUE(gpus.ok());
  ASSERT_EQ(gpus->size(), 2u);
  EXPECT_EQ((*gpus)[0].pci_bus_id, "0000:11:00.0");
  EXPECT_EQ((*gpus)[0].index, 1);
  EXPECT_EQ((*gpus)[1].index, 0);
}

TEST(AmdSysfsBackendTest, BusIdFromUeventWhenDeviceIsNotASymlink) {
  FakeSysfs sys;
  auto c = Mi300(0, "0000:0A:00.0", 0);
  c.uevent_only = true;
  sys.AddAmdCard(c);
  auto gpus = OpenAmdSysfsBackend(sys.sysfs_root())->Discover();
  ASSERT_TRUE(gpus.ok());
  ASSERT_EQ(gpus->size(), 1u);
  EXPECT_EQ((*gpus)[0].pci_bus_id, "0000:0a:00.0");
  EXPECT_EQ((*gpus)[0].numa_node, 0);
}

TEST(AmdSysfsBackendTest, SkipsNonDisplayFunctions) {
  FakeSysfs sys;
  auto audio = Mi300(0, "0000:11:00.1", 0);
  audio.pci_class = "0x040300";
  sys.AddAmdCard(audio);
  auto gpus = OpenAmdSysfsBackend(sys.sysfs_root())->Discover();
  ASSERT_TRUE(gpus.ok());
  EXPECT_TRUE(gpus->empty());
}

TEST(AmdSysfsBackendTest, SampleReadsBusyPercentVramAndHwmon) {
  FakeSysfs sys;
  sys.AddAmdCard(Mi300(0, "0000:11:00.0", 0));
  FakeSysfs::AmdCard quiet;  // no busy percent, no hwmon
  quiet.card = 1;
  quiet.pci_bus_id = "0000:12:00.0";
  sys.AddAmdCard(quiet);
  auto samples = OpenAmdSysfsBackend(sys.sysfs_root())->Sample();
  ASSERT_TRUE(samples.ok());
  ASSERT_EQ(samples->size(), 2u);
  const GpuSample& s = (*samples)[0];
  EXPECT_EQ(s.index, 0);
  ASSERT_TRUE(s.utilisation && s.memory_used_bytes && s.memory_total_bytes &&
              s.temperature_celsius && s.power_watts);
  EXPECT_DOUBLE_EQ(*s.utilisation, 0.42);
  EXPECT_EQ(*s.memory_used_bytes, 1073741824ull);
  EXPECT_EQ(*s.memory_total_bytes, 206158430208ull);
  EXPECT_DOUBLE_EQ(*s.temperature_celsius, 55.0);
  EXPECT_DOUBLE_EQ(*s.power_watts, 120.5);
  EXPECT_FALSE((*samples)[1].utilisation.has_value());
  EXPECT_FALSE((*samples)[1].power_watts.has_value());
}

TEST(AmdSysfsBackendTest, NoDrmDirectoryMeansNoGpu) {
  FakeSysfs sys;
  auto gpus = OpenAmdSysfsBackend(sys.sysfs_root())->Discover();
  ASSERT_TRUE(gpus.ok());
  EXPECT_TRUE(gpus->empty());
}

}  // namespace
}  // namespace spawnpoint::devices
