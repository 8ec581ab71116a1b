// The local multi-node mode's node agents: each one's argv is ToArgs of its options, and
// those options are the parent's with this node's identity, the in-place gang on loopback
// with a token file only this user reads, and a termination log the parent reads back.
#include "agent/run/local_cluster.h"

#include <sys/stat.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/run/node_facts.h"

namespace spawnpoint::agent {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(LocalClusterTest, NodeAgentsRunThisProgramWithTheirOwnIdentity) {
  auto jobs = api::ParseTrainingJobs(
      "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: pair\n"
      "spec:\n  nodes: 2\n  procsPerNode: 1\n"
      "  template:\n    spec:\n      containers:\n      - name: trainer\n"
      "        image: test\n        command: [\"/bin/true\"]\n",
      "pair.yaml");
  ASSERT_TRUE(jobs.ok()) << jobs.status().message();
  auto parent =
      ParseAgentArgs({"run", "-f", "pair.yaml", "--status-file", "/tmp/s.json", "--metrics-addr",
                      "127.0.0.1:9500", "--grace-period", "1.5", "--gpu-backend", "none"});
  ASSERT_TRUE(parent.ok()) << parent.status().message();
  auto node = DiscoverNode(*parent, jobs->front(), devices::NoGpuBackend());
  ASSERT_TRUE(node.ok()) << node.status().message();
  auto cluster = LocalCluster::Create(*parent, *node, 2, 29555);
  ASSERT_TRUE(cluster.ok()) << cluster.status().message();

  std::vector<GangMember> members = (*cluster)->MembersFor(3);
  ASSERT_EQ(members.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const std::vector<std::string>& argv = members[i].spawn.argv;
    ASSERT_FALSE(argv.empty());
    auto child = ParseAgentArgs(std::vector<std::string>(argv.begin() + 1, argv.end()));
    ASSERT_TRUE(child.ok()) << child.status().message();
    EXPECT_TRUE(*child == (*cluster)->NodeOptions(i, 3));
    EXPECT_EQ(child->node_rank, i);
    EXPECT_EQ(child->nnodes, 2);
    EXPECT_EQ(child->master_addr, "127.0.0.1");
    EXPECT_EQ(child->master_port, 29555);
    EXPECT_EQ(child->max_restarts, -1) << "the job's budget: node 0's agent spends it";
    EXPECT_EQ(child->restart_count, 3);
    EXPECT_EQ(child->grace_period, std::chrono::milliseconds(1500));
    EXPECT_THAT(child->gang_addr, StartsWith("127.0.0.1:"));
    EXPECT_EQ(child->gang_addr, (*cluster)->NodeOptions(0, 3).gang_addr) << "one gang";
    EXPECT_NE(child->status_file, "/tmp/s.json") << "the parent writes the user's status file";
    struct stat st {};
    ASSERT_EQ(::stat(child->gang_token_file.c_str(), &st), 0) << child->gang_token_file;
    EXPECT_EQ(st.st_mode & 0077, 0u) << "the token is this user's alone";
    EXPECT_GE(st.st_size, 32);
    EXPECT_EQ(child->metrics_addr, "127.0.0.1:" + std::to_string(9500 + i));
    EXPECT_TRUE(child->termination_log_explicit);
    EXPECT_THAT(child->termination_log, HasSubstr("node-" + std::to_string(i) + ".json"));
    EXPECT_EQ(members[i].label, "node " + std::to_string(i));
    EXPECT_FALSE(members[i].prefix_output);
  }
  EXPECT_THAT(members[0].spawn.argv[0], StartsWith("/"));
}

}  // namespace
}  // namespace spawnpoint::agent
