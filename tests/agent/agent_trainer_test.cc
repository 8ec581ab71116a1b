// The real example DDP trainer under the agent: ranks rendezvous, train and agree on the
// parameters, across local nodes and across a gang restart.
#include <regex>
#include <set>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/support/test_process.h"

namespace spawnpoint::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string TrainerJob(int nodes, int ranks, const std::string& args, int max_restarts,
                       int workers = 0) {
  return "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: ddp}\n"
         "spec:\n  nodes: " +
         std::to_string(nodes) + "\n  procsPerNode: " + std::to_string(ranks) +
         "\n  shmSize: 256Mi\n  loader: {workersPerRank: " + std::to_string(workers) +
         "}\n"
         "  restartPolicy: {maxRestarts: " +
         std::to_string(max_restarts) +
         ", backoffSeconds: 0}\n"
         "  template:\n    spec:\n      containers:\n      - name: trainer\n        image: x\n"
         "        command: [\"" TRAINER_BIN "\"]\n        args: [" +
         args + "]\n";
}

// rank -> params hash from the "final rank=R loss=L params=HEX" lines.
std::map<int, std::string> Finals(const std::string& out) {
  std::map<int, std::string> finals;
  std::regex re(R"(final rank=(\d+) loss=[0-9.]+ params=([0-9a-f]{16}))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it) {
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
  WriteFile(dir.File("job.yaml"), TrainerJob(2, 2, "--epochs, '2', --steps-per-epoch, '20'", 0));
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

TEST(AgentTrainerTest, AgentOwnedLoaderWorkersPersistAcrossEpochsAndRankRestarts) {
  TempDir dir;
  // Rank 1 dies in epoch 1 of attempt 0; the gang restarts and trains again from epoch 0.
  WriteFile(dir.File("job.yaml"),
            TrainerJob(1, 2,
                       "--epochs, '3', --steps-per-epoch, '10', --decode-passes, '2', "
                       "--fail-at-step, '15', --fail-rank, '1', --fail-signal, '9'",
                       1, /*workers=*/2));
  TestProcess agent({AGENT_BIN, "run", "-f", dir.File("job.yaml"), "--master-port", "0",
                     "--status-file", dir.File("status.json")});
  ASSERT_EQ(agent.Wait(std::chrono::milliseconds(120'000)), 0) << agent.Stderr() << agent.Stdout();
  EXPECT_THAT(agent.Stderr(), HasSubstr("2 loader pools of 2 workers started"));
  // The status document carries each rank's loader statistics, as the operator will read.
  auto status = nlohmann::json::parse(ReadFile(dir.File("status.json")));
  EXPECT_EQ(status["phase"], "Succeeded");
  EXPECT_EQ(status["restarts"], 1);
  ASSERT_EQ(status["loader"].size(), 2u);
  for (const auto& rank : status["loader"]) {
    EXPECT_EQ(rank["stats"]["poolWorkers"], 2) << status.dump();
    EXPECT_GT(rank["stats"]["batches"].get<int>(), 0) << status.dump();
    EXPECT_TRUE(rank["stats"].contains("dataStall"));
    EXPECT_EQ(rank["pool"]["workers"].size(), 2u);
  }
  EXPECT_THAT(agent.Stderr(), HasSubstr("restart 1 of 1"));
  const std::string out = agent.Stdout();
  std::regex re(R"(loader rank=(\d+) epoch=(\d+) restart=(\d+) worker_pids=([0-9,]+))");
  std::map<int, std::set<std::string>> pids_by_rank;
  std::map<int, std::set<int>> restarts_seen;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it) {
    int rank = std::stoi((*it)[1]);
    if ((*it)[2] == "0" && (*it)[3] == "0") continue;  // workers may still be saying hello
    pids_by_rank[rank].insert((*it)[4]);
    restarts_seen[rank].insert(std::stoi((*it)[3]));
  }
  ASSERT_EQ(pids_by_rank.size(), 2u) << out;
  for (auto& [rank, pids] : pids_by_rank) {
    EXPECT_EQ(pids.size(), 1u) << "rank " << rank << " saw different worker pids: " << out;
    EXPECT_EQ(restarts_seen[rank], (std::set<int>{0, 1})) << out;
    EXPECT_THAT(*pids.begin(), Not(HasSubstr(",0"))) << out;
  }
  EXPECT_NE(*pids_by_rank[0].begin(), *pids_by_rank[1].begin());  // a pool per rank
  // The pools end with the job: no worker outlives the agent.
  for (auto& [rank, pids] : pids_by_rank) {
    std::stringstream list(*pids.begin());
    for (std::string pid; std::getline(list, pid, ',');) {
      EXPECT_FALSE(ProcessExists(std::stoi(pid))) << "worker " << pid << " of rank " << rank;
    }
  }
  auto finals = Finals(out);
  ASSERT_EQ(finals.size(), 2u) << out;
  EXPECT_EQ(Distinct(finals).size(), 1u);
}

}  // namespace
}  // namespace spawnpoint::testing
