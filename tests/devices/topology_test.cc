#include <algorithm>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/devices/topology.h"
#include "tests/fakes/fake_sysfs.h"

namespace spawnpoint::devices {
namespace {

using ::testing::ElementsAre;
using testing::FakeSysfs;
using ::testing::HasSubstr;

std::vector<int> Range(int lo, int hi) {
  std::vector<int> v;
  for (int i = lo; i <= hi; ++i) v.push_back(i);
  return v;
}

TEST(CpuListTest, ParsesRangesAndSingles) {
  auto cpus = ParseCpuList("0-3,8-11\n");
  ASSERT_TRUE(cpus.ok());
  EXPECT_THAT(*cpus, ElementsAre(0, 1, 2, 3, 8, 9, 10, 11));
  EXPECT_THAT(*ParseCpuList("5"), ElementsAre(5));
  EXPECT_THAT(*ParseCpuList("7,1-2,2"), ElementsAre(1, 2, 7));
  EXPECT_TRUE(ParseCpuList("").value().empty());
  EXPECT_TRUE(ParseCpuList("\n").value().empty());
}

TEST(CpuListTest, RejectsMalformed) {
  for (const char* bad : {"3-1", "a", "1,,2", "1-", "-1", "0-3:2"}) {
    auto cpus = ParseCpuList(bad);
    EXPECT_FALSE(cpus.ok()) << bad;
    EXPECT_EQ(cpus.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(ParseCpuList("0-3,x").status().message(), HasSubstr("at 'x'"));
}

TEST(CpuTopologyTest, ReadsNodesRestrictedToAllowedCpus) {
  FakeSysfs sys;
  sys.AddNumaNode(1, "16-31");
  sys.AddNumaNode(0, "0-15");
  auto topo = ReadCpuTopology(sys.sysfs_root(), Range(0, 31));
  ASSERT_TRUE(topo.ok()) << topo.status().ToString();
  ASSERT_EQ(topo->nodes.size(), 2u);
  EXPECT_EQ(topo->nodes[0].id, 0);
  EXPECT_EQ(topo->nodes[0].cpus, Range(0, 15));
  EXPECT_EQ(topo->nodes[1].id, 1);
  EXPECT_EQ(topo->nodes[1].cpus, Range(16, 31));
  EXPECT_EQ(topo->AllCpus(), Range(0, 31));
  EXPECT_EQ(topo->NodeOf(17), 1);
  EXPECT_EQ(topo->NodeOf(99), -1);

  auto cpuset = ReadCpuTopology(sys.sysfs_root(), {20, 2, 3});
  ASSERT_TRUE(cpuset.ok());
  ASSERT_EQ(cpuset->nodes.size(), 2u);
  EXPECT_THAT(cpuset->nodes[0].cpus, ElementsAre(2, 3));
  EXPECT_THAT(cpuset->nodes[1].cpus, ElementsAre(20));

  auto one_node = ReadCpuTopology(sys.sysfs_root(), {16, 17});
  ASSERT_TRUE(one_node.ok());
  ASSERT_EQ(one_node->nodes.size(), 1u);
  EXPECT_EQ(one_node->nodes[0].id, 1);
  EXPECT_EQ(one_node->Node(0), nullptr);
}

TEST(CpuTopologyTest, WithoutNumaInfoOneNodeHoldsAllAllowedCpus) {
  FakeSysfs sys;
  auto topo = ReadCpuTopology(sys.sysfs_root(), {0, 1, 2, 5});
  ASSERT_TRUE(topo.ok());
  ASSERT_EQ(topo->nodes.size(), 1u);
  EXPECT_EQ(topo->nodes[0].id, 0);
  EXPECT_THAT(topo->nodes[0].cpus, ElementsAre(0, 1, 2, 5));
}

TEST(CpuTopologyTest, UnlistedAllowedCpuJoinsFirstNode) {
  FakeSysfs sys;
  sys.AddNumaNode(0, "0-1");
  sys.AddNumaNode(1, "2-3");
  auto topo = ReadCpuTopology(sys.sysfs_root(), {0, 3, 9});
  ASSERT_TRUE(topo.ok());
  ASSERT_EQ(topo->nodes.size(), 2u);
  EXPECT_THAT(topo->nodes[0].cpus, ElementsAre(0, 9));
  EXPECT_THAT(topo->nodes[1].cpus, ElementsAre(3));
}

TEST(CpuTopologyTest, Errors) {
  FakeSysfs sys;
  EXPECT_EQ(ReadCpuTopology(sys.sysfs_root(), {}).status().code(), StatusCode::kFailedPrecondition);
  sys.AddNumaNode(0, "0-x");
  auto bad = ReadCpuTopology(sys.sysfs_root(), {0});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("node0/cpulist"));
  EXPECT_THAT(bad.status().message(), HasSubstr("bad cpulist '0-x'"));
}

TEST(CpuTopologyTest, AllowedCpusOfThisProcess) {
  std::vector<int> cpus = AllowedCpus();
  ASSERT_FALSE(cpus.empty());
  EXPECT_TRUE(std::is_sorted(cpus.begin(), cpus.end()));
  // And the real sysfs of this machine parses.
  auto topo = ReadCpuTopology("/sys", cpus);
  ASSERT_TRUE(topo.ok()) << topo.status().ToString();
  EXPECT_EQ(topo->AllCpus().size(), cpus.size());
}

}  // namespace
}  // namespace spawnpoint::devices
