// `spawnpoint-agent torchrun`'s job: torchrun's flags on a machine of given GPUs and CPUs
// become a TrainingJob, each flag honoured as torchrun means it, refused naming the flag, or
// listed as ignored with the decision a manifest's command gets.
#include "api/torchrun_job.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace spawnpoint::api {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using Args = std::vector<std::string>;

constexpr TorchrunMachine kCpuBox{.gpus = 0, .cpus = 4};
constexpr TorchrunMachine kGpuBox{.gpus = 4, .cpus = 32};

TorchrunJob Build(const Args& args, const TorchrunMachine& machine = kCpuBox,
                  const std::vector<std::string>& spec_sets = {}, const std::string& name = "") {
  size_t bad = 99;
  auto built = TorchrunJobFromCommandLine({.args = args, .name = name, .spec_sets = spec_sets},
                                          machine, &bad);
  EXPECT_TRUE(built.ok()) << built.status().message() << " at " << bad;
  return built.ok() ? *built : TorchrunJob{};
}

// The error and the element of args it names.
std::pair<std::string, size_t> Error(const Args& args, const TorchrunMachine& machine = kCpuBox,
                                     const std::vector<std::string>& spec_sets = {},
                                     const std::string& name = "") {
  size_t bad = 99;
  auto built = TorchrunJobFromCommandLine({.args = args, .name = name, .spec_sets = spec_sets},
                                          machine, &bad);
  EXPECT_FALSE(built.ok()) << built->summary;
  return {built.ok() ? "" : built.status().message(), bad};
}

// The effect the job's launch records for the flag written `written`.
std::string Effect(const TorchrunJob& built, const std::string& written) {
  for (const TorchrunFlag& f : built.job.spec.trainer.torchrun->flags) {
    if (f.written == written) return f.effect;
  }
  return "<absent>";
}

TEST(TorchrunCommandLineTest, ANumberOfRanksOnACpuMachineRunsTheScriptWithItsArguments) {
  TorchrunJob b = Build({"--nproc_per_node", "2", "train.py", "--flag", "x"});
  const TrainingJobSpec& s = b.job.spec;
  EXPECT_EQ(b.job.name, "train");
  EXPECT_EQ(s.nodes, 1);
  EXPECT_EQ(s.gpus_per_node, 0);
  EXPECT_EQ(s.procs_per_node, 2);
  EXPECT_EQ(EffectiveBackend(s), Backend::kGloo);
  EXPECT_THAT(s.trainer.command, ElementsAre("python3", "-u", "train.py", "--flag", "x"));
  EXPECT_THAT(Effect(b, "--nproc_per_node 2"), HasSubstr("taken: 2 ranks per node"));
  // torchrun's defaults: no restart; one node gets a free port (as --standalone does).
  EXPECT_EQ(s.restart_policy.max_restarts, 0);
  EXPECT_EQ(b.master_port, 0);
  EXPECT_EQ(b.node_rank, -1);
  EXPECT_EQ(b.master_addr, "");
  EXPECT_EQ(b.summary,
            "torchrun command line: 2 CPU ranks (--nproc_per_node 2), backend gloo, rendezvous "
            "on a free port, maxRestarts 0 (torchrun's default)");
  EXPECT_THAT(b.job.spec.trainer.torchrun->original,
              ElementsAre("torchrun", "--nproc_per_node", "2", "train.py", "--flag", "x"));
}

