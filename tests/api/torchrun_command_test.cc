// A trainer command that starts torchrun: every form users bring, understood as what each
// rank runs, and its flags reconciled with the manifest (taken, agreeing, ignored, or a
// located error).
#include "api/torchrun_command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "api/training_job.h"

namespace spawnpoint::api {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Argv = std::vector<std::string>;

TorchrunLaunch Parse(const Argv& argv, std::string_view python_exec = "") {
  size_t bad = 99;
  auto parsed = ParseTorchrunCommand(argv, python_exec, &bad);
  EXPECT_TRUE(parsed.ok()) << parsed.status().message() << " at " << bad;
  if (!parsed.ok() || !parsed->has_value()) {
    ADD_FAILURE() << "not understood as torchrun";
    return {};
  }
  return **parsed;
}

bool IsTorchrun(const Argv& argv) {
  size_t bad = 0;
  auto parsed = ParseTorchrunCommand(argv, "", &bad);
  return !parsed.ok() || parsed->has_value();
}

// The error message and the element it names.
std::pair<std::string, size_t> Error(const Argv& argv) {
  size_t bad = 99;
  auto parsed = ParseTorchrunCommand(argv, "", &bad);
  EXPECT_FALSE(parsed.ok());
  return {parsed.ok() ? "" : parsed.status().message(), bad};
}

std::string Value(const TorchrunLaunch& launch, const std::string& name) {
  for (const auto& f : launch.flags) {
    if (f.name == name) return f.value;
  }
  return "<absent>";
}

TEST(TorchrunCommandTest, BareTorchrunRunsTheScriptWithTorchrunsInterpreter) {
  TorchrunLaunch l = Parse({"torchrun", "--nproc_per_node=8", "train.py", "--lr", "0.1"});
  EXPECT_EQ(l.launcher, "torchrun");
  EXPECT_TRUE(l.interpreter_from_launcher);
  EXPECT_EQ(l.launcher_program, "torchrun");
  EXPECT_THAT(l.RankArgv(), ElementsAre("python3", "-u", "train.py", "--lr", "0.1"));
  EXPECT_EQ(Value(l, "nproc_per_node"), "8");
  EXPECT_EQ(l.flags[0].written, "--nproc_per_node=8");
  EXPECT_EQ(l.flags[0].index, 1u);
  EXPECT_FALSE(l.local_rank_arg);
}

TEST(TorchrunCommandTest, TorchrunByPathAndThroughAnInterpreter) {
  TorchrunLaunch by_path = Parse({"/opt/conda/bin/torchrun", "train.py"});
  EXPECT_EQ(by_path.launcher_program, "/opt/conda/bin/torchrun");
  EXPECT_TRUE(by_path.interpreter_from_launcher);
  TorchrunLaunch through = Parse({"python3", "/usr/bin/torchrun", "--nnodes", "1", "t.py"});
  EXPECT_FALSE(through.interpreter_from_launcher);
  EXPECT_THAT(through.RankArgv(), ElementsAre("python3", "-u", "t.py"));
}

TEST(TorchrunCommandTest, PythonModuleFormsKeepTheirInterpreter) {
  for (const Argv& argv :
       {Argv{"python", "-m", "torch.distributed.run", "train.py", "x"},
        Argv{"python3", "-m", "torch.distributed.run", "train.py", "x"},
        Argv{"python3.10", "-mtorch.distributed.run", "train.py", "x"},
        Argv{"/usr/bin/python3", "-u", "-m", "torch.distributed.run", "train.py", "x"},
        Argv{"python3", "-X", "dev", "-Bm", "torch.distributed.run", "train.py", "x"}}) {
    TorchrunLaunch l = Parse(argv);
    EXPECT_FALSE(l.interpreter_from_launcher) << argv[0];
    EXPECT_FALSE(l.local_rank_arg);
    EXPECT_THAT(l.RankArgv(), ElementsAre(argv[0], "-u", "train.py", "x")) << argv[0];
  }
  EXPECT_EQ(Parse({"python3", "-m", "torch.distributed.run", "t.py"}).launcher,
            "python3 -m torch.distributed.run");
}

TEST(TorchrunCommandTest, PythonExecFromTheManifestIsTheInterpreter) {
  TorchrunLaunch l = Parse({"torchrun", "train.py"}, "/venv/bin/python");
  EXPECT_FALSE(l.interpreter_from_launcher);
  EXPECT_THAT(l.RankArgv(), ElementsAre("/venv/bin/python", "-u", "train.py"));
}

TEST(TorchrunCommandTest, LaunchPassesLocalRankUnlessUseEnv) {
  TorchrunLaunch launch =
      Parse({"python", "-m", "torch.distributed.launch", "--nproc_per_node", "2", "t.py", "a"});
  EXPECT_EQ(launch.launcher, "python -m torch.distributed.launch");
  EXPECT_TRUE(launch.local_rank_arg);
  EXPECT_THAT(launch.RankArgv(1), ElementsAre("python", "-u", "t.py", "--local_rank=1", "a"));
  for (const char* use_env : {"--use_env", "--use-env"}) {
    TorchrunLaunch env = Parse({"python", "-m", "torch.distributed.launch", use_env, "t.py", "a"});
    EXPECT_FALSE(env.local_rank_arg) << use_env;
    EXPECT_THAT(env.RankArgv(1), ElementsAre("python", "-u", "t.py", "a"));
  }
  // torchrun itself has no --use_env.
  EXPECT_THAT(Error({"torchrun", "--use_env", "t.py"}).first, HasSubstr("unknown torchrun option"));
}

TEST(TorchrunCommandTest, FlagsInEverySpelling) {
  for (const Argv& flag :
       {Argv{"--nproc_per_node=4"}, Argv{"--nproc-per-node=4"}, Argv{"--nproc_per_node", "4"},
        Argv{"--nproc-per-node", "4"}, Argv{"--nproc=4"}}) {
    Argv argv = {"torchrun"};
    argv.insert(argv.end(), flag.begin(), flag.end());
    argv.push_back("train.py");
    TorchrunLaunch l = Parse(argv);
    ASSERT_EQ(l.flags.size(), 1u) << flag[0];
    EXPECT_EQ(l.flags[0].name, "nproc_per_node");
    EXPECT_EQ(l.flags[0].value, "4");
    EXPECT_EQ(l.flags[0].index, flag.size()) << "the element holding the value";
    EXPECT_EQ(l.program, "train.py");
  }
  TorchrunLaunch all = Parse({"torchrun",
                              "--nnodes=1:2",
                              "--rdzv-backend",
                              "c10d",
                              "--rdzv_endpoint=h:1",
                              "--rdzv-id=7",
                              "--standalone",
                              "--max-restarts",
                              "3",
                              "--monitor_interval=1",
                              "-r",
                              "3",
                              "-t3",
                              "--log-dir=/l",
                              "--role=r",
                              "--start_method",
                              "spawn",
                              "--node-rank=0",
                              "--master_addr",
                              "a",
                              "--master-port=1",
                              "t.py"});
  EXPECT_EQ(Value(all, "rdzv_backend"), "c10d");
  EXPECT_EQ(Value(all, "max_restarts"), "3");
  EXPECT_EQ(Value(all, "redirects"), "3");
  EXPECT_EQ(Value(all, "tee"), "3");
  EXPECT_EQ(Value(all, "standalone"), "");
  EXPECT_EQ(Value(all, "master_port"), "1");
  EXPECT_EQ(all.flags.size(), 15u);
  EXPECT_EQ(all.program, "t.py");
}

TEST(TorchrunCommandTest, ScriptArgsArePreservedExactly) {
  TorchrunLaunch l = Parse({"torchrun", "--nproc_per_node=2", "train.py", "--nproc_per_node=3",
                            "-m", "", "a b", "$(X)", "--", "--standalone"});
  EXPECT_THAT(l.program_args,
              ElementsAre("--nproc_per_node=3", "-m", "", "a b", "$(X)", "--", "--standalone"));
  EXPECT_EQ(l.flags.size(), 1u);
}

TEST(TorchrunCommandTest, DoubleDashSeparatorsAsTorchrunsArgparseTreatsThem) {
  // `--` ends torchrun's options; the first `--` right after the script is swallowed; any
  // other `--` belongs to the script.
  EXPECT_THAT(Parse({"torchrun", "--nproc_per_node=2", "--", "train.py", "--lr", "1"}).RankArgv(),
              ElementsAre("python3", "-u", "train.py", "--lr", "1"));
  EXPECT_THAT(Parse({"torchrun", "train.py", "--", "--x"}).program_args, ElementsAre("--x"));
  EXPECT_THAT(Parse({"torchrun", "--", "train.py", "--", "--x"}).program_args,
              ElementsAre("--", "--x"));
  EXPECT_THAT(Parse({"torchrun", "train.py", "a", "--", "b"}).program_args,
              ElementsAre("a", "--", "b"));
  EXPECT_EQ(Parse({"torchrun", "--", "--odd-name.py"}).program, "--odd-name.py");
}

TEST(TorchrunCommandTest, ModuleNoPythonAndRunPath) {
  for (const char* m : {"-m", "--module"}) {
    TorchrunLaunch l = Parse({"torchrun", m, "pkg.train", "--epochs", "1"});
    EXPECT_THAT(l.RankArgv(), ElementsAre("python3", "-u", "-m", "pkg.train", "--epochs", "1"));
    EXPECT_EQ(l.What(), "module pkg.train");
  }
  for (const char* no_python : {"--no_python", "--no-python"}) {
    TorchrunLaunch l = Parse({"torchrun", no_python, "./train", "--x"});
    EXPECT_THAT(l.RankArgv(), ElementsAre("./train", "--x"));
    EXPECT_FALSE(l.interpreter_from_launcher);
  }
  auto [both, at] = Error({"torchrun", "--no_python", "-m", "pkg"});
  EXPECT_THAT(both, HasSubstr("both --no_python and -m"));
  EXPECT_EQ(at, 2u);
  EXPECT_THAT(Parse({"torchrun", "--run_path", "--no_python", "t.py"}).RankArgv(),
              ElementsAre("python3", "-u", "t.py"));
}

TEST(TorchrunCommandTest, OtherCommandsAreLeftAlone) {
  EXPECT_FALSE(IsTorchrun({"python", "train.py", "--nproc_per_node=8"}));
  EXPECT_FALSE(IsTorchrun({"python", "-m", "train"}));
  EXPECT_FALSE(IsTorchrun({"python", "-m", "torch.distributed.elastic"}));
  EXPECT_FALSE(IsTorchrun({"python", "-c", "import torch.distributed.run"}));
  EXPECT_FALSE(IsTorchrun({"/usr/bin/torchrun-wrapper", "x"}));
  EXPECT_FALSE(IsTorchrun({"python-config", "-m", "torch.distributed.run"}));
  EXPECT_FALSE(IsTorchrun({"/bin/sh", "-c", "torchrun train.py"}));
  EXPECT_FALSE(IsTorchrun({"./trainer", "--epochs", "1"}));
}

TEST(TorchrunCommandTest, MistakesNameTheElement) {
  auto [unknown, at] = Error({"torchrun", "--nproc_per_node=2", "--epochs=3", "train.py"});
  EXPECT_THAT(unknown, HasSubstr("unknown torchrun option --epochs"));
  EXPECT_EQ(at, 2u);
  EXPECT_THAT(Error({"torchrun", "--nproc_per_node=2"}).first, HasSubstr("no script to run"));
  auto [no_value, value_at] = Error({"torchrun", "--nnodes"});
  EXPECT_THAT(no_value, HasSubstr("--nnodes needs a value"));
  EXPECT_EQ(value_at, 1u);
  EXPECT_THAT(Error({"torchrun", "--standalone=1", "t.py"}).first, HasSubstr("takes no value"));
  // Ambiguous abbreviations are refused, as argparse refuses them.
  EXPECT_THAT(Error({"torchrun", "--n=1", "t.py"}).first, HasSubstr("unknown"));
}

TEST(TorchrunCommandTest, SummaryIsOneLine) {
  TorchrunLaunch l = Parse({"torchrun", "--nproc_per_node=8", "train.py"});
  EXPECT_EQ(l.Summary(8),
            "torchrun in the command: the agent launches train.py itself, 8 ranks "
            "per node");
}

TEST(TorchrunCommandTest, InterpreterFromTheShebang) {
  EXPECT_EQ(PythonFromShebang("#!/opt/conda/bin/python3.10\nimport re\n"),
            "/opt/conda/bin/python3.10");
  EXPECT_EQ(PythonFromShebang("#! /usr/bin/python3 -s\n"), "/usr/bin/python3");
  EXPECT_EQ(PythonFromShebang("#!/usr/bin/env python3\n"), "python3");
  EXPECT_EQ(PythonFromShebang("#!/usr/bin/env -S python3 -u\n"), "python3");
  EXPECT_EQ(PythonFromShebang("#!/bin/sh\n'''exec' \"/very/long/bin/python3\" \"$0\" \"$@\"\n"),
            "/very/long/bin/python3");
  EXPECT_EQ(PythonFromShebang("#!/bin/bash\necho hi\n"), "");
  EXPECT_EQ(PythonFromShebang("\x7f"
                              "ELF"),
            "");
}

// --- The manifest side: api::ParseTrainingJobs / TrainingJobFromJson.

std::string Manifest(const std::string& spec_lines, const std::string& command) {
  return "apiVersion: spawnpoint.dev/v1alpha1\n"  // line 1
         "kind: TrainingJob\n"                    // 2
         "metadata: {name: tr}\n"                 // 3
         "spec:\n" +                              // 4
         spec_lines +                             // one line, 5
         "  template:\n"                          // 6
         "    spec:\n"                            // 7
         "      containers:\n"                    // 8
         "      - name: trainer\n"                // 9
         "        image: x\n"                     // 10
         "        command: " +                    // 11, the list starts at column 18
         command +
         "\n";
}

StatusOr<TrainingJob> ParseOne(const std::string& text) {
  auto jobs = ParseTrainingJobs(text, "job.yaml", {.local = true});
  if (!jobs.ok()) return jobs.status();
  return jobs->front();
}

std::string ErrorOf(const std::string& text) {
  auto job = ParseOne(text);
  EXPECT_FALSE(job.ok()) << "accepted";
  return job.ok() ? "" : job.status().message();
}

TEST(TorchrunManifestTest, AnUnsetProcsPerNodeIsTakenFromTheFlag) {
  auto job = ParseOne(
      Manifest("  nodes: 2\n", "[torchrun, --nproc_per_node=4, --max_restarts=5, train.py, --x]"));
  ASSERT_TRUE(job.ok()) << job.status().message();
  const TrainingJobSpec& s = job->spec;
  EXPECT_EQ(s.procs_per_node, 4);
  EXPECT_EQ(RanksPerNode(s), 4);
  EXPECT_EQ(s.restart_policy.max_restarts, 5);
  EXPECT_THAT(s.trainer.command, ElementsAre("python3", "-u", "train.py", "--x"));
  EXPECT_TRUE(s.trainer.args.empty());
  ASSERT_TRUE(s.trainer.torchrun.has_value());
  EXPECT_THAT(s.trainer.torchrun->flags[0].effect, HasSubstr("taken: 4 ranks per node"));
  EXPECT_THAT(s.trainer.torchrun->original,
              ElementsAre("torchrun", "--nproc_per_node=4", "--max_restarts=5", "train.py", "--x"));
}

TEST(TorchrunManifestTest, AContradictingProcsPerNodeIsALocatedError) {
  EXPECT_EQ(ErrorOf(Manifest("  procsPerNode: 8\n", "[torchrun, --nproc_per_node=4, train.py]")),
            "job.yaml:11:29: spec.template.spec.containers[0].command[1]: torchrun's "
            "--nproc_per_node=4 contradicts spec.procsPerNode: 8; make them equal or drop the "
            "flag");
  // The value element, in the two-element form, and in args.
  std::string text = Manifest("  procsPerNode: 8\n", "[torchrun]") +
                     "        args: [--nproc-per-node, '4', train.py]\n";
  EXPECT_THAT(ErrorOf(text),
              HasSubstr("job.yaml:12:34: spec.template.spec.containers[0].args[1]: torchrun's "
                        "--nproc-per-node 4 contradicts spec.procsPerNode: 8"));
}

TEST(TorchrunManifestTest, RanksPerNodeAgainstGpus) {
  auto gpu = ParseOne(Manifest("  gpusPerNode: 8\n", "[torchrun, --nproc_per_node=gpu, t.py]"));
  ASSERT_TRUE(gpu.ok()) << gpu.status().message();
  EXPECT_THAT(gpu->spec.trainer.torchrun->flags[0].effect, HasSubstr("agrees: one rank per GPU"));
  EXPECT_TRUE(
      ParseOne(Manifest("  gpusPerNode: 8\n", "[torchrun, --nproc_per_node=8, t.py]")).ok());
  EXPECT_TRUE(
      ParseOne(Manifest("  gpusPerNode: 8\n", "[torchrun, --nproc_per_node=auto, t.py]")).ok());
  EXPECT_THAT(ErrorOf(Manifest("  gpusPerNode: 8\n", "[torchrun, --nproc_per_node=4, t.py]")),
              HasSubstr("contradicts spec.gpusPerNode: 8"));
  EXPECT_THAT(ErrorOf(Manifest("  gpusPerNode: 0\n", "[torchrun, --nproc_per_node=gpu, t.py]")),
              HasSubstr("spec.gpusPerNode is 0"));
  EXPECT_THAT(ErrorOf(Manifest("  nodes: 1\n", "[torchrun, --nproc_per_node=cpu, t.py]")),
              HasSubstr("needs spec.procsPerNode"));
  auto cpu = ParseOne(Manifest("  procsPerNode: 3\n", "[torchrun, --nproc_per_node=cpu, t.py]"));
  ASSERT_TRUE(cpu.ok()) << cpu.status().message();
  EXPECT_EQ(RanksPerNode(cpu->spec), 3);
  EXPECT_THAT(ErrorOf(Manifest("  nodes: 1\n", "[torchrun, --nproc_per_node=eight, t.py]")),
              HasSubstr("must be a number >= 1, gpu, cpu or auto"));
}

TEST(TorchrunManifestTest, NodesFromNnodes) {
  auto taken = ParseOne(Manifest("  procsPerNode: 2\n", "[torchrun, --nnodes=3, t.py]"));
  ASSERT_TRUE(taken.ok()) << taken.status().message();
  EXPECT_EQ(taken->spec.nodes, 3);
  EXPECT_EQ(ErrorOf(Manifest("  nodes: 2\n", "[torchrun, --nnodes=3, t.py]")),
            "job.yaml:11:29: spec.template.spec.containers[0].command[1]: torchrun's --nnodes=3 "
            "contradicts spec.nodes: 2; make them equal or drop the flag");
  EXPECT_TRUE(ParseOne(Manifest("  nodes: 2\n", "[torchrun, --nnodes=1:4, t.py]")).ok());
  EXPECT_THAT(ErrorOf(Manifest("  nodes: 5\n", "[torchrun, --nnodes=1:4, t.py]")),
              HasSubstr("outside the range"));
  EXPECT_THAT(ErrorOf(Manifest("  procsPerNode: 1\n", "[torchrun, --nnodes=1:4, t.py]")),
              HasSubstr("elastic range"));
  auto pinned = ParseOne(Manifest("  procsPerNode: 1\n", "[torchrun, --nnodes=2:2, t.py]"));
  ASSERT_TRUE(pinned.ok()) << pinned.status().message();
  EXPECT_EQ(pinned->spec.nodes, 2);
  EXPECT_THAT(ErrorOf(Manifest("  nodes: 2\n", "[torchrun, --standalone, t.py]")),
              HasSubstr("--standalone contradicts spec.nodes: 2"));
  // A second value for the same flag contradicts the first one taken.
  EXPECT_THAT(ErrorOf(Manifest("  procsPerNode: 1\n", "[torchrun, --nnodes=2, --nnodes=3, t.py]")),
              HasSubstr("--nnodes=3 contradicts --nnodes=2"));
}

TEST(TorchrunManifestTest, PortAndRestartsAgainstTheSpec) {
  auto taken = ParseOne(Manifest("  nodes: 1\n", "[torchrun, --master_port=29600, t.py]"));
  ASSERT_TRUE(taken.ok()) << taken.status().message();
  EXPECT_EQ(taken->spec.rendezvous_port, 29600);
  EXPECT_THAT(
      ErrorOf(Manifest("  rendezvous: {port: 29500}\n", "[torchrun, --master_port=29600, t.py]")),
      HasSubstr("contradicts spec.rendezvous.port: 29500"));
  EXPECT_THAT(ErrorOf(Manifest("  restartPolicy: {maxRestarts: 1}\n",
                               "[torchrun, --max_restarts=3, t.py]")),
              HasSubstr("contradicts spec.restartPolicy.maxRestarts: 1"));
  EXPECT_TRUE(ParseOne(Manifest("  restartPolicy: {maxRestarts: 3}\n",
                                "[torchrun, --max_restarts=3, t.py]"))
                  .ok());
}

TEST(TorchrunManifestTest, LauncherFlagsAreIgnoredWithTheReason) {
  auto job = ParseOne(
      Manifest("  procsPerNode: 2\n",
               "[torchrun, '--master_addr=$(MASTER_ADDR)', '--nproc_per_node=$(N)', --node_rank=1, "
               "--rdzv_backend=c10d, --monitor_interval=1, --tee=3, --log_dir=/l, --role=w, "
               "--start_method=fork, t.py]"));
  ASSERT_TRUE(job.ok()) << job.status().message();
  EXPECT_EQ(job->spec.procs_per_node, 2);
  for (const auto& flag : job->spec.trainer.torchrun->flags) {
    EXPECT_THAT(flag.effect, ::testing::StartsWith("ignored: ")) << flag.written;
  }
  EXPECT_THAT(job->spec.trainer.torchrun->Summary(2),
              HasSubstr("; ignored: --master_addr=$(MASTER_ADDR), --nproc_per_node=$(N)"));
}

TEST(TorchrunManifestTest, ApiObjectsAreCheckedTooAndRoundTrip) {
  // The operator's path: TrainingJobFromJson (an error marks the job InvalidSpec), and the
  // job it hands the agent (TrainingJobToJson) means the same to the agent.
  auto yaml = ParseOne(Manifest("  nodes: 2\n", "[torchrun, --nproc_per_node=4, train.py, --x]"));
  ASSERT_TRUE(yaml.ok()) << yaml.status().message();
  nlohmann::json object = TrainingJobToJson(*yaml);
  auto again = TrainingJobFromJson(object);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->spec.procs_per_node, 4);
  EXPECT_EQ(again->spec.trainer.command, yaml->spec.trainer.command);
  ASSERT_TRUE(again->spec.trainer.torchrun.has_value());
  EXPECT_THAT(again->spec.trainer.torchrun->flags[0].effect, HasSubstr("agrees"));

  object["spec"]["template"]["spec"]["containers"][0]["command"][1] = "--nnodes=3";
  auto bad = TrainingJobFromJson(object);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "spec.template.spec.containers[0].command[1]: torchrun's --nnodes=3 contradicts "
            "spec.nodes: 2; make them equal or drop the flag");
}

}  // namespace
}  // namespace spawnpoint::api
