#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/devices/assignment.h"

namespace spawnpoint::devices {
namespace {

using api::GpuAssignment;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

std::vector<int> Range(int lo, int hi) {
  std::vector<int> v;
  for (int i = lo; i <= hi; ++i) v.push_back(i);
  return v;
}

CpuTopology TwoNodes() {
  return CpuTopology{{NumaNode{0, Range(0, 15)}, NumaNode{1, Range(16, 31)}}};
}

GpuDevice Gpu(int index, const std::string& bus, int numa, const std::string& vendor = "nvidia") {
  GpuDevice g;
  g.index = index;
  g.uuid = "GPU-" + bus.substr(5, 2);
  g.pci_bus_id = bus;
  g.numa_node = numa;
  g.vendor = vendor;
  g.name = "test";
  return g;
}

// The same machine as tests/fakes/nvml/eight_gpus_two_numa.conf, in NVML index order.
std::vector<GpuDevice> EightGpus() {
  return {Gpu(0, "0000:87:00.0", 1), Gpu(1, "0000:0f:00.0", 0), Gpu(2, "0000:bd:00.0", 1),
          Gpu(3, "0000:07:00.0", 0), Gpu(4, "0000:4e:00.0", 0), Gpu(5, "0000:90:00.0", 1),
          Gpu(6, "0000:47:00.0", 0), Gpu(7, "0000:b7:00.0", 1)};
}

std::vector<std::string> Buses(const std::vector<GpuDevice>& gpus) {
  std::vector<std::string> out;
  for (const auto& g : gpus) out.push_back(g.pci_bus_id);
  return out;
}

TEST(AssignRanksTest, SharedEveryRankSeesAllGpusInTopologyOrder) {
  auto ranks = AssignRanks(EightGpus(), TwoNodes(), 8, 8, GpuAssignment::kShared);
  ASSERT_TRUE(ranks.ok()) << ranks.status().ToString();
  ASSERT_EQ(ranks->size(), 8u);
  for (int r = 0; r < 8; ++r) {
    const RankDevices& rd = (*ranks)[r];
    EXPECT_EQ(rd.local_rank, r);
    EXPECT_EQ(rd.device_ordinal, r);
    EXPECT_THAT(Buses(rd.visible),
                ElementsAre("0000:07:00.0", "0000:0f:00.0", "0000:47:00.0", "0000:4e:00.0",
                            "0000:87:00.0", "0000:90:00.0", "0000:b7:00.0", "0000:bd:00.0"));
    EXPECT_EQ(rd.numa_node, r < 4 ? 0 : 1);
  }
  // Ranks 0-3 drive node-0 GPUs and get node-0 CPUs, four each; ranks 4-7 node 1.
  EXPECT_EQ((*ranks)[0].cpus, Range(0, 3));
  EXPECT_EQ((*ranks)[1].cpus, Range(4, 7));
  EXPECT_EQ((*ranks)[3].cpus, Range(12, 15));
  EXPECT_EQ((*ranks)[4].cpus, Range(16, 19));
  EXPECT_EQ((*ranks)[7].cpus, Range(28, 31));
}

TEST(AssignRanksTest, ExclusiveEachRankSeesOnlyItsGpu) {
  auto ranks = AssignRanks(EightGpus(), TwoNodes(), 8, 8, GpuAssignment::kExclusive);
  ASSERT_TRUE(ranks.ok()) << ranks.status().ToString();
  const std::vector<std::string> order = {"0000:07:00.0", "0000:0f:00.0", "0000:47:00.0",
                                          "0000:4e:00.0", "0000:87:00.0", "0000:90:00.0",
                                          "0000:b7:00.0", "0000:bd:00.0"};
  for (int r = 0; r < 8; ++r) {
    const RankDevices& rd = (*ranks)[r];
    ASSERT_EQ(rd.visible.size(), 1u);
    EXPECT_EQ(rd.visible[0].pci_bus_id, order[r]);
    EXPECT_EQ(rd.device_ordinal, 0);
  }
  EXPECT_EQ((*ranks)[2].cpus, Range(8, 11));
  EXPECT_EQ((*ranks)[5].cpus, Range(20, 23));
}

TEST(AssignRanksTest, UnevenSplitAndCpusOfNodesWithoutGpusAreSharedOut) {
  // Three GPUs, all on node 0 (CPUs 0-9); node 1 (CPUs 10-15) has none.
  CpuTopology topo{{NumaNode{0, Range(0, 9)}, NumaNode{1, Range(10, 15)}}};
  std::vector<GpuDevice> gpus = {Gpu(0, "0000:01:00.0", 0), Gpu(1, "0000:02:00.0", 0),
                                 Gpu(2, "0000:03:00.0", 0)};
  auto ranks = AssignRanks(gpus, topo, 3, 3, GpuAssignment::kShared);
  ASSERT_TRUE(ranks.ok()) << ranks.status().ToString();
  EXPECT_THAT((*ranks)[0].cpus, ElementsAre(0, 1, 2, 3, 10, 11));
  EXPECT_THAT((*ranks)[1].cpus, ElementsAre(4, 5, 6, 12, 13));
  EXPECT_THAT((*ranks)[2].cpus, ElementsAre(7, 8, 9, 14, 15));
  for (const auto& rd : *ranks) EXPECT_EQ(rd.numa_node, 0);
}

TEST(AssignRanksTest, FewerCpusOnNodeThanRanksShareRoundRobin) {
  CpuTopology topo{{NumaNode{0, {0, 1}}}};
  std::vector<GpuDevice> gpus = {Gpu(0, "0000:01:00.0", 0), Gpu(1, "0000:02:00.0", 0),
                                 Gpu(2, "0000:03:00.0", 0)};
  auto ranks = AssignRanks(gpus, topo, 3, 3, GpuAssignment::kExclusive);
  ASSERT_TRUE(ranks.ok());
  EXPECT_THAT((*ranks)[0].cpus, ElementsAre(0));
  EXPECT_THAT((*ranks)[1].cpus, ElementsAre(1));
  EXPECT_THAT((*ranks)[2].cpus, ElementsAre(0));
}

TEST(AssignRanksTest, UnknownGpuNumaFallsBackToContiguousSplit) {
  std::vector<GpuDevice> gpus = {Gpu(0, "0000:02:00.0", -1), Gpu(1, "0000:01:00.0", -1)};
  auto ranks = AssignRanks(gpus, TwoNodes(), 2, 2, GpuAssignment::kShared);
  ASSERT_TRUE(ranks.ok());
  EXPECT_EQ((*ranks)[0].visible[0].pci_bus_id, "0000:01:00.0");
  EXPECT_EQ((*ranks)[0].cpus, Range(0, 15));
  EXPECT_EQ((*ranks)[1].cpus, Range(16, 31));
  EXPECT_EQ((*ranks)[0].numa_node, -1);  // the GPU's node stays unknown
}

TEST(AssignRanksTest, CpuRanksGetContiguousNumaPackedChunks) {
  auto ranks = AssignRanks({}, TwoNodes(), 3, 0, GpuAssignment::kShared);
  ASSERT_TRUE(ranks.ok()) << ranks.status().ToString();
  ASSERT_EQ(ranks->size(), 3u);
  EXPECT_EQ((*ranks)[0].cpus, Range(0, 10));
  EXPECT_EQ((*ranks)[1].cpus, Range(11, 21));
  EXPECT_EQ((*ranks)[2].cpus, Range(22, 31));
  EXPECT_EQ((*ranks)[0].numa_node, 0);
  EXPECT_EQ((*ranks)[1].numa_node, 1);  // 5 CPUs on node 0, 6 on node 1
  for (const auto& rd : *ranks) {
    EXPECT_TRUE(rd.visible.empty());
    EXPECT_EQ(rd.device_ordinal, -1);
  }
}

TEST(AssignRanksTest, CpuRanksIgnoreGpusWhenGpusPerNodeIsZero) {
  auto ranks = AssignRanks(EightGpus(), TwoNodes(), 2, 0, GpuAssignment::kShared);
  ASSERT_TRUE(ranks.ok());
  EXPECT_TRUE((*ranks)[0].visible.empty());
  EXPECT_EQ((*ranks)[1].cpus, Range(16, 31));
}

TEST(AssignRanksTest, MoreCpuRanksThanCpusShareRoundRobin) {
  CpuTopology topo{{NumaNode{0, {4, 5}}}};
  auto ranks = AssignRanks({}, topo, 5, 0, GpuAssignment::kShared);
  ASSERT_TRUE(ranks.ok());
  std::vector<std::vector<int>> cpus;
  for (const auto& rd : *ranks) cpus.push_back(rd.cpus);
  EXPECT_THAT(cpus, ElementsAre(ElementsAre(4), ElementsAre(5), ElementsAre(4), ElementsAre(5),
                                ElementsAre(4)));
}

TEST(AssignRanksTest, ErrorMoreRanksThanGpus) {
  std::vector<GpuDevice> four = EightGpus();
  four.resize(4);
  auto ranks = AssignRanks(four, TwoNodes(), 8, 8, GpuAssignment::kShared, "nvml");
  ASSERT_FALSE(ranks.ok());
  EXPECT_EQ(ranks.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(ranks.status().message(),
            "gpusPerNode is 8 but only 4 GPUs were found (GPU backend: nvml): lower gpusPerNode "
            "to 4 or give each pod 8 GPUs");
}

TEST(AssignRanksTest, ErrorUnhealthyGpuInThePodsSet) {
  std::vector<GpuDevice> gpus = {Gpu(0, "0000:01:00.0", 0), Gpu(1, "0000:3b:00.0", 0)};
  gpus[1].healthy = false;
  gpus[1].unhealthy_reason = "GPU is lost: drain the node";
  auto ranks = AssignRanks(gpus, TwoNodes(), 2, 2, GpuAssignment::kShared);
  ASSERT_FALSE(ranks.ok());
  EXPECT_EQ(ranks.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(ranks.status().message(),
            "2 ranks need 2 healthy GPUs but only 1 of 2 are healthy: GPU 1 (uuid GPU-3b, PCI "
            "0000:3b:00.0) is unhealthy: GPU is lost: drain the node");
}

TEST(AssignRanksTest, UnhealthyGpuIsPassedOverWhenThereAreSpares) {
  auto gpus = EightGpus();
  gpus[3].healthy = false;  // bus 07, first in topology order
  gpus[3].unhealthy_reason = "lost";
  auto ranks = AssignRanks(gpus, TwoNodes(), 4, 4, GpuAssignment::kShared);
  ASSERT_TRUE(ranks.ok()) << ranks.status().ToString();
  EXPECT_THAT(Buses((*ranks)[0].visible),
              ElementsAre("0000:0f:00.0", "0000:47:00.0", "0000:4e:00.0", "0000:87:00.0"));
  EXPECT_EQ((*ranks)[3].numa_node, 1);
}

TEST(AssignRanksTest, ErrorTooFewHealthyGpus) {
  auto gpus = EightGpus();
  for (int i = 0; i < 5; ++i) gpus[i].healthy = false;
  auto ranks = AssignRanks(gpus, TwoNodes(), 4, 4, GpuAssignment::kShared);
  ASSERT_FALSE(ranks.ok());
  EXPECT_THAT(ranks.status().message(), HasSubstr("only 3 of 8 are healthy"));
  EXPECT_THAT(ranks.status().message(), HasSubstr("(and 4 more unhealthy)"));
  EXPECT_THAT(ranks.status().message(), HasSubstr("PCI 0000:07:00.0"));
}

TEST(AssignRanksTest, ErrorNoGpuSaysHowToFix) {
  auto ranks = AssignRanks({}, TwoNodes(), 4, 4, GpuAssignment::kShared,
                           "none (auto: nvml: cannot load; amd: no GPU)");
  ASSERT_FALSE(ranks.ok());
  EXPECT_EQ(ranks.status().code(), StatusCode::kFailedPrecondition);
  const std::string& m = ranks.status().message();
  EXPECT_THAT(m, HasSubstr("gpusPerNode is 4 but no GPU was found"));
  EXPECT_THAT(m, HasSubstr("(GPU backend: none (auto: nvml: cannot load; amd: no GPU))"));
  EXPECT_THAT(m, HasSubstr("--gpu-backend"));
  EXPECT_THAT(m, HasSubstr("set gpusPerNode: 0"));
  EXPECT_THAT(m, Not(HasSubstr("\n")));
}

TEST(AssignRanksTest, ErrorBadRankCounts) {
  EXPECT_EQ(AssignRanks(EightGpus(), TwoNodes(), 0, 0, GpuAssignment::kShared).status().code(),
            StatusCode::kInvalidArgument);
  auto mismatch = AssignRanks(EightGpus(), TwoNodes(), 2, 4, GpuAssignment::kShared);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_THAT(mismatch.status().message(), HasSubstr("local ranks (2) must equal gpusPerNode (4)"));
  EXPECT_FALSE(AssignRanks({}, CpuTopology{}, 1, 0, GpuAssignment::kShared).ok());
}

TEST(DeviceEnvironmentTest, NvidiaSharedAndExclusive) {
  auto shared = AssignRanks(EightGpus(), TwoNodes(), 8, 8, GpuAssignment::kShared);
  ASSERT_TRUE(shared.ok());
  auto env = DeviceEnvironment((*shared)[2]);
  EXPECT_EQ(env.size(), 3u);
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "GPU-07,GPU-0f,GPU-47,GPU-4e,GPU-87,GPU-90,GPU-b7,GPU-bd");
  EXPECT_EQ(env["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
  EXPECT_EQ(env["SPAWNPOINT_DEVICE_ORDINAL"], "2");

  auto exclusive = AssignRanks(EightGpus(), TwoNodes(), 8, 8, GpuAssignment::kExclusive);
  ASSERT_TRUE(exclusive.ok());
  auto one = DeviceEnvironment((*exclusive)[5]);
  EXPECT_EQ(one["CUDA_VISIBLE_DEVICES"], "GPU-90");
  EXPECT_EQ(one["SPAWNPOINT_DEVICE_ORDINAL"], "0");
  EXPECT_EQ(one.count("HIP_VISIBLE_DEVICES"), 0u);
}

TEST(DeviceEnvironmentTest, AmdUsesRocrIndicesAndHipOrdinalsOverThem) {
  std::vector<GpuDevice> gpus = {Gpu(3, "0000:c1:00.0", 1, "amd"), Gpu(1, "0000:11:00.0", 0, "amd"),
                                 Gpu(0, "0000:21:00.0", 0, "amd")};
  auto shared = AssignRanks(gpus, TwoNodes(), 3, 3, GpuAssignment::kShared);
  ASSERT_TRUE(shared.ok());
  auto env = DeviceEnvironment((*shared)[1]);
  EXPECT_EQ(env.size(), 3u);
  EXPECT_EQ(env["ROCR_VISIBLE_DEVICES"], "1,0,3");
  EXPECT_EQ(env["HIP_VISIBLE_DEVICES"], "0,1,2");
  EXPECT_EQ(env["SPAWNPOINT_DEVICE_ORDINAL"], "1");
  EXPECT_EQ(env.count("CUDA_VISIBLE_DEVICES"), 0u);

  auto exclusive = AssignRanks(gpus, TwoNodes(), 3, 3, GpuAssignment::kExclusive);
  ASSERT_TRUE(exclusive.ok());
  auto one = DeviceEnvironment((*exclusive)[2]);
  EXPECT_EQ(one["ROCR_VISIBLE_DEVICES"], "3");
  EXPECT_EQ(one["HIP_VISIBLE_DEVICES"], "0");
  EXPECT_EQ(one["SPAWNPOINT_DEVICE_ORDINAL"], "0");
}

TEST(DeviceEnvironmentTest, CpuRanksSetNothing) {
  auto ranks = AssignRanks({}, TwoNodes(), 2, 0, GpuAssignment::kShared);
  ASSERT_TRUE(ranks.ok());
  EXPECT_TRUE(DeviceEnvironment((*ranks)[0]).empty());
}

}  // namespace
}  // namespace spawnpoint::devices
