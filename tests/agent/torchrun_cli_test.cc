// The real agent on manifests whose command starts torchrun, in each form users bring:
// `plan` shows what each rank runs, without torchrun, and says it was rewritten; `run`
// starts the script itself (tests/data/torchrun/rank.py, with /usr/bin/python3, which has
// torch) and no torchrun process exists in the job. And `spawnpoint-agent torchrun`, the
// torchrun command line without a manifest: a gloo DDP script's ranks
// (tests/data/torchrun/allreduce.py), its plan, a failing rank and bad input.
#include <sched.h>
#include <sys/stat.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/free_port.h"
#include "tests/support/test_process.h"

namespace spawnpoint::testing {
namespace {

using std::chrono::milliseconds;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kRankScript = std::string(SOURCE_DIR) + "/tests/data/torchrun/rank.py";
const std::string kAllReduceScript = std::string(SOURCE_DIR) + "/tests/data/torchrun/allreduce.py";

// A CPU job whose trainer runs `command`; `spec` adds lines under spec:.
std::string Job(const std::vector<std::string>& command, const std::string& spec = "",
                const std::string& env = "") {
  nlohmann::json list = command;
  return "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: tr}\n"
         "spec:\n" +
         spec +
         "  loader: {workersPerRank: 0}\n"
         "  shmSize: 64Mi\n"
         "  template:\n    spec:\n      containers:\n      - name: trainer\n"
         "        image: x\n        command: " +
         list.dump() + "\n" + env;
}

class TorchrunCliTest : public ::testing::Test {
 protected:
  // `plan --node-rank 0` of the job; its JSON, after checking it exited 0.
  nlohmann::json Plan(const std::string& manifest) {
    WriteFile(dir_.File("job.yaml"), manifest);
    TestProcess p({AGENT_BIN, "plan", "-f", dir_.File("job.yaml"), "--node-rank", "0"}, {},
                  dir_.path());
    EXPECT_EQ(p.Wait(milliseconds(60'000)), 0) << p.Stderr();
    stderr_ = p.Stderr();
    auto j = nlohmann::json::parse(p.Stdout(), nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(j.is_discarded()) << p.Stdout();
    return j;
  }
  // A fake torchrun whose shebang names /usr/bin/python3 (it is never run).
  std::string FakeTorchrun() {
    std::string path = dir_.File("bin/torchrun");
    mkdir(dir_.File("bin").c_str(), 0755);
    WriteFile(path, "#!/usr/bin/python3\nimport sys\nsys.exit('torchrun ran')\n");
    chmod(path.c_str(), 0755);
    return path;
  }

  TempDir dir_;
  std::string stderr_;
};

TEST_F(TorchrunCliTest, PlanShowsTheRankArgvWithoutTorchrunForEveryForm) {
  const std::string torchrun = FakeTorchrun();
  WriteFile(dir_.File("train.py"), "\n");  // plan checks that the script is there
  const std::string path_env =
      "        env: [{name: PATH, value: '" + dir_.File("bin") + ":/usr/bin:/bin'}]\n";
  struct Case {
    std::vector<std::string> command;
    std::string env;
    std::vector<std::string> argv;  // rank 1's
  };
  const std::vector<Case> cases = {
      {{"torchrun", "--nproc_per_node=2", "train.py", "--lr", "1"},
       path_env,
       {"/usr/bin/python3", "-u", "train.py", "--lr", "1"}},
      {{torchrun, "--nproc-per-node", "2", "--", "train.py", "--", "-x"},
       "",
       {"/usr/bin/python3", "-u", "train.py", "--", "-x"}},
      {{"/usr/bin/python3", "-m", "torch.distributed.run", "--nproc_per_node", "2", "train.py"},
       "",
       {"/usr/bin/python3", "-u", "train.py"}},
      {{"python3.11", "-m", "torch.distributed.run", "--nproc-per-node=2", "-m", "pkg.train"},
       "",
       {"python3.11", "-u", "-m", "pkg.train"}},
      {{"/usr/bin/python3", "-m", "torch.distributed.launch", "--nproc_per_node=2", "--use_env",
        "train.py", "a"},
       "",
       {"/usr/bin/python3", "-u", "train.py", "a"}},
      {{"/usr/bin/python3", "-m", "torch.distributed.launch", "--nproc_per_node=2", "train.py",
        "a"},
       "",
       {"/usr/bin/python3", "-u", "train.py", "--local_rank=1", "a"}},
      {{torchrun, "--no_python", "--nproc_per_node=2", "/bin/echo", "hello"},
       "",
       {"/bin/echo", "hello"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(nlohmann::json(c.command).dump());
    nlohmann::json plan = Plan(Job(c.command, "", c.env));
    ASSERT_EQ(plan["ranks"].size(), 2u);
    EXPECT_EQ(plan["ranksPerNode"], 2);
    EXPECT_THAT(plan["ranks"][1]["argv"].get<std::vector<std::string>>(), ElementsAreArray(c.argv));
    EXPECT_EQ(plan["ranks"][1]["env"]["LOCAL_RANK"], "1");
    EXPECT_EQ(plan["ranks"][1]["env"]["WORLD_SIZE"], "2");
    ASSERT_TRUE(plan.contains("rewrittenFrom"));
    EXPECT_EQ(plan["rewrittenFrom"]["command"], nlohmann::json(c.command));
    std::string nproc_effect;
    for (const auto& flag : plan["rewrittenFrom"]["flags"]) {
      if (flag["flag"].get<std::string>().find("nproc") != std::string::npos) {
        nproc_effect = flag["effect"];
      }
    }
    EXPECT_THAT(nproc_effect, HasSubstr("taken: 2 ranks per node"));
    EXPECT_THAT(stderr_, HasSubstr("in the command: the agent launches "));
    EXPECT_THAT(stderr_, HasSubstr(" itself, 2 ranks per node"));
  }
}

TEST_F(TorchrunCliTest, PlanOfAnOrdinaryCommandIsNotRewritten) {
  nlohmann::json plan = Plan(Job({"/bin/echo", "--nproc_per_node=2"}, "  procsPerNode: 2\n"));
  EXPECT_FALSE(plan.contains("rewrittenFrom"));
  EXPECT_EQ(plan["ranks"][0]["argv"], nlohmann::json({"/bin/echo", "--nproc_per_node=2"}));
  EXPECT_THAT(stderr_, Not(HasSubstr("in the command")));
}

TEST_F(TorchrunCliTest, AContradictionExitsTwoWithTheLocationAndStartsNothing) {
  WriteFile(dir_.File("job.yaml"),
            Job({"torchrun", "--nproc_per_node=4", "train.py"}, "  procsPerNode: 8\n"));
  for (const char* command : {"plan", "run"}) {
    TestProcess p({AGENT_BIN, command, "-f", dir_.File("job.yaml"), "--master-port", "0"}, {},
                  dir_.path());
    EXPECT_EQ(p.Wait(milliseconds(30'000)), 2) << command << ": " << p.Stderr();
    EXPECT_THAT(p.Stderr(), HasSubstr("job.yaml:13:30: spec.template.spec.containers[0]."
                                      "command[1]: torchrun's --nproc_per_node=4 contradicts "
                                      "spec.procsPerNode: 8"));
    EXPECT_EQ(CountLines(p.Stderr(), ""), 1) << p.Stderr();
    EXPECT_EQ(p.Stdout(), "");
  }
}

// The acceptance run: `python3 -m torch.distributed.run --nproc_per_node=2 rank.py`; both
// ranks run the script under the agent, with torchrun's variables, and no torchrun exists.
TEST_F(TorchrunCliTest, RunStartsTheScriptItselfAndNoTorchrun) {
  WriteFile(dir_.File("job.yaml"),
            Job({"/usr/bin/python3", "-m", "torch.distributed.run", "--nproc_per_node=2",
                 "--max_restarts=0", kRankScript, "--epochs", "1", "--", "x y"}));
  TestProcess agent({AGENT_BIN, "run", "-f", dir_.File("job.yaml"), "--master-port", "0",
                     "--termination-log", dir_.File("termination-log")},
                    {}, dir_.path());
  ASSERT_EQ(agent.Wait(milliseconds(120'000)), 0) << agent.Stderr() << agent.Stdout();
  const std::string out = agent.Stdout();
  for (int rank = 0; rank < 2; ++rank) {
    const std::string r = std::to_string(rank);
    EXPECT_THAT(out, HasSubstr("[rank " + r + "] rank " + r + " of 2 local " + r + " port "));
  }
  EXPECT_EQ(CountLines(out,
                       "agent_found=True parent_torchrun=False torchrun_in_job=0 "
                       "argv=['--epochs', '1', '--', 'x y']"),
            2)
      << out;
  EXPECT_THAT(agent.Stderr(), HasSubstr("tr: /usr/bin/python3 -m torch.distributed.run in the "
                                        "command: the agent launches " +
                                        kRankScript + " itself, 2 ranks per node"));
  EXPECT_THAT(agent.Stderr(), HasSubstr("all ranks succeeded"));
}

// The acceptance run of the command line: `spawnpoint-agent torchrun --nproc_per_node 2
// allreduce.py --flag hello` (with the agent's own flags first) runs two gloo ranks of the
// script with its flag, through the agent's usual path, and exits 0.
TEST_F(TorchrunCliTest, TheCommandLineRunsTwoRanksOfTheScriptWithItsFlag) {
  TestProcess agent(
      {AGENT_BIN, "torchrun", "--metrics-addr", "off", "--termination-log",
       dir_.File("termination-log"), "--nproc_per_node", "2", kAllReduceScript, "--flag", "hello"},
      {{"PYTHON_EXEC", "/usr/bin/python3"}}, dir_.path());
  ASSERT_EQ(agent.Wait(milliseconds(120'000)), 0) << agent.Stderr() << agent.Stdout();
  const std::string out = agent.Stdout();
  for (int rank = 0; rank < 2; ++rank) {
    const std::string r = std::to_string(rank);
    EXPECT_EQ(CountLines(out, "[rank " + r + "] rank " + r +
                                  " of 2 sum 3 flag hello python /usr/bin/python3"),
              1)
        << out;
  }
  const std::string err = agent.Stderr();
  EXPECT_THAT(err, HasSubstr("allreduce: torchrun command line: 2 CPU ranks (--nproc_per_node "
                             "2), backend gloo, rendezvous on a free port, maxRestarts 0"));
  EXPECT_THAT(err, HasSubstr("allreduce: node 0/1, 2 ranks of 2, backend gloo"));
  EXPECT_THAT(err, HasSubstr("all ranks succeeded"));
}

// A rank that fails gets the agent's usual verdict, and the agent exits 1: torchrun's
// --max_restarts defaults to 0, so nothing is restarted.
TEST_F(TorchrunCliTest, AFailingRankOfTheCommandLineGetsTheVerdictAndExitsOne) {
  TestProcess agent(
      {AGENT_BIN, "torchrun", "--metrics-addr", "off", "--termination-log",
       dir_.File("termination-log"), "--nproc-per-node=2", kAllReduceScript, "--fail-rank", "1"},
      {{"PYTHON_EXEC", "/usr/bin/python3"}}, dir_.path());
  ASSERT_EQ(agent.Wait(milliseconds(120'000)), 1) << agent.Stderr() << agent.Stdout();
  EXPECT_THAT(agent.Stderr(), HasSubstr("failed: rank 1 (local rank 1, node 0"));
  EXPECT_THAT(agent.Stderr(), HasSubstr("RuntimeError: rank 1 fails on purpose"));
  EXPECT_THAT(agent.Stderr(), HasSubstr("not restarted: exit code 1 is not retryable"));
  auto log = nlohmann::json::parse(ReadFile(dir_.File("termination-log")), nullptr, false);
  ASSERT_TRUE(log.is_object()) << ReadFile(dir_.File("termination-log"));
  EXPECT_EQ(log["rank"], 1);
  EXPECT_EQ(log["exitCode"], 1);
}

// `torchrun --plan` prints run's plan: the interpreter on the first line of the `torchrun`
// on PATH (as torchrun's own would run the ranks), one rank per CPU for --nproc_per_node auto
// without a GPU, and the ignored flag listed once.
TEST_F(TorchrunCliTest, PlanOfTheCommandLineShowsTheRanksAsRunWouldStartThem) {
  FakeTorchrun();
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  const int cpus = CPU_COUNT(&set);
  TestProcess p({AGENT_BIN, "torchrun", "--plan", "--gpu-backend", "none", "--nproc_per_node",
                 "auto", "--log_dir=/tmp/logs", kAllReduceScript, "--flag", "x"},
                {{"PATH", dir_.File("bin") + ":/usr/bin:/bin"}, {"PYTHON_EXEC", ""}}, dir_.path());
  ASSERT_EQ(p.Wait(milliseconds(60'000)), 0) << p.Stderr();
  auto plan = nlohmann::json::parse(p.Stdout(), nullptr, false);
  ASSERT_TRUE(plan.is_array() && plan.size() == 1u) << p.Stdout();
  EXPECT_EQ(plan[0]["ranksPerNode"], cpus);
  ASSERT_EQ(plan[0]["ranks"].size(), static_cast<size_t>(cpus));
  EXPECT_EQ(plan[0]["ranks"][0]["argv"],
            nlohmann::json({"/usr/bin/python3", "-u", kAllReduceScript, "--flag", "x"}));
  EXPECT_EQ(plan[0]["backend"], "gloo");
  EXPECT_EQ(plan[0]["rewrittenFrom"]["command"][0], "torchrun");
  EXPECT_EQ(CountLines(p.Stderr(), "ignored: --log_dir=/tmp/logs"), 1) << p.Stderr();
  EXPECT_THAT(p.Stderr(), HasSubstr(std::to_string(cpus) + " CPU rank"));
}

// Several machines, as torchrun runs them: one agent per node, each told its --node_rank and
// node 0's --master_addr; the two agents' ranks form one world of 2.
TEST_F(TorchrunCliTest, EachAgentOfSeveralNodesRunsTheNodeItIsTold) {
  const std::string port = std::to_string(FreePort(1));
  std::vector<std::unique_ptr<TestProcess>> agents;
  for (const char* node : {"0", "1"}) {
    agents.push_back(std::make_unique<TestProcess>(
        std::vector<std::string>{AGENT_BIN, "torchrun", "--metrics-addr", "off", "--nnodes", "2",
                                 "--node_rank", node, "--master_addr", "127.0.0.1", "--master_port",
                                 port, kAllReduceScript, "--flag", "two"},
        std::map<std::string, std::string>{{"PYTHON_EXEC", "/usr/bin/python3"}}, dir_.path()));
  }
  for (int node = 0; node < 2; ++node) {
    TestProcess& agent = *agents[node];
    ASSERT_EQ(agent.Wait(milliseconds(120'000)), 0) << agent.Stderr() << agent.Stdout();
    const std::string r = std::to_string(node);
    EXPECT_EQ(CountLines(agent.Stdout(), "[rank " + r + "] rank " + r + " of 2 sum 3 flag two"), 1)
        << agent.Stdout();
    EXPECT_THAT(agent.Stderr(), HasSubstr("allreduce: node " + r + "/2, 1 rank of 2"));
    EXPECT_THAT(agent.Stderr(), HasSubstr("rendezvous port " + port +
                                          ", maxRestarts 0 "
                                          "(torchrun's default); node " +
                                          r + " of 2"));
  }
}

// Bad input is exit 2 with one line naming the flag, and nothing runs.
TEST_F(TorchrunCliTest, BadCommandLinesExitTwoNamingTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string error;
  };
  const std::vector<Case> cases = {
      {{"--nproc_per_node", "2", "--status-file", "s.json", kAllReduceScript},
       "error: --status-file is spawnpoint-agent's own flag: give it right after `torchrun`"},
      {{"--nnodes=1:2", kAllReduceScript}, "error: torchrun's --nnodes=1:2 is an elastic range"},
      {{"--nnodes", "2", kAllReduceScript},
       "error: the job spans 2 nodes and --node_rank is not given"},
      {{"--nproc_per_node", "gpu", kAllReduceScript},
       "error: torchrun's --nproc_per_node gpu asks for one rank per GPU, but the agent found no "
       "GPU"},
      {{"--frobnicate", kAllReduceScript}, "error: unknown torchrun option --frobnicate"},
      {{}, "spawnpoint-agent: torchrun: expected torchrun's flags and the script"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {AGENT_BIN, "torchrun", "--gpu-backend", "none"};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    SCOPED_TRACE(nlohmann::json(argv).dump());
    TestProcess p(argv, {}, dir_.path());
    EXPECT_EQ(p.Wait(milliseconds(30'000)), 2) << p.Stderr();
    EXPECT_THAT(p.Stderr(), HasSubstr(c.error));
    EXPECT_EQ(CountLines(p.Stderr(), ""), 1) << p.Stderr();
    EXPECT_EQ(p.Stdout(), "");
  }
}

}  // namespace
}  // namespace spawnpoint::testing