TEST(TorchrunCommandLineTest, RanksPerNodeFollowsTorchrunsMeaningsOnThisMachine) {
  // No flag: torchrun's default, one rank (a GPU of its own where there are GPUs).
  EXPECT_EQ(Build({"train.py"}).job.spec.procs_per_node, 1);
  EXPECT_EQ(Build({"train.py"}, kGpuBox).job.spec.gpus_per_node, 1);
  // A number: that many ranks, each with its own GPU on a GPU machine.
  EXPECT_EQ(Build({"--nproc-per-node=3", "train.py"}, kGpuBox).job.spec.gpus_per_node, 3);
  // gpu and auto with GPUs: one rank per GPU, NCCL.
  for (const char* v : {"gpu", "auto"}) {
    TorchrunJob b = Build({"--nproc_per_node", v, "train.py"}, kGpuBox);
    EXPECT_EQ(b.job.spec.gpus_per_node, 4) << v;
    EXPECT_EQ(EffectiveBackend(b.job.spec), Backend::kNccl) << v;
    EXPECT_THAT(b.summary, HasSubstr("4 ranks, one GPU each (--nproc_per_node " + std::string(v)));
  }
  // cpu, and auto without a GPU: one rank per CPU the agent may use, gloo.
  TorchrunJob cpu = Build({"--nproc_per_node=cpu", "train.py"}, kGpuBox);
  EXPECT_EQ(cpu.job.spec.gpus_per_node, 0);
  EXPECT_EQ(cpu.job.spec.procs_per_node, 32);
  TorchrunJob automatic = Build({"--nproc_per_node=auto", "train.py"});
  EXPECT_EQ(automatic.job.spec.procs_per_node, 4);
  EXPECT_EQ(EffectiveBackend(automatic.job.spec), Backend::kGloo);
  EXPECT_THAT(automatic.summary,
              HasSubstr("4 CPU ranks (--nproc_per_node=auto: no GPU found, one rank per CPU"));
  // The flag is shown as written, with what it became.
  EXPECT_THAT(Effect(automatic, "--nproc_per_node=auto"),
              HasSubstr("taken: 4 ranks per node (spec.procsPerNode) (auto: no GPU found"));
}

TEST(TorchrunCommandLineTest, RanksPerNodeThisMachineCannotGiveAreRefusedNamingTheFlag) {
  auto [no_gpu, at] = Error({"--standalone", "--nproc_per_node", "gpu", "train.py"});
  EXPECT_THAT(no_gpu, HasSubstr("torchrun's --nproc_per_node gpu asks for one rank per GPU, but "
                                "the agent found no GPU on this machine"));
  EXPECT_EQ(at, 2u);
  auto [too_many, at2] = Error({"--nproc_per_node=5", "train.py"}, kGpuBox);
  EXPECT_THAT(too_many, HasSubstr("torchrun's --nproc_per_node=5 asks for 5 ranks, but this "
                                  "machine has 4 GPUs"));
  EXPECT_THAT(too_many, HasSubstr("--gpu-backend none for CPU ranks"));
  EXPECT_EQ(at2, 0u);
  // What the manifest's rules refuse, the command line refuses with the same words.
  auto [xpu, at3] = Error({"--nproc_per_node", "xpu", "train.py"});
  EXPECT_EQ(xpu, "torchrun's --nproc_per_node xpu: must be a number >= 1, gpu, cpu or auto");
  EXPECT_EQ(at3, 1u);
}

TEST(TorchrunCommandLineTest, NodeRankMasterAddrAndPortAreTheAgentsOnEachMachine) {
  TorchrunJob b = Build({"--nnodes=2", "--node_rank", "1", "--master_addr=10.0.0.1",
                         "--master-port", "29400", "--nproc_per_node=2", "train.py"});
  EXPECT_EQ(b.job.spec.nodes, 2);
  EXPECT_EQ(b.node_rank, 1);
  EXPECT_EQ(b.master_addr, "10.0.0.1");
  EXPECT_EQ(b.master_port, -1);
  EXPECT_EQ(b.job.spec.rendezvous_port, 29400);
  EXPECT_EQ(Effect(b, "--node_rank 1"), "taken: this agent runs node 1");
  EXPECT_EQ(Effect(b, "--master_addr=10.0.0.1"),
            "taken: MASTER_ADDR, where the ranks meet (node 0)");
  EXPECT_THAT(Effect(b, "--master-port 29400"), HasSubstr("taken: 29400 MASTER_PORT"));
  EXPECT_THAT(b.summary, HasSubstr("rendezvous port 29400"));
  EXPECT_THAT(b.summary, HasSubstr("; node 1 of 2"));
  // Several nodes keep torchrun's 29500 (every machine must agree); --master_port 0 asks for
  // a free one.
  TorchrunJob two = Build({"--nnodes", "2", "--node_rank", "0", "train.py"});
  EXPECT_EQ(two.master_port, -1);
  EXPECT_EQ(two.job.spec.rendezvous_port, 29500);
  EXPECT_EQ(Build({"--master_port=0", "train.py"}).master_port, 0);
  TorchrunJob fixed = Build({"--master_port=29600", "train.py"});
  EXPECT_EQ(fixed.master_port, -1);
  EXPECT_EQ(fixed.job.spec.rendezvous_port, 29600);
}

