#include <cstdlib>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/devices/gpu_backend.h"
#include "tests/devices/fake_nvml_library.h"
#include "tests/fakes/fake_sysfs.h"

namespace spawnpoint::devices {
namespace {

using ::testing::ElementsAre;
using testing::FakeNvmlConfig;
using testing::FakeNvmlLibrary;
using testing::FakeSysfs;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ScopedNvmlConfig;

std::vector<std::string> BusIds(const std::vector<GpuDevice>& gpus) {
  std::vector<std::string> out;
  for (const auto& g : gpus) out.push_back(g.pci_bus_id);
  return out;
}

TEST(NvmlBackendTest, DiscoversGpusInTopologyOrderWithNumaFromSysfs) {
  FakeSysfs sys;
  sys.AddEightGpuTwoNumaTopology();
  ScopedNvmlConfig config(FakeNvmlConfig("eight_gpus_two_numa.conf"));
  auto backend = OpenNvmlBackend(FakeNvmlLibrary(), sys.sysfs_root());
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  EXPECT_EQ((*backend)->Name(), "nvml");
  auto gpus = (*backend)->Discover();
  ASSERT_TRUE(gpus.ok()) << gpus.status().ToString();
  ASSERT_EQ(gpus->size(), 8u);
  EXPECT_THAT(BusIds(*gpus),
              ElementsAre("0000:07:00.0", "0000:0f:00.0", "0000:47:00.0", "0000:4e:00.0",
                          "0000:87:00.0", "0000:90:00.0", "0000:b7:00.0", "0000:bd:00.0"));
  std::vector<int> numa, index;
  for (const auto& g : *gpus) {
    numa.push_back(g.numa_node);
    index.push_back(g.index);
    EXPECT_TRUE(g.healthy) << g.pci_bus_id;
    EXPECT_EQ(g.vendor, "nvidia");
  }
  EXPECT_THAT(numa, ElementsAre(0, 0, 0, 0, 1, 1, 1, 1));
  // NVML index is the line in the config, which lists the buses out of order.
  EXPECT_THAT(index, ElementsAre(3, 1, 6, 4, 0, 5, 7, 2));
  const GpuDevice& first = gpus->front();
  EXPECT_EQ(first.uuid, "GPU-6b7c1a2e-0000-4000-8000-000000000007");
  EXPECT_EQ(first.name, "NVIDIA A100-SXM4-80GB");
  EXPECT_EQ(first.memory_total_bytes, 85899345920u);
}

TEST(NvmlBackendTest, NumaIsUnknownWithoutSysfsEntry) {
  FakeSysfs sys;  // no PCI devices
  ScopedNvmlConfig config(FakeNvmlConfig("eight_gpus_two_numa.conf"));
  auto backend = OpenNvmlBackend(FakeNvmlLibrary(), sys.sysfs_root());
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  auto gpus = (*backend)->Discover();
  ASSERT_TRUE(gpus.ok());
  for (const auto& g : *gpus) EXPECT_EQ(g.numa_node, -1) << g.pci_bus_id;
  // Still sorted by bus id.
  EXPECT_EQ(gpus->front().pci_bus_id, "0000:07:00.0");
  EXPECT_EQ(gpus->back().pci_bus_id, "0000:bd:00.0");
}

TEST(NvmlBackendTest, SampleReportsUnitsConverted) {
  FakeSysfs sys;
  ScopedNvmlConfig config(FakeNvmlConfig("eight_gpus_two_numa.conf"));
  auto backend = OpenNvmlBackend(FakeNvmlLibrary(), sys.sysfs_root());
  ASSERT_TRUE(backend.ok());
  auto samples = (*backend)->Sample();
  ASSERT_TRUE(samples.ok()) << samples.status().ToString();
  ASSERT_EQ(samples->size(), 8u);
  const GpuSample& s = (*samples)[7];  // bus b7: util 80 %, 170 W, 47 C, 8 GiB used
  EXPECT_EQ(s.index, 7);
  ASSERT_TRUE(s.utilisation && s.power_watts && s.temperature_celsius && s.memory_used_bytes &&
              s.memory_total_bytes);
  EXPECT_DOUBLE_EQ(*s.utilisation, 0.80);
  EXPECT_DOUBLE_EQ(*s.power_watts, 170.0);
  EXPECT_DOUBLE_EQ(*s.temperature_celsius, 47.0);
  EXPECT_EQ(*s.memory_used_bytes, 8589934592u);
  EXPECT_EQ(*s.memory_total_bytes, 85899345920u);
}

TEST(NvmlBackendTest, LostGpuIsReportedUnhealthyNotAsAnError) {
  FakeSysfs sys;
  sys.AddPciDevice("0000:3b:00.0", 0);
  sys.AddPciDevice("0000:5e:00.0", 0);
  const std::string path =
      sys.WriteFile("nvml.conf",
                    "GPU-aaaa|NVIDIA H100|00000000:3B:00.0|100|10|50|300000|60|0\n"
                    "GPU-bbbb|NVIDIA H100|00000000:5E:00.0|100|10|50|300000|60|1\n"
                    "GPU-cccc|NVIDIA H100|00000000:86:00.0|100|10|50|300000|60|2\n");
  ScopedNvmlConfig config(path);
  auto backend = OpenNvmlBackend(FakeNvmlLibrary(), sys.sysfs_root());
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  auto gpus = (*backend)->Discover();
  ASSERT_TRUE(gpus.ok()) << gpus.status().ToString();
  ASSERT_EQ(gpus->size(), 3u);
  // The GPU without even a handle has no bus id or NUMA node, so it sorts first.
  const GpuDevice& gone = (*gpus)[0];
  EXPECT_EQ(gone.index, 2);
  EXPECT_FALSE(gone.healthy);
  EXPECT_EQ(gone.uuid, "");
  EXPECT_THAT(gone.unhealthy_reason, HasSubstr("GPU is lost (NVML error 15)"));
  const GpuDevice& ok = (*gpus)[1];
  EXPECT_EQ(ok.uuid, "GPU-aaaa");
  EXPECT_TRUE(ok.healthy);
  EXPECT_EQ(ok.unhealthy_reason, "");
  const GpuDevice& lost = (*gpus)[2];
  EXPECT_EQ(lost.uuid, "GPU-bbbb");
  EXPECT_EQ(lost.pci_bus_id, "0000:5e:00.0");
  EXPECT_FALSE(lost.healthy);
  EXPECT_THAT(lost.unhealthy_reason, HasSubstr("GPU is lost (NVML error 15)"));
  EXPECT_THAT(lost.unhealthy_reason, HasSubstr("reset or replace the GPU"));

  auto samples = (*backend)->Sample();
  ASSERT_TRUE(samples.ok());
  ASSERT_EQ(samples->size(), 3u);
  EXPECT_TRUE((*samples)[0].utilisation.has_value());
  EXPECT_FALSE((*samples)[1].utilisation.has_value());
  EXPECT_FALSE((*samples)[1].memory_used_bytes.has_value());
  EXPECT_FALSE((*samples)[2].temperature_celsius.has_value());
}

TEST(NvmlBackendTest, PendingEccRepairMakesGpuUnhealthy) {
  FakeSysfs sys;
  const std::string path = sys.WriteFile("nvml.conf",
                                         "GPU-1|A|00000000:01:00.0|1|0|0|0|0|0|1\n"
                                         "GPU-2|A|00000000:02:00.0|1|0|0|0|0|0|2\n"
                                         "GPU-3|A|00000000:03:00.0|1|0|0|0|0|0|3\n"
                                         "GPU-4|A|00000000:04:00.0|1|0|0|0|0|0|0\n");
  ScopedNvmlConfig config(path);
  auto backend = OpenNvmlBackend(FakeNvmlLibrary(), sys.sysfs_root());
  ASSERT_TRUE(backend.ok());
  auto gpus = (*backend)->Discover();
  ASSERT_TRUE(gpus.ok());
  ASSERT_EQ(gpus->size(), 4u);
  EXPECT_FALSE((*gpus)[0].healthy);
  EXPECT_THAT((*gpus)[0].unhealthy_reason, HasSubstr("page retirement pending"));
  EXPECT_FALSE((*gpus)[1].healthy);
  EXPECT_THAT((*gpus)[1].unhealthy_reason, HasSubstr("row remapping pending"));
  EXPECT_FALSE((*gpus)[2].healthy);
  EXPECT_THAT((*gpus)[2].unhealthy_reason, HasSubstr("needs to be replaced"));
  EXPECT_TRUE((*gpus)[3].healthy);
}

TEST(NvmlBackendTest, InitFailureCarriesNvmlErrorString) {
  FakeSysfs sys;
  const std::string path = sys.WriteFile("nvml.conf", "init_error 9\n");
  ScopedNvmlConfig config(path);
  auto backend = OpenNvmlBackend(FakeNvmlLibrary(), sys.sysfs_root());
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(backend.status().message(),
              HasSubstr("nvmlInit_v2 failed: Driver Not Loaded (NVML error 9)"));
  EXPECT_THAT(backend.status().message(), HasSubstr("--gpu-backend"));
  EXPECT_THAT(backend.status().message(), Not(HasSubstr("\n")));
}

TEST(NvmlBackendTest, MissingLibraryNamesThePath) {
  auto backend = OpenNvmlBackend("/nonexistent/dir/libnvidia-ml.so.1", "");
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(backend.status().message(),
              HasSubstr("cannot load NVML library '/nonexistent/dir/libnvidia-ml.so.1'"));
  EXPECT_THAT(backend.status().message(), HasSubstr("gpusPerNode: 0"));
  EXPECT_THAT(backend.status().message(), Not(HasSubstr("\n")));
}

TEST(NvmlBackendTest, LibraryWithoutNvmlSymbolsIsRejected) {
  // libc is loadable but is not NVML.
  auto backend = OpenNvmlBackend("libc.so.6", "");
  ASSERT_FALSE(backend.ok());
  EXPECT_THAT(backend.status().message(), HasSubstr("has no symbol nvmlInit_v2"));
}

TEST(SelectGpuBackendTest, AutoPrefersNvmlWhenItHasGpus) {
  FakeSysfs sys;
  sys.AddAmdCard({.card = 0, .pci_bus_id = "0000:03:00.0"});
  ScopedNvmlConfig config(FakeNvmlConfig("eight_gpus_two_numa.conf"));
  auto backend = SelectGpuBackend("auto", FakeNvmlLibrary(), sys.sysfs_root(), "nvidia.com/gpu");
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  EXPECT_EQ((*backend)->Name(), "nvml");
  // The resource hint turns the order around.
  auto amd = SelectGpuBackend("auto", FakeNvmlLibrary(), sys.sysfs_root(), "amd.com/gpu");
  ASSERT_TRUE(amd.ok());
  EXPECT_EQ((*amd)->Name(), "amd");
}

TEST(SelectGpuBackendTest, AutoFallsBackToAmdWhenNvmlHasNoDevice) {
  FakeSysfs sys;
  sys.AddAmdCard({.card = 0, .pci_bus_id = "0000:03:00.0"});
  unsetenv("FAKE_NVML_CONFIG");  // NVML initialises but has no device
  auto backend = SelectGpuBackend("auto", FakeNvmlLibrary(), sys.sysfs_root(), "");
  ASSERT_TRUE(backend.ok());
  EXPECT_EQ((*backend)->Name(), "amd");
}

TEST(SelectGpuBackendTest, AutoEndsWithNoneAndSaysWhatItTried) {
  FakeSysfs sys;
  auto backend = SelectGpuBackend("auto", "/nonexistent/libnvidia-ml.so.1", sys.sysfs_root(), "");
  ASSERT_TRUE(backend.ok());
  EXPECT_EQ((*backend)->Name(), "none");
  const std::string d = (*backend)->Describe();
  EXPECT_THAT(d,
              HasSubstr("auto: nvml: cannot load NVML library '/nonexistent/libnvidia-ml.so.1'"));
  EXPECT_THAT(d, HasSubstr("amd: no GPU found under " + sys.sysfs_root() + "/class/drm"));
  auto gpus = (*backend)->Discover();
  ASSERT_TRUE(gpus.ok());
  EXPECT_TRUE(gpus->empty());
}

TEST(SelectGpuBackendTest, ExplicitKinds) {
  FakeSysfs sys;
  auto none = SelectGpuBackend("none", FakeNvmlLibrary(), sys.sysfs_root(), "nvidia.com/gpu");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ((*none)->Name(), "none");
  EXPECT_EQ((*none)->Describe(), "none");
  auto amd = SelectGpuBackend("amd", FakeNvmlLibrary(), sys.sysfs_root(), "nvidia.com/gpu");
  ASSERT_TRUE(amd.ok());
  EXPECT_EQ((*amd)->Name(), "amd");
  auto nvml = SelectGpuBackend("nvml", "/nonexistent/libnvidia-ml.so.1", sys.sysfs_root(), "");
  ASSERT_FALSE(nvml.ok());
  EXPECT_THAT(nvml.status().message(), HasSubstr("/nonexistent/libnvidia-ml.so.1"));
  auto bad = SelectGpuBackend("cuda", "", sys.sysfs_root(), "");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("auto, nvml, amd or none"));
}

TEST(PciBusIdTest, Normalises) {
  EXPECT_EQ(NormalisePciBusId("00000000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(NormalisePciBusId("0000:af:1f.7"), "0000:af:1f.7");
  EXPECT_EQ(NormalisePciBusId("00010000:01:00.0"), "10000:01:00.0");
  EXPECT_EQ(NormalisePciBusId("GARBAGE"), "garbage");
}

}  // namespace
}  // namespace spawnpoint::devices
