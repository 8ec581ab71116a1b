// Failures in the rank's own words (issue 16), on real processes under `spawnpoint-agent run`:
// a rank that prints a known failure and exits gives the cause, the quoted line and its last
// lines in the termination log; a long or binary tail still makes one valid JSON object; and
// on two local nodes a rank's kill, not the gloo error its peer prints after it, is the cause
// that decides the restart, whichever node's agent reports first; and a rank still finalizing
// after its traceback when its peer's gloo error stops the gang is the cause, not "stopped".
#include <signal.h>

#include <algorithm>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/test_process.h"

namespace spawnpoint::testing {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr std::chrono::milliseconds kTimeout{90'000};

// A job of `nodes` x `ranks` running `command` with `args` (each a JSON string, which YAML
// reads as a double-quoted scalar).
std::string Job(int nodes, int ranks, const std::string& command,
                const std::vector<std::string>& args, int max_restarts,
                const std::string& retry_on = "") {
  std::string list;
  for (const std::string& a : args) list += (list.empty() ? "" : ", ") + nlohmann::json(a).dump();
  return "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: words}\n"
         "spec:\n  nodes: " +
         std::to_string(nodes) + "\n  procsPerNode: " + std::to_string(ranks) +
         "\n  shmSize: 64Mi\n  loader: {workersPerRank: 0}\n"
         "  restartPolicy: {maxRestarts: " +
         std::to_string(max_restarts) + ", backoffSeconds: 0" +
         (retry_on.empty() ? "" : ", retryOn: " + retry_on) +
         "}\n"
         "  template:\n    spec:\n      containers:\n      - name: trainer\n        image: x\n"
         "        command: [" +
         nlohmann::json(command).dump() + "]\n        args: [" + list + "]\n";
}

class FailureWordsTest : public ::testing::Test {
 protected:
  // Runs a 2-rank job whose rank 1 runs `script` (sh) and whose rank 0 waits to be stopped.
  int RunRankOne(const std::string& script, int max_restarts = 0,
                 const std::string& retry_on = "") {
    WriteFile(
        dir_.File("job.yaml"),
        Job(1, 2, "/bin/sh", {"-c", "if [ \"$RANK\" = 1 ]; then " + script + "; fi; exec sleep 60"},
            max_restarts, retry_on));
    return Run();
  }
  // Runs the job in job.yaml.
  int Run() {
    agent_ = std::make_unique<TestProcess>(std::vector<std::string>{
        AGENT_BIN, "run", "-f", dir_.File("job.yaml"), "--master-port", "0", "--grace-period", "5",
        "--termination-log", dir_.File("termination-log"), "--status-file",
        dir_.File("status.json")});
    return agent_->Wait(kTimeout);
  }
  nlohmann::json Parsed(const std::string& file) {
    return nlohmann::json::parse(ReadFile(dir_.File(file)), nullptr, false);
  }
  TempDir dir_;
  std::unique_ptr<TestProcess> agent_;
};

struct Pattern {
  const char* name;
  std::string line;
  std::string reason;
};

// What libraries print, one per cause the table knows.
const Pattern kPatterns[] = {
    {"GpuOutOfMemory", "RuntimeError: CUDA error: out of memory", "GpuOutOfMemory"},
    {"CollectiveTimeout",
     "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, "
     "OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.",
     "CollectiveTimeout"},
    {"CollectiveError",
     "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
     "peer [127.0.0.1]:29500",
     "CollectiveError"},
    {"LoaderWorkerKilled",
     "RuntimeError: DataLoader worker (pid 4321) is killed by signal: Killed.",
     "LoaderWorkerKilled"},
    {"ShmExhausted",
     "ERROR: Unexpected bus error encountered in worker. This might be caused by "
     "insufficient shared memory (shm).",
     "ShmExhausted"},
    {"ImportError", "ModuleNotFoundError: No module named 'timm'", "ImportError"},
    {"PythonException", "ValueError: loss is NaN at step 12", "UserError"},
};

class RankPatternTest : public FailureWordsTest, public ::testing::WithParamInterface<Pattern> {};

TEST_P(RankPatternTest, TheTerminationLogNamesTheCauseQuotesTheLineAndKeepsTheTail) {
  const Pattern& p = GetParam();
  // A traceback as Python prints it, on stderr; progress on stdout.
  const std::string script =
      "echo 'epoch 1 done'; echo 'epoch 2 starting' >&2; "
      "echo 'Traceback (most recent call last):' >&2; "
      "echo '  File \"train.py\", line 7, in <module>' >&2; "
      "printf '%s\\n' " +
      nlohmann::json(p.line).dump() + " >&2; exit 3";
  EXPECT_EQ(RunRankOne(script), 1) << agent_->Stderr();
  nlohmann::json log = Parsed("termination-log");
  ASSERT_TRUE(log.is_object()) << ReadFile(dir_.File("termination-log"));
  EXPECT_EQ(log["rank"], 1);
  EXPECT_EQ(log["exitCode"], 3);
  EXPECT_EQ(log["reason"], p.reason);
  EXPECT_EQ(log["line"], p.line);
  EXPECT_THAT(log["message"].get<std::string>(), HasSubstr("\"" + p.line + "\""));
  EXPECT_THAT(log["message"].get<std::string>(), HasSubstr("(exit code 3)"));
  EXPECT_EQ(log["logStream"], "stderr");
  const std::string tail = log["logTail"].get<std::string>();
  EXPECT_EQ(tail,
            "epoch 2 starting\nTraceback (most recent call last):\n  File \"train.py\", "
            "line 7, in <module>\n" +
                p.line);
  EXPECT_TRUE(log.contains("failedAt"));
  // The agent's last line says it too, and so does the status document.
  EXPECT_THAT(agent_->Stderr(), HasSubstr("reason " + p.reason + ": "));
  nlohmann::json status = Parsed("status.json");
  ASSERT_TRUE(status.is_object());
  EXPECT_EQ(status["lastFailure"]["reason"], p.reason);
  EXPECT_EQ(status["lastFailure"]["logTail"], tail);
}

INSTANTIATE_TEST_SUITE_P(Causes, RankPatternTest, ::testing::ValuesIn(kPatterns),
                         [](const auto& info) { return std::string(info.param.name); });

TEST_F(FailureWordsTest, ARankSilentOnStderrGivesItsStdout) {
  EXPECT_EQ(RunRankOne("echo 'step 1'; echo 'CUDA out of memory. Tried to allocate 2.00 GiB'; "
                       "exit 1"),
            1)
      << agent_->Stderr();
  nlohmann::json log = Parsed("termination-log");
  EXPECT_EQ(log["reason"], "GpuOutOfMemory");
  EXPECT_EQ(log["logStream"], "stdout");
  EXPECT_EQ(log["logTail"], "step 1\nCUDA out of memory. Tried to allocate 2.00 GiB");
}

// A real Python traceback (chained): the last exception is quoted.
TEST_F(FailureWordsTest, APythonRanksLastExceptionIsQuoted) {
  WriteFile(dir_.File("job.yaml"), Job(1, 1, "/usr/bin/python3",
                                       {"-c",
                                        "def load(i):\n    return {}['batch']\n"
                                        "try:\n    load(3)\nexcept KeyError:\n"
                                        "    raise RuntimeError('loss is NaN at step 12')\n"},
                                       0));
  EXPECT_EQ(Run(), 1) << agent_->Stderr();
  nlohmann::json log = Parsed("termination-log");
  EXPECT_EQ(log["reason"], "UserError");
  EXPECT_EQ(log["exception"], "RuntimeError");
  EXPECT_EQ(log["line"], "RuntimeError: loss is NaN at step 12");
  EXPECT_EQ(log["message"],
            "uncaught exception: \"RuntimeError: loss is NaN at step 12\" (exit code 1)");
  EXPECT_THAT(log["logTail"].get<std::string>(), HasSubstr("KeyError: 'batch'"));
}

// restartPolicy.retryOn names a cause: an out-of-memory exit 1 restarts, and the next
// attempt (the rank succeeds on restart) finishes the job.
TEST_F(FailureWordsTest, RetryOnRestartsACauseItNames) {
  WriteFile(dir_.File("job.yaml"),
            Job(1, 2, "/bin/sh",
                {"-c",
                 "if [ \"$TORCHELASTIC_RESTART_COUNT\" != 0 ]; then exit 0; fi; "
                 "if [ \"$RANK\" = 1 ]; then echo 'CUDA out of memory' >&2; exit 1; fi; "
                 "exec sleep 60"},
                1, "[GpuOutOfMemory]"));
  EXPECT_EQ(Run(), 0) << agent_->Stderr();
  EXPECT_THAT(agent_->Stderr(), HasSubstr("restart 1 of 1 now; after: rank 1"));
  EXPECT_THAT(agent_->Stderr(), HasSubstr("reason GpuOutOfMemory"));
}

TEST_F(FailureWordsTest, ARankWithoutWordsKeepsItsExitCodesCause) {
  EXPECT_EQ(RunRankOne("exit 3"), 1) << agent_->Stderr();
  nlohmann::json log = Parsed("termination-log");
  EXPECT_EQ(log["reason"], "UserError");
  EXPECT_EQ(log["message"], "user error: exited with code 3");
  EXPECT_FALSE(log.contains("logTail"));
  EXPECT_FALSE(log.contains("line"));
}

// 20,000 lines: the termination log keeps the last ones in its 4 KiB, whole lines after a
// "..." marker, valid UTF-8 (every line holds a two-byte character).
TEST_F(FailureWordsTest, ALongTailIsTrimmedFromTheFrontAndStaysValidUtf8) {
  EXPECT_EQ(RunRankOne("i=0; while [ $i -lt 20000 ]; do echo \"ünïcode line $i\" >&2; "
                       "i=$((i+1)); done; echo 'RuntimeError: CUDA error: out of memory' >&2; "
                       "exit 1"),
            1)
      << agent_->Stderr().substr(0, 500);
  const std::string text = ReadFile(dir_.File("termination-log"));
  EXPECT_LE(text.size(), 4001u);
  nlohmann::json log = nlohmann::json::parse(text, nullptr, false);
  ASSERT_TRUE(log.is_object()) << text;
  const std::string tail = log["logTail"].get<std::string>();
  EXPECT_EQ(tail.rfind("...\nünïcode line ", 0), 0u) << tail;
  EXPECT_THAT(tail, EndsWith("ünïcode line 19999\nRuntimeError: CUDA error: out of memory"));
  EXPECT_EQ(log["reason"], "GpuOutOfMemory");
}

// Bytes that are no text (and a NUL, escapes, a lone continuation byte) on stderr: the
// termination log and the status document are still one valid JSON object each.
TEST_F(FailureWordsTest, BinaryGarbageOnStderrDoesNotBreakTheStatusWrite) {
  EXPECT_EQ(RunRankOne("i=0; while [ $i -lt 200 ]; do printf '\\377\\376\\200\\000\\033[31m"
                       "\\300\\257\\355\\240\\200 garbage\\n' >&2; i=$((i+1)); done; "
                       "printf 'Bus error \\377\\n' >&2; exit 1"),
            1)
      << agent_->Stderr().substr(0, 500);
  for (const char* file : {"termination-log", "status.json"}) {
    const std::string text = ReadFile(dir_.File(file));
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    ASSERT_TRUE(j.is_object()) << file << ": " << text.substr(0, 300);
  }
  nlohmann::json log = Parsed("termination-log");
  EXPECT_EQ(log["reason"], "ShmExhausted");
  EXPECT_EQ(log["line"], "Bus error \xEF\xBF\xBD");
  EXPECT_THAT(log["logTail"].get<std::string>(), HasSubstr(" garbage\n"));
  nlohmann::json status = Parsed("status.json");
  EXPECT_EQ(status["lastFailure"]["reason"], "ShmExhausted");
  EXPECT_THAT(agent_->Stderr(), HasSubstr("failed: rank 1 (local rank 1"));
}

// Node 0's rank is SIGKILLed; node 1's rank then fails with gloo's "Connection closed by
// peer" (exit 1, not retryable by itself). The kill is the cause: the job restarts, and the
// gloo error is recorded as its consequence when node 1's agent got to report it.
class KillThenGlooTest : public ::testing::TestWithParam<const char*> {};

TEST_P(KillThenGlooTest, TheKillIsTheCauseAndTheJobRestarts) {
  const std::string order = GetParam();
  TempDir dir;
  WriteFile(dir.File("job.yaml"),
            Job(2, 1, "/usr/bin/python3", {KILL_THEN_GLOO_PY, dir.path(), order}, 1));
  TestProcess agent({AGENT_BIN, "run", "-f", dir.File("job.yaml"), "--master-port", "0",
                     "--grace-period", "20", "--status-file", dir.File("status.json")});
  ASSERT_EQ(agent.Wait(kTimeout), 0) << agent.Stderr();
  const std::string err = agent.Stderr();
  EXPECT_THAT(err, HasSubstr("restart 1 of 1 now; after: rank 0 (local rank 0, node 0"));
  EXPECT_THAT(err, HasSubstr("exit code 137 (SIGKILL), reason Killed"));
  EXPECT_THAT(err, HasSubstr("all nodes succeeded, restarts 1"));
  nlohmann::json status = nlohmann::json::parse(ReadFile(dir.File("status.json")), nullptr, false);
  ASSERT_TRUE(status.is_object());
  const nlohmann::json& last = status["lastFailure"];
  EXPECT_EQ(last["rank"], 0);
  EXPECT_EQ(last["reason"], "Killed");
  if (order == "consequence-first") {
    // Node 1's gloo error reached the gang's coordinator first (node 0's agent was held
    // stopped until it had): it is recorded as the kill's consequence.
    EXPECT_THAT(err, HasSubstr("reason CollectiveError: a collective failed: \"RuntimeError: "));
    ASSERT_TRUE(last.contains("consequences")) << last.dump();
    EXPECT_EQ(last["consequences"][0]["rank"], 1);
    EXPECT_EQ(last["consequences"][0]["reason"], "CollectiveError");
    EXPECT_THAT(last["consequences"][0]["line"].get<std::string>(),
                HasSubstr("Connection closed by peer"));
  }
  if (order == "cause-first") {
    EXPECT_THAT(err, Not(HasSubstr("the cause came first")));
    EXPECT_THAT(err, Not(HasSubstr("reason CollectiveError")));
  }
}

INSTANTIATE_TEST_SUITE_P(Orders, KillThenGlooTest,
                         ::testing::Values("cause-first", "consequence-first", "race"),
                         [](const auto& info) {
                           std::string name = info.param;
                           name.erase(std::remove(name.begin(), name.end(), '-'), name.end());
                           return name;
                         });

// Rank 1 raises and prints its traceback, and is still finalizing when rank 0 fails with
// gloo's "Connection closed by peer" (as a peer does once the failing rank's connections
// close). The agent that would stop rank 1 then waits for it instead, so the job's cause is
// the exception and the gloo error its consequence; stopped at once, the rank would count as
// "stopped" and the gloo error would be the cause. Across 2 nodes the stop comes from the
// gang's coordinator (agent/run/gang_stop_check.h); on one node (as a notebook's
// spawnpoint.launch runs its ranks) from the node's own Gang (GangOptions::dying_wait).
class TracebackThenGlooTest : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(TracebackThenGlooTest, ARankFinalizingAfterItsTracebackIsTheCauseNotItsStoppedPeer) {
  const auto [nodes, ranks_per_node] = GetParam();
  TempDir dir;
  WriteFile(dir.File("job.yaml"), Job(nodes, ranks_per_node, "/usr/bin/python3",
                                      {TRACEBACK_THEN_GLOO_PY, dir.path()}, 1));
  TestProcess agent({AGENT_BIN, "run", "-f", dir.File("job.yaml"), "--master-port", "0",
                     "--grace-period", "20", "--status-file", dir.File("status.json")});
  ASSERT_EQ(agent.Wait(kTimeout), 1) << agent.Stderr();
  nlohmann::json status = nlohmann::json::parse(ReadFile(dir.File("status.json")), nullptr, false);
  ASSERT_TRUE(status.is_object());
  EXPECT_EQ(status["phase"], "Failed");
  EXPECT_EQ(status["restarts"], 0) << "a user error is not retried";
  const nlohmann::json& last = status["lastFailure"];
  EXPECT_EQ(last["rank"], 1) << last.dump() << agent.Stderr();
  EXPECT_EQ(last["nodeRank"], nodes == 2 ? 1 : 0);
  EXPECT_EQ(last["reason"], "UserError");
  EXPECT_EQ(last["exitCode"], 1);
  EXPECT_EQ(last["exception"], "RuntimeError");
  EXPECT_THAT(last["line"].get<std::string>(), HasSubstr("the rank's own failure"));
  ASSERT_TRUE(last.contains("consequences")) << last.dump();
  EXPECT_EQ(last["consequences"][0]["rank"], 0);
  EXPECT_EQ(last["consequences"][0]["reason"], "CollectiveError");
}

INSTANTIATE_TEST_SUITE_P(Layouts, TracebackThenGlooTest,
                         ::testing::Values(std::pair{2, 1}, std::pair{1, 2}), [](const auto& info) {
                           return info.param.first == 2 ? std::string("TwoNodes")
                                                        : std::string("OneNode");
                         });

}  // namespace
}  // namespace spawnpoint::testing