TEST(TorchrunCommandLineTest, SeveralNodesWithoutANodeRankAreRefusedWithTheWayToRunThem) {
  auto [message, at] = Error({"--nnodes", "2", "--nproc_per_node", "2", "train.py"});
  EXPECT_THAT(message, HasSubstr("the job spans 2 nodes and --node_rank is not given"));
  EXPECT_THAT(message, HasSubstr("--node_rank (0 to 1) and --master_addr"));
  EXPECT_THAT(message, HasSubstr("spec.nodes: 2 and use `spawnpoint-agent run -f`"));
  auto [rank, at2] = Error({"--nnodes", "2", "--node_rank", "2", "train.py"});
  EXPECT_THAT(rank, HasSubstr("--node_rank 2 must be below the number of nodes, 2"));
  auto [rdzv, at3] = Error({"--nnodes=2", "--node_rank=1", "--rdzv_backend=c10d",
                            "--rdzv_endpoint=node0:29400", "train.py"});
  EXPECT_THAT(rdzv, HasSubstr("--rdzv_endpoint node0:29400 is torchrun's rendezvous, which the "
                              "agents do not run"));
  EXPECT_THAT(rdzv, HasSubstr("give --master_addr"));
  EXPECT_THAT(Error({"--nnodes=2", "--node_rank=0", "--master_port=0", "train.py"}).first,
              HasSubstr("with 2 nodes give every machine the same --master_port"));
  // Given node 0's address, the rendezvous flags are only ignored.
  TorchrunJob b = Build({"--nnodes=2", "--node_rank=1", "--rdzv_backend=c10d",
                         "--rdzv_endpoint=node0:29400", "--master_addr=node0", "train.py"});
  EXPECT_THAT(Effect(b, "--rdzv_endpoint=node0:29400"), HasSubstr("ignored: the agents form"));
}

TEST(TorchrunCommandLineTest, RefusalsNameTheFlagAndTheElement) {
  auto [elastic, at] = Error({"--nproc_per_node=2", "--nnodes=1:4", "train.py"});
  EXPECT_THAT(elastic, HasSubstr("torchrun's --nnodes=1:4 is an elastic range"));
  EXPECT_THAT(elastic, Not(HasSubstr("spec.template")));
  EXPECT_EQ(at, 1u);
  auto [standalone, at2] = Error({"--standalone", "--nnodes", "2", "train.py"});
  EXPECT_THAT(standalone, HasSubstr("torchrun's --nnodes 2 contradicts --standalone"));
  EXPECT_EQ(at2, 2u);
  auto [unknown, at3] = Error({"--nproc_per_node=2", "--frobnicate", "train.py"});
  EXPECT_THAT(unknown, HasSubstr("unknown torchrun option --frobnicate"));
  EXPECT_EQ(at3, 1u);
  auto [no_script, at4] = Error({"--nproc_per_node=2"});
  EXPECT_THAT(no_script, HasSubstr("torchrun is given no script to run"));
  auto [restarts, at5] = Error({"--max_restarts=-1", "train.py"});
  EXPECT_THAT(restarts, HasSubstr("torchrun's --max_restarts=-1: must be an integer from 0"));
  EXPECT_EQ(at5, 0u);
  auto [rank, at6] = Error({"--node_rank=x", "train.py"});
  EXPECT_THAT(rank, HasSubstr("torchrun's --node_rank=x: must be an integer >= 0"));
  EXPECT_EQ(at6, 0u);
}

