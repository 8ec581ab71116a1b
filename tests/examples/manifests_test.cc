// The example manifests are what a new user runs first: they must stay valid against the
// API and pass the example trainer flags it accepts.
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "api/training_job.h"
#include "examples/ddp-trainer/config.h"

namespace {

struct Expect {
  const char* file;
  const char* name;
  int nodes;
  int ranks_per_node;
};

void PrintTo(const Expect& e, std::ostream* os) { *os << e.file; }

class ExampleManifest : public testing::TestWithParam<Expect> {};

TEST_P(ExampleManifest, IsValidAndRunsTheExampleTrainer) {
  const Expect& want = GetParam();
  auto jobs = spawnpoint::api::LoadTrainingJobsFile(std::string(SPAWNPOINT_SOURCE_DIR) +
                                                    "/examples/" + want.file);
  ASSERT_TRUE(jobs.ok()) << jobs.status().ToString();
  ASSERT_EQ(jobs->size(), 1u);
  const auto& job = jobs->front();
  EXPECT_EQ(job.name, want.name);
  EXPECT_EQ(job.spec.nodes, want.nodes);
  EXPECT_EQ(spawnpoint::api::RanksPerNode(job.spec), want.ranks_per_node);
  EXPECT_EQ(job.spec.gpus_per_node, 0);
  EXPECT_EQ(spawnpoint::api::EffectiveBackend(job.spec), spawnpoint::api::Backend::kGloo);
  // Relative to the repository root, where `make demo` runs the agent.
  ASSERT_EQ(job.spec.trainer.command,
            std::vector<std::string>{"build/bin/spawnpoint-example-trainer"});
  // The demo shows the agent-owned loader pool: one spawned worker per rank.
  EXPECT_EQ(job.spec.loader.workers_per_rank, 1);
  EXPECT_TRUE(job.spec.loader.worker_command.empty());  // the trainer itself, in worker mode
  auto flags = spawnpoint::trainer::ParseFlags(job.spec.trainer.args);
  ASSERT_TRUE(flags.ok()) << flags.status().ToString();
  EXPECT_FALSE(flags->help);
  EXPECT_LT(flags->fail_at_step, 0);
}

INSTANTIATE_TEST_SUITE_P(Examples, ExampleManifest,
                         testing::Values(Expect{"local-cpu.yaml", "local-cpu", 1, 2},
                                         Expect{"local-2node.yaml", "local-2node", 2, 1}),
                         [](const testing::TestParamInfo<Expect>& info) {
                           return std::string(info.param.nodes == 1 ? "LocalCpu" : "Local2Node");
                         });

}  // namespace
