// The real agent on manifests whose command starts torchrun, in each form users bring:
// `plan` shows what each rank runs, without torchrun, and says it was rewritten; `run`
// starts the script itself (tests/data/torchrun/rank.py, with /usr/bin/python3, which has
// torch) and no torchrun process exists in the job.
#include <sys/stat.h>

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/test_process.h"

namespace spawnpoint::testing {
namespace {

using std::chrono::milliseconds;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kRankScript = std::string(SOURCE_DIR) + "/tests/data/torchrun/rank.py";

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

}  // namespace
}  // namespace spawnpoint::testing