// The flags the agent does not need are ignored with the reason a manifest's command gets,
// and listed once, in the line the agent says.
TEST(TorchrunCommandLineTest, IgnoredFlagsAreListedWithTheManifestsDecision) {
  const Args flags = {
      "--log_dir", "/tmp/logs", "--monitor_interval=1", "--start_method=fork", "--role", "trainer",
      "--tee",     "3",         "--local_addr=10.0.0.2"};
  Args args = flags;
  args.insert(args.end(), {"--nproc_per_node=2", "train.py"});
  TorchrunJob b = Build(args);
  EXPECT_EQ(b.job.spec.trainer.torchrun->Summary(2),
            "torchrun in the command: the agent launches train.py itself, 2 ranks per node; "
            "ignored: --log_dir /tmp/logs, --monitor_interval=1, --start_method=fork, --role "
            "trainer, --tee 3, --local_addr=10.0.0.2");
  std::vector<std::string> command = {"torchrun"};
  command.insert(command.end(), args.begin(), args.end());
  auto manifest = ParseTrainingJobs(
      "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: m}\nspec:\n"
      "  template: {spec: {containers: [{name: trainer, command: " +
          nlohmann::json(command).dump() + "}]}}\n",
      "job.yaml");
  ASSERT_TRUE(manifest.ok()) << manifest.status().message();
  const auto& from_manifest = manifest->front().spec.trainer.torchrun->flags;
  ASSERT_EQ(from_manifest.size(), b.job.spec.trainer.torchrun->flags.size());
  for (size_t i = 0; i < from_manifest.size(); ++i) {
    EXPECT_EQ(b.job.spec.trainer.torchrun->flags[i].written, from_manifest[i].written);
    EXPECT_EQ(b.job.spec.trainer.torchrun->flags[i].effect, from_manifest[i].effect);
  }
}

TEST(TorchrunCommandLineTest, MaxRestartsIsTorchrunsOrTheFlags) {
  EXPECT_EQ(Build({"--max_restarts", "3", "train.py"}).job.spec.restart_policy.max_restarts, 3);
  TorchrunJob b = Build({"--max-restarts=3", "train.py"});
  EXPECT_THAT(b.summary, ::testing::EndsWith(", maxRestarts 3"));
}

TEST(TorchrunCommandLineTest, ModuleNoPythonAndRunPathRunWhatTorchrunWould) {
  TorchrunJob module = Build({"-m", "pkg.train", "--lr", "1"});
  EXPECT_THAT(module.job.spec.trainer.command,
              ElementsAre("python3", "-u", "-m", "pkg.train", "--lr", "1"));
  EXPECT_EQ(module.job.name, "pkg-train");
  EXPECT_THAT(Build({"--no_python", "/bin/echo", "hi"}).job.spec.trainer.command,
              ElementsAre("/bin/echo", "hi"));
  EXPECT_THAT(Build({"--run_path", "-m", "train.py"}).job.spec.trainer.command,
              ElementsAre("python3", "-u", "train.py"));
  // `--` ends torchrun's flags; one right after the script is torchrun's too.
  EXPECT_THAT(Build({"--nproc_per_node=2", "--", "train.py", "--", "-x"}).job.spec.trainer.command,
              ElementsAre("python3", "-u", "train.py", "--", "-x"));
}

