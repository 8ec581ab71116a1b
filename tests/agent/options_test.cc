#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/cli/options.h"

namespace spawnpoint::agent {
namespace {

using ::testing::HasSubstr;

TEST(AgentOptionsTest, ParsesRunFlags) {
  auto o = ParseAgentArgs({"run", "-f", "job.yaml", "--node-rank", "1", "--nnodes=2",
                           "--master-addr", "10.0.0.1", "--master-port", "29501", "--grace-period",
                           "2.5", "--gpu-backend", "none"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->command, AgentCommand::kRun);
  EXPECT_EQ(o->file, "job.yaml");
  EXPECT_EQ(o->node_rank, 1);
  EXPECT_EQ(o->nnodes, 2);
  EXPECT_EQ(o->master_addr, "10.0.0.1");
  EXPECT_EQ(o->master_port, 29501);
  EXPECT_EQ(o->grace_period, std::chrono::milliseconds(2500));
  EXPECT_EQ(o->gpu_backend, "none");
}

TEST(AgentOptionsTest, RejectsBadFlagsWithTheFlagNamed) {
  auto unknown = ParseAgentArgs({"run", "-f", "x", "--nodes", "2"});
  EXPECT_THAT(unknown.status().message(), HasSubstr("unknown flag \"--nodes\""));
  auto port = ParseAgentArgs({"run", "-f", "x", "--master-port", "70000"});
  EXPECT_THAT(port.status().message(), HasSubstr("--master-port: expected an integer in 0..65535"));
  auto backend = ParseAgentArgs({"plan", "-f", "x", "--gpu-backend", "cuda"});
  EXPECT_THAT(backend.status().message(), HasSubstr("expected auto, nvml, amd or none"));
  auto missing = ParseAgentArgs({"run"});
  EXPECT_THAT(missing.status().message(), HasSubstr("-f FILE is required"));
  auto rank = ParseAgentArgs({"run", "-f", "x", "--node-rank", "2", "--nnodes", "2"});
  EXPECT_THAT(rank.status().message(), HasSubstr("--node-rank 2 must be below --nnodes 2"));
  auto cmd = ParseAgentArgs({"launch"});
  EXPECT_THAT(cmd.status().message(), HasSubstr("unknown command \"launch\""));
  auto value = ParseAgentArgs({"run", "-f"});
  EXPECT_THAT(value.status().message(), HasSubstr("-f: missing value"));
}

TEST(AgentOptionsTest, TheManifestMayComeWithoutDashF) {
  for (const auto& args :
       std::vector<std::vector<std::string>>{{"run", "job.yaml", "--gpu-backend", "none"},
                                             {"plan", "--gpu-backend", "none", "job.yaml"}}) {
    auto o = ParseAgentArgs(args);
    ASSERT_TRUE(o.ok()) << o.status().message();
    EXPECT_EQ(o->file, "job.yaml");
    EXPECT_EQ(o->gpu_backend, "none");
  }
  auto twice = ParseAgentArgs({"run", "-f", "a.yaml", "b.yaml"});
  EXPECT_THAT(twice.status().message(),
              HasSubstr("two manifests for run: \"a.yaml\" and \"b.yaml\""));
  auto env = ParseAgentArgs({"run", "job.yaml", "--job-env", "SPAWNPOINT_JOB"});
  EXPECT_THAT(env.status().message(), HasSubstr("either -f FILE or --job-env VAR, not both"));
}

TEST(AgentOptionsTest, JobEnvReplacesTheFile) {
  auto o = ParseAgentArgs({"run", "--job-env", "SPAWNPOINT_JOB", "--node-rank", "0"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->job_env, "SPAWNPOINT_JOB");
  EXPECT_TRUE(o->file.empty());
  auto both = ParseAgentArgs({"run", "-f", "job.yaml", "--job-env", "SPAWNPOINT_JOB"});
  EXPECT_THAT(both.status().message(), HasSubstr("either -f FILE or --job-env VAR, not both"));
  auto value = ParseAgentArgs({"run", "--job-env"});
  EXPECT_THAT(value.status().message(), HasSubstr("--job-env: missing value"));
}

// `torchrun`: the agent's own flags first, then torchrun's command line as given; the
// flags torchrun has too (--nnodes, --master-port, ...) are torchrun's there.
TEST(AgentOptionsTest, TorchrunTakesTheAgentsFlagsThenTorchrunsCommandLine) {
  auto o = ParseAgentArgs({"torchrun", "--status-file", "/tmp/s.json", "--spec",
                           "loader.workersPerRank=2", "--job=exp", "--nproc_per_node", "2",
                           "--nnodes", "1", "train.py", "--status-file", "x"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->command, AgentCommand::kRun);
  EXPECT_EQ(o->status_file, "/tmp/s.json");
  EXPECT_EQ(o->job_name, "exp");
  EXPECT_EQ(o->spec_sets, std::vector<std::string>{"loader.workersPerRank=2"});
  EXPECT_EQ(o->torchrun, (std::vector<std::string>{"--nproc_per_node", "2", "--nnodes", "1",
                                                   "train.py", "--status-file", "x"}));
  EXPECT_EQ(o->nnodes, 0);

  auto plan = ParseAgentArgs({"torchrun", "--plan", "--master-port", "0", "train.py"});
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->command, AgentCommand::kPlan);
  EXPECT_EQ(plan->master_port, -1);
  EXPECT_EQ(plan->torchrun, (std::vector<std::string>{"--master-port", "0", "train.py"}));
  auto script_first = ParseAgentArgs({"torchrun", "train.py", "--plan"});
  ASSERT_TRUE(script_first.ok()) << script_first.status().message();
  EXPECT_EQ(script_first->command, AgentCommand::kRun);
  EXPECT_EQ(script_first->torchrun, (std::vector<std::string>{"train.py", "--plan"}));
  EXPECT_EQ(ParseAgentArgs({"torchrun", "--help", "train.py"})->command, AgentCommand::kHelp);
}

TEST(AgentOptionsTest, TorchrunRefusesWhatHasNoPlaceThere) {
  EXPECT_THAT(ParseAgentArgs({"torchrun"}).status().message(),
              HasSubstr("torchrun: expected torchrun's flags and the script"));
  EXPECT_THAT(ParseAgentArgs({"torchrun", "--plan"}).status().message(),
              HasSubstr("torchrun: expected torchrun's flags and the script"));
  EXPECT_THAT(ParseAgentArgs({"torchrun", "-f", "job.yaml", "train.py"}).status().message(),
              HasSubstr("-f: torchrun makes the job from torchrun's flags, without a manifest"));
  EXPECT_THAT(ParseAgentArgs({"torchrun", "--gang", "h:1", "train.py"}).status().message(),
              HasSubstr("--gang needs --gang-token-file"));
  EXPECT_THAT(ParseAgentArgs({"run", "-f", "x", "--spec", "a=1"}).status().message(),
              HasSubstr("--spec is for torchrun"));
  EXPECT_THAT(ParseAgentArgs({"run", "-f", "x", "--plan"}).status().message(),
              HasSubstr("unknown flag \"--plan\" for run"));
}

TEST(AgentOptionsTest, TorchrunAgentFlagsAreTheAgentsOwnOnly) {
  EXPECT_TRUE(IsTorchrunAgentFlag("--status-file"));
  EXPECT_TRUE(IsTorchrunAgentFlag("--metrics-addr=:9400"));
  EXPECT_TRUE(IsTorchrunAgentFlag("--spec"));
  EXPECT_TRUE(IsTorchrunAgentFlag("--full-env"));
  EXPECT_FALSE(IsTorchrunAgentFlag("--master-port"));
  EXPECT_FALSE(IsTorchrunAgentFlag("--nnodes=2"));
  EXPECT_FALSE(IsTorchrunAgentFlag("-f"));
  EXPECT_FALSE(IsTorchrunAgentFlag("--nproc_per_node"));
  EXPECT_FALSE(IsTorchrunAgentFlag("train.py"));
}

// ToArgs is how the local multi-node mode starts its node agents: parsing its output must
// give back exactly the options it was given.
TEST(AgentOptionsTest, ToArgsRoundTripsThroughParseAgentArgs) {
  std::vector<AgentOptions> cases;
  auto parsed = [&](std::vector<std::string> args) {
    auto o = ParseAgentArgs(args);
    ASSERT_TRUE(o.ok()) << o.status().message();
    cases.push_back(*o);
  };
  parsed({"run", "-f", "job.yaml"});
  parsed({"plan", "--job-env", "SPAWNPOINT_JOB", "--full-env", "--job", "b"});
  parsed({"run",
          "-f",
          "job.yaml",
          "--node-rank",
          "1",
          "--nnodes",
          "3",
          "--master-addr",
          "10.0.0.1",
          "--master-port",
          "0",
          "--restart-count",
          "2",
          "--max-restarts",
          "0",
          "--grace-period",
          "2.345",
          "--status-interval",
          "0.2",
          "--status-file",
          "/tmp/s.json",
          "--termination-log",
          "/tmp/node-1.json",
          "--gpu-backend",
          "none",
          "--nvml-library",
          "/opt/libnvidia-ml.so.1",
          "--sysfs-root",
          "/tmp/sys",
          "--shm-path",
          "/tmp/shm",
          "--cgroup-memory-events",
          "/tmp/memory.events",
          "--metrics-addr",
          "127.0.0.1:9401",
          "--dcgm-compatible-names"});
  parsed(
      {"run", "-f", "job.yaml", "--metrics-addr", "", "--termination-log", "/dev/termination-log"});
  parsed({"run", "-f", "job.yaml", "--metrics-addr", "off", "--grace-period", "0"});
  parsed({"version"});
  parsed({"help"});
  parsed({"torchrun", "train.py"});
  parsed({"torchrun",
          "--plan",
          "--job",
          "exp",
          "--spec",
          "loader.workersPerRank=2",
          "--spec=stallPolicy.timeoutSeconds=30",
          "--metrics-addr",
          "off",
          "--status-file",
          "/tmp/s.json",
          "--gang",
          "node0:29401",
          "--gang-token-file",
          "/tmp/token",
          "--full-env",
          "--nproc_per_node=2",
          "--master-port",
          "0",
          "--",
          "train.py",
          "--status-file",
          "x"});
  ASSERT_EQ(cases.size(), 9u);
  for (const AgentOptions& o : cases) {
    std::vector<std::string> args = ToArgs(o);
    auto back = ParseAgentArgs(args);
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_TRUE(*back == o) << ::testing::PrintToString(args);
  }
}

TEST(AgentOptionsTest, ToArgsWritesOnlyWhatDiffersFromTheDefaults) {
  AgentOptions o;
  o.command = AgentCommand::kRun;
  o.file = "job.yaml";
  o.grace_period = std::chrono::milliseconds(2500);
  EXPECT_EQ(ToArgs(o),
            (std::vector<std::string>{"run", "--file", "job.yaml", "--grace-period", "2.500"}));
  AgentOptions t;
  t.command = AgentCommand::kPlan;
  t.torchrun = {"--nproc_per_node", "2", "train.py"};
  t.spec_sets = {"loader.workersPerRank=2"};
  EXPECT_EQ(ToArgs(t),
            (std::vector<std::string>{"torchrun", "--plan", "--spec", "loader.workersPerRank=2",
                                      "--nproc_per_node", "2", "train.py"}));
}

// --help states the exit-code table (agent/run/exit_codes.h) and where the status
// document is described.
TEST(AgentUsageTest, ShowsTheExitCodesAndTheStatusDocument) {
  const std::string usage = AgentUsage();
  EXPECT_THAT(usage, HasSubstr("--status-file PATH         also write the status document"));
  EXPECT_THAT(usage, HasSubstr("docs/status.md"));
  EXPECT_THAT(usage, HasSubstr("exit codes:"));
  EXPECT_THAT(usage, HasSubstr("  2      bad input"));
  EXPECT_THAT(usage, HasSubstr("  1      the job failed"));
  EXPECT_THAT(usage, HasSubstr("  128+N  the agent itself was stopped by signal N"));
}

}  // namespace
}  // namespace spawnpoint::agent
