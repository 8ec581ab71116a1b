// The real example DDP trainer under the agent: ranks rendezvous, train and agree on the
// parameters, across local nodes and across a gang restart.
#include <regex>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/support/test_process.h"

namespace spawnpoint::testing {
namespace {

using ::testing::HasSubstr;

std::string TrainerJob(int nodes, int ranks, const std::string& args, int max_restarts) {
  return "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: ddp}\n"
         "spec:\n  nodes: " + std::to_string(nodes) + "\n  procsPerNode: " + std::to_string(ranks) +
         "\n  shmSize: 64Mi\n  loader: {workersPerRank: 0}\n"
         "  restartPolicy: {maxRestarts: " + std::to_string(max_restarts) +
         ", backoffSeconds: 0}\n"
         "  template:\n    spec:\n      containers:\n      - name: trainer\n        image: x\n"
         "        command: [\"" TRAINER_BIN "\"]\n        args: [" + args + "]\n";
}

// rank -> params hash from the "final rank=R loss=L params=HEX" lines.
std::map<int, std::string> Finals(const std::string& out) {
  std::map<int, std::string> finals;
  std::regex re(R"(final rank=(\d+) loss=[0-9.]+ params=([0-9a-f]{16}))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it) {
    finals[std::stoi((*it)[1])] = (*it)[2];
  }
  return finals;
}

std::set<std::string> Distinct(const std::map<int, std::string>& finals) {
  std::set<std::string> s;
  for (auto& [r, h] : finals) s.insert(h);
  return s;
}

TEST(AgentTrainerTest, TwoLocalNodesOfTwoRanksTrainToTheSameParameters) {
  TempDir dir;
  WriteFile(dir.File("job.yaml"),
            TrainerJob(2, 2, "--epochs, '2', --steps-per-epoch, '20'", 0));
  TestProcess agent({AGENT_BIN, "run", "-f", dir.File("job.yaml"), "--master-port", "0"});
  ASSERT_EQ(agent.Wait(std::chrono::milliseconds(120'000)), 0) << agent.Stderr() << agent.Stdout();
  auto finals = Finals(agent.Stdout());
  ASSERT_EQ(finals.size(), 4u) << agent.Stdout();
  EXPECT_EQ(Distinct(finals).size(), 1u) << agent.Stdout();
  EXPECT_THAT(agent.Stdout(), HasSubstr("[rank 3] final rank=3"));
}

TEST(AgentTrainerTest, ARankKilledMidTrainingRestartsTheGangWhichFinishes) {
  TempDir dir;
  WriteFile(dir.File("job.yaml"),
            TrainerJob(1, 2,
                       "--epochs, '2', --steps-per-epoch, '20', --fail-at-step, '15', "
                       "--fail-rank, '1', --fail-signal, '9'",
                       2));
  TestProcess agent({AGENT_BIN, "run", "-f", dir.File("job.yaml"), "--master-port", "0"});
  ASSERT_EQ(agent.Wait(std::chrono::milliseconds(120'000)), 0) << agent.Stderr() << agent.Stdout();
  EXPECT_THAT(agent.Stderr(), HasSubstr("restart 1 of 2"));
  EXPECT_THAT(agent.Stderr(), HasSubstr("rank 1 (local rank 1, node 0"));
  EXPECT_THAT(agent.Stderr(), HasSubstr("all ranks succeeded, restarts 1"));
  EXPECT_THAT(agent.Stdout(), HasSubstr("restart=1"));
  auto finals = Finals(agent.Stdout());
  ASSERT_EQ(finals.size(), 2u) << agent.Stdout();
  EXPECT_EQ(Distinct(finals).size(), 1u);
}

}  // namespace
}  // namespace spawnpoint::testing