TEST(TorchrunCommandLineTest, TheInterpreterIsPythonExecElseTorchrunsElsePython3) {
  TorchrunMachine m = kCpuBox;
  EXPECT_EQ(Build({"train.py"}, m).job.spec.trainer.command.front(), "python3");
  m.torchrun_python = "/usr/bin/python3.11";
  EXPECT_EQ(Build({"train.py"}, m).job.spec.trainer.command.front(), "/usr/bin/python3.11");
  m.python_exec = "/opt/venv/bin/python";
  TorchrunJob b = Build({"train.py"}, m);
  EXPECT_EQ(b.job.spec.trainer.command.front(), "/opt/venv/bin/python");
  ASSERT_EQ(b.job.spec.trainer.env.size(), 1u);
  EXPECT_EQ(b.job.spec.trainer.env[0].name, "PYTHON_EXEC");
  // --no_python runs the program itself.
  EXPECT_EQ(Build({"--no_python", "./train"}, m).job.spec.trainer.command.front(), "./train");
}

TEST(TorchrunCommandLineTest, SpecSetsFieldsTheFlagsCannotSay) {
  TorchrunJob b = Build({"--nproc_per_node=2", "train.py"}, kCpuBox,
                        {"loader.workersPerRank=3", "spec.stallPolicy.timeoutSeconds=30",
                         "restartPolicy.retryOn=[CollectiveTimeout]", "loader.pinMemory=false"});
  EXPECT_EQ(b.job.spec.loader.workers_per_rank, 3);
  EXPECT_EQ(b.job.spec.stall_policy.timeout_seconds, 30);
  EXPECT_THAT(b.job.spec.restart_policy.retry_on_causes, ElementsAre("CollectiveTimeout"));
  EXPECT_FALSE(b.job.spec.loader.pin_memory);
  EXPECT_EQ(b.job.spec.restart_policy.max_restarts, 0);
  EXPECT_EQ(Build({"train.py"}, kCpuBox, {"restartPolicy.maxRestarts=2"})
                .job.spec.restart_policy.max_restarts,
            2);
  // The manifest's rules decide between a flag and a --spec.
  EXPECT_EQ(Build({"--nproc_per_node=2", "train.py"}, kCpuBox, {"procsPerNode=2"})
                .job.spec.procs_per_node,
            2);
  TorchrunJob fixed = Build({"--nproc_per_node=auto", "train.py"}, kCpuBox, {"procsPerNode=3"});
  EXPECT_EQ(fixed.job.spec.procs_per_node, 3);
  EXPECT_EQ(Effect(fixed, "--nproc_per_node=auto"),
            "ignored: spec.procsPerNode: 3 fixes the ranks per node");
  EXPECT_EQ(Error({"--nproc_per_node=2", "train.py"}, kCpuBox, {"procsPerNode=3"}).first,
            "torchrun's --nproc_per_node=2 contradicts spec.procsPerNode: 3; make them equal or "
            "drop the flag");
  EXPECT_THAT(Error({"train.py"}, kCpuBox, {"loader.workers=2"}).first,
              HasSubstr("--spec: spec.loader.workers: unknown field"));
  EXPECT_THAT(Error({"train.py"}, kCpuBox, {"loader.workersPerRank"}).first,
              HasSubstr("--spec loader.workersPerRank: expected KEY=VALUE"));
  EXPECT_THAT(Error({"train.py"}, kCpuBox, {"template.spec.hostNetwork=true"}).first,
              HasSubstr("the trainer container is the torchrun command line"));
}

TEST(TorchrunCommandLineTest, TheJobIsNamedAfterTheScriptOrJob) {
  EXPECT_EQ(Build({"/src/My_Train-2.py"}).job.name, "my-train-2");
  EXPECT_EQ(Build({"--no_python", "/bin/2x"}).job.name, "x");
  EXPECT_EQ(Build({"/src/123.py"}).job.name, "torchrun");
  EXPECT_EQ(Build({"train.py"}, kCpuBox, {}, "exp-7").job.name, "exp-7");
  EXPECT_THAT(Error({"train.py"}, kCpuBox, {}, "Exp_7").first,
              HasSubstr("--job: metadata.name: must consist of"));
}

}  // namespace
}  // namespace spawnpoint::api
