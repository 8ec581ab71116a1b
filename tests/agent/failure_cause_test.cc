// The rank's last words (issue 16): the pattern table one row at a time, the last Python
// traceback, how the tail refines the exit's cause, the root cause among an attempt's
// failures, the bounded tail and the UTF-8 it hands out.
#include "agent/supervisor/failure_cause.h"

#include <algorithm>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/run/attempt_decision.h"
#include "agent/run/report.h"
#include "agent/supervisor/log_tail.h"
#include "api/restart_rule.h"
#include "common/text.h"

namespace spawnpoint::agent {
namespace {

using ::testing::HasSubstr;

struct Row {
  const char* name;
  std::vector<std::string> lines;
  ExitReason reason;
  std::string quoted;     // the line the cause quotes
  std::string exception;  // "" when the line is not a Python exception's
};

// One case per row of the table (and the traceback), each with a line as the library prints it.
const Row kRows[] = {
    {"CudaOutOfMemory",
     {"epoch 3", "Traceback (most recent call last):", "  File \"train.py\", line 9, in <module>",
      "    loss.backward()",
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.77 GiB "
      "total capacity)"},
     ExitReason::kGpuOutOfMemory,
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.77 GiB "
     "total capacity)",
     "torch.OutOfMemoryError"},
    {"CudaErrorOutOfMemory",
     {"RuntimeError: CUDA error: out of memory",
      "CUDA kernel errors might be asynchronously "
      "reported"},
     ExitReason::kGpuOutOfMemory,
     "RuntimeError: CUDA error: out of memory",
     "RuntimeError"},
    {"HipOutOfMemory",
     {"HIP out of memory. Tried to allocate 20.00 MiB"},
     ExitReason::kGpuOutOfMemory,
     "HIP out of memory. Tried to allocate 20.00 MiB",
     ""},
    {"BusError",
     {"RuntimeError: DataLoader worker (pid 4242) is killed by signal: Bus error. It is possible "
      "that dataloader's workers are out of shared memory."},
     ExitReason::kShmExhausted,
     "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Bus error. It is possible "
     "that dataloader's workers are out of shared memory.",
     "RuntimeError"},
    {"NoSpaceInDevShm",
     {"OSError: [Errno 28] No space left on device: '/dev/shm/torch_1_2'"},
     ExitReason::kShmExhausted,
     "OSError: [Errno 28] No space left on device: '/dev/shm/torch_1_2'",
     "OSError"},
    // The loader's own words for a /dev/shm too full for its ring (agent/loader/shm_ring.cc),
    // which named no cause (UserError, not retryable): found by the chaos run (tests/chaos), a
    // rank restarted while /dev/shm was nearly full.
    {"LoaderRingNoRoom",
     {"rank 0: loader: loader of rank 0: shared memory: the data loader's shared-memory ring "
      "needs 64Ki (8 slots x 8Ki) in /dev/shm, which has 0 free"},
     ExitReason::kShmExhausted,
     "rank 0: loader: loader of rank 0: shared memory: the data loader's shared-memory ring "
     "needs 64Ki (8 slots x 8Ki) in /dev/shm, which has 0 free",
     ""},
    {"LoaderRingReserveFailed",
     {"loader: shared memory: reserving the ring failed (ENOSPC): the data loader's "
      "shared-memory ring needs 1Mi (8 slots x 128Ki) in /dev/shm, which has 4Ki free"},
     ExitReason::kShmExhausted,
     "loader: shared memory: reserving the ring failed (ENOSPC): the data loader's "
     "shared-memory ring needs 1Mi (8 slots x 128Ki) in /dev/shm, which has 4Ki free",
     ""},
    {"LoaderWorkerKilled",
     {"RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed."},
     ExitReason::kLoaderWorkerKilled,
     "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.",
     "RuntimeError"},
    {"LoaderWorkersExited",
     {"RuntimeError: DataLoader worker (pid(s) 11, 12) exited unexpectedly"},
     ExitReason::kLoaderWorkerKilled,
     "RuntimeError: DataLoader worker (pid(s) 11, 12) exited unexpectedly",
     "RuntimeError"},
    {"NcclWatchdog",
     {"[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
      "OpType=ALLREDUCE) ran for 600012 milliseconds before timing out."},
     ExitReason::kCollectiveTimeout,
     "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
     "OpType=ALLREDUCE) ran for 600012 milliseconds before timing out.",
     ""},
    {"GlooTimeout",
     {"RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
      "waiting 1800000ms for recv operation to complete"},
     ExitReason::kCollectiveTimeout,
     "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
     "waiting 1800000ms for recv operation to complete",
     "RuntimeError"},
    {"StoreTimeout",
     {"torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 "
      "clients joined."},
     ExitReason::kCollectiveTimeout,
     "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 "
     "clients joined.",
     "torch.distributed.DistStoreError"},
    {"GlooPeerClosed",
     {"RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
      "peer [127.0.0.1]:41213"},
     ExitReason::kCollectiveError,
     "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
     "peer [127.0.0.1]:41213",
     "RuntimeError"},
    {"NcclError",
     {"torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1275, remote "
      "process exited or there was a network error, NCCL version 2.18.1"},
     ExitReason::kCollectiveError,
     "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1275, remote "
     "process exited or there was a network error, NCCL version 2.18.1",
     "torch.distributed.DistBackendError"},
    {"ModuleNotFound",
     {"Traceback (most recent call last):", "  File \"train.py\", line 1, in <module>",
      "ModuleNotFoundError: No module named 'timm'"},
     ExitReason::kImportError,
     "ModuleNotFoundError: No module named 'timm'",
     "ModuleNotFoundError"},
    {"SharedLibrary",
     {"./trainer: error while loading shared libraries: libtorch.so: cannot open shared object "
      "file: No such file or directory"},
     ExitReason::kImportError,
     "./trainer: error while loading shared libraries: libtorch.so: cannot open shared object "
     "file: No such file or directory",
     ""},
    {"PortInUse",
     {"Traceback (most recent call last):", "  File \"train.py\", line 5, in <module>",
      "    store = _create_c10d_store(master_addr, master_port, rank, world_size, timeout)",
      "RuntimeError: The server socket has failed to listen on any local network address. The "
      "server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use)."},
     ExitReason::kPortInUse,
     "RuntimeError: The server socket has failed to listen on any local network address. The "
     "server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use).",
     "RuntimeError"},
    // agent/python/spawnpoint_rank/_report.py's fatal(): the shim stopped the rank itself.
    {"ShimStopped",
     {"spawnpoint-shim: fatal: t.py:3 starts a spawn process at the script's top level"},
     ExitReason::kUserError,
     "spawnpoint-shim: fatal: t.py:3 starts a spawn process at the script's top level",
     ""},
    {"LastTraceback",
     {"Traceback (most recent call last):", "  File \"a.py\", line 3, in <module>",
      "KeyError: 'first'", "",
      "During handling of the above exception, another exception "
      "occurred:",
      "", "Traceback (most recent call last):", "  File \"a.py\", line 5, in <module>",
      "    raise RuntimeError('loss is NaN at step 12')", "    ^^^^^^^^^^^^^",
      "RuntimeError: loss is NaN at step 12", "[W shutdown] process group destroyed"},
     ExitReason::kUserError,
     "RuntimeError: loss is NaN at step 12",
     "RuntimeError"},
};

class PatternRowTest : public ::testing::TestWithParam<Row> {};

TEST_P(PatternRowTest, NamesItsCauseAndQuotesTheLine) {
  const Row& row = GetParam();
  std::optional<TailMatch> m = MatchTail(row.lines);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(ExitReasonName(m->reason), std::string(ExitReasonName(row.reason)));
  EXPECT_EQ(m->line, row.quoted);
  EXPECT_EQ(m->exception, row.exception);
  EXPECT_THAT(m->message, HasSubstr("\"" + row.quoted + "\""));
}

INSTANTIATE_TEST_SUITE_P(Table, PatternRowTest, ::testing::ValuesIn(kRows),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(PatternTableTest, EveryRowOfTheTableHasACase) {
  std::set<std::string> tested;
  for (const Row& row : kRows) {
    if (auto m = MatchTail(row.lines)) tested.insert(m->message.substr(0, m->message.find(':')));
  }
  for (const CausePattern& p : CausePatterns()) EXPECT_TRUE(tested.count(p.what)) << p.what;
}

TEST(PatternTableTest, PlainOutputNamesNothing) {
  EXPECT_FALSE(MatchTail({"epoch 1 loss 0.3", "epoch 2 loss 0.2", "saving checkpoint"}));
  EXPECT_FALSE(MatchTail({}));
  // "timeout" and "connection reset" are collective only where a backend says so.
  EXPECT_FALSE(MatchTail({"requests.exceptions timeout while downloading",
                          "Connection reset by "
                          "peer (http)"}));
  // An unindented word after a traceback's header that is no exception still quotes it.
  auto m = MatchTail({"Traceback (most recent call last):", "  File \"x.py\"", "Killed"});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->line, "Killed");
  EXPECT_EQ(m->exception, "");
}

TEST(PatternTableTest, AnEarlierRowWinsOverALaterLine) {
  // The OOM explains the gloo error its peer saw later in the same log.
  auto m = MatchTail({"CUDA error: out of memory",
                      "RuntimeError: [gloo/transport/tcp/pair.cc:1] "
                      "Connection closed by peer"});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->reason, ExitReason::kGpuOutOfMemory);
}

TEST(PatternTableTest, AQuotedLineIsTrimmedAndBounded) {
  auto m = MatchTail({"   CUDA error: out of memory " + std::string(1000, 'x') + "  "});
  ASSERT_TRUE(m);
  EXPECT_LE(m->line.size(), kMaxQuotedLineBytes);
  EXPECT_EQ(m->line.rfind("CUDA error", 0), 0u);
  EXPECT_EQ(m->line.substr(m->line.size() - 3), "...");
}

TEST(RefineWithTailTest, ARankThatExitedOrCrashedTakesTheTailsCause) {
  TailMatch oom{ExitReason::kGpuOutOfMemory, "CUDA error: out of memory", "",
                "GPU out of memory: \"CUDA error: out of memory\""};
  ExitStatus exited{3, 0};
  ExitCause c = RefineWithTail(ClassifyExit(exited, 0, 0), exited, oom);
  EXPECT_EQ(c.reason, ExitReason::kGpuOutOfMemory);
  EXPECT_EQ(c.line, "CUDA error: out of memory");
  EXPECT_THAT(c.message, HasSubstr("(exit code 3)"));
  ExitStatus aborted{0, SIGABRT};
  c = RefineWithTail(ClassifyExit(aborted, 0, 0), aborted, oom);
  EXPECT_EQ(c.reason, ExitReason::kGpuOutOfMemory);
  EXPECT_THAT(c.message, HasSubstr("then SIGABRT"));
  // No match: the exit's cause as it was.
  c = RefineWithTail(ClassifyExit(exited, 0, 0), exited, std::nullopt);
  EXPECT_EQ(c.reason, ExitReason::kUserError);
  EXPECT_EQ(c.message, "user error: exited with code 3");
}

TEST(RefineWithTailTest, CausesFromOutsideTheRankStay) {
  TailMatch gloo{ExitReason::kCollectiveError, "gloo/transport: Connection closed by peer", "",
                 "a collective failed: ..."};
  ExitStatus killed{0, SIGKILL};
  EXPECT_EQ(RefineWithTail(ClassifyExit(killed, 0, 0), killed, gloo).reason, ExitReason::kKilled);
  EXPECT_EQ(RefineWithTail(ClassifyExit(killed, 1, 2), killed, gloo).reason,
            ExitReason::kOomKilled);
  ExitStatus term{0, SIGTERM};
  EXPECT_EQ(RefineWithTail(ClassifyExit(term, 0, 0), term, gloo).reason, ExitReason::kTerminated);
  // A SIGBUS keeps its own message and quotes a line that says the same.
  ExitStatus bus{0, SIGBUS};
  TailMatch shm{ExitReason::kShmExhausted, "Bus error", "", "shared memory exhausted: ..."};
  ExitCause c = RefineWithTail(ClassifyExit(bus, 0, 0), bus, shm);
  EXPECT_EQ(c.reason, ExitReason::kShmExhausted);
  EXPECT_THAT(c.message, HasSubstr("raise spec.shmSize"));
  EXPECT_EQ(c.line, "Bus error");
  EXPECT_EQ(RefineWithTail(ClassifyExit(bus, 0, 0), bus, gloo).line, "");
}

RankFailure Failed(int rank, int node, ExitStatus status, ExitReason reason, int64_t at) {
  RankFailure f;
  f.rank = rank;
  f.node_rank = node;
  f.status = status;
  f.cause.reason = reason;
  f.failed_at_ms = at;
  return f;
}

TEST(PickRootCauseTest, TheEarliestFailureIsTheCauseAndItsPeersAreConsequences) {
  // Node 1's gloo error was seen first by the parent, but node 0's kill came first.
  RankFailure gloo = Failed(1, 1, {1, 0}, ExitReason::kCollectiveError, 2000);
  gloo.cause.line = "Connection closed by peer";
  RankFailure kill = Failed(0, 0, {0, SIGKILL}, ExitReason::kKilled, 1500);
  RankFailure root = PickRootCause({gloo, kill});
  EXPECT_EQ(root.rank, 0);
  EXPECT_EQ(root.cause.reason, ExitReason::kKilled);
  ASSERT_EQ(root.consequences.size(), 1u);
  EXPECT_EQ(root.consequences[0].rank, 1);
  EXPECT_EQ(root.consequences[0].reason, "CollectiveError");
  EXPECT_EQ(root.consequences[0].line, "Connection closed by peer");
  EXPECT_EQ(root.consequences[0].exit_code, 1);
  // In the other order too.
  EXPECT_EQ(PickRootCause({kill, gloo}).rank, 0);
}

TEST(PickRootCauseTest, ACollectiveErrorYieldsToAnyOtherReasonAndUnknownTimesComeLast) {
  RankFailure gloo = Failed(1, 1, {1, 0}, ExitReason::kCollectiveTimeout, 1000);
  RankFailure crash = Failed(0, 0, {0, SIGSEGV}, ExitReason::kCrashed, 1000);
  EXPECT_EQ(PickRootCause({gloo, crash}).rank, 0);
  // Node 0's agent saw its rank's kill after node 1's agent saw the gloo error it caused
  // (node 0's agent was slow): the kill is still the cause.
  RankFailure late_kill = Failed(0, 0, {0, SIGKILL}, ExitReason::kKilled, 1800);
  RankFailure early_gloo = Failed(1, 1, {1, 0}, ExitReason::kCollectiveError, 1200);
  EXPECT_EQ(PickRootCause({early_gloo, late_kill}).rank, 0);
  // Of two collective errors, the earlier.
  RankFailure other_gloo = Failed(2, 1, {1, 0}, ExitReason::kCollectiveError, 900);
  EXPECT_EQ(PickRootCause({gloo, other_gloo}).rank, 2);
  RankFailure unknown = Failed(2, 0, {0, SIGKILL}, ExitReason::kKilled, 0);
  EXPECT_EQ(PickRootCause({unknown, crash}).rank, 0);
  // A lone collective error is its own cause.
  RankFailure alone = PickRootCause({gloo});
  EXPECT_EQ(alone.rank, 1);
  EXPECT_TRUE(alone.consequences.empty());
}

TEST(PickRootCauseTest, ConsequencesANodeReportedAreKept) {
  RankFailure node0 = Failed(0, 0, {0, SIGKILL}, ExitReason::kKilled, 1000);
  node0.consequences.push_back({1, 0, 1, "CollectiveError", "gloo"});
  RankFailure node1 = Failed(2, 1, {1, 0}, ExitReason::kCollectiveError, 1200);
  RankFailure root = PickRootCause({node1, node0});
  EXPECT_EQ(root.rank, 0);
  ASSERT_EQ(root.consequences.size(), 2u);
  EXPECT_EQ(root.consequences[0].rank, 1) << "its own first";
  EXPECT_EQ(root.consequences[1].rank, 2);
}

// `agent run` on local nodes weighs its node agents' reports, and each names the gang's
// cause with its consequences: every rank's failure is listed once, and never the cause's own.
TEST(PickRootCauseTest, EachRanksFailureIsListedOnceAndTheCauseNotAsItsOwnConsequence) {
  RankFailure from_node0 = Failed(1, 1, {1, 0}, ExitReason::kUserError, 1000);
  from_node0.consequences.push_back({0, 0, 1, "CollectiveError", "gloo"});
  RankFailure from_node1 = from_node0;
  from_node1.failed_at_ms = 1100;
  RankFailure root = PickRootCause({from_node1, from_node0});
  EXPECT_EQ(root.rank, 1);
  EXPECT_EQ(root.node_rank, 1);
  ASSERT_EQ(root.consequences.size(), 1u);
  EXPECT_EQ(root.consequences[0].rank, 0);
  EXPECT_EQ(root.consequences[0].reason, "CollectiveError");
}

TEST(LogTailTest, KeepsTheLastLinesWithinItsBounds) {
  LogTail tail(/*max_lines=*/3, /*max_bytes=*/1000);
  for (int i = 0; i < 10; ++i) tail.Add("line " + std::to_string(i));
  EXPECT_EQ(tail.Lines(), (std::vector<std::string>{"line 7", "line 8", "line 9"}));
  LogTail bytes(/*max_lines=*/100, /*max_bytes=*/20);
  for (int i = 0; i < 10; ++i) bytes.Add("0123456789");
  EXPECT_EQ(bytes.Lines().size(), 2u);
  // A progress bar's carriage returns: its last state.
  LogTail bar;
  bar.Add("10%\r50%\r100%");
  EXPECT_EQ(bar.Lines(), (std::vector<std::string>{"100%"}));
}

TEST(LogTailTest, TextIsTrimmedFromTheFrontAtALineAndStaysValidUtf8) {
  LogTail tail;
  for (int i = 0; i < 100; ++i) tail.Add("héllo wörld line " + std::to_string(i));
  const std::string text = tail.Text(/*max_lines=*/30, /*max_bytes=*/200);
  EXPECT_LE(text.size(), 200u);
  EXPECT_EQ(text.rfind("...\n", 0), 0u) << text;
  EXPECT_EQ(text.substr(4, 5), "héll") << "whole lines after the marker: " << text;
  EXPECT_THAT(text, ::testing::EndsWith("line 99"));
  EXPECT_EQ(ValidUtf8(text), text);
  EXPECT_EQ(tail.Text(2, 4096), "...\nhéllo wörld line 98\nhéllo wörld line 99");
}

TEST(LogTailTest, BinaryGarbageComesOutAsValidUtf8) {
  LogTail tail;
  tail.Add(std::string("\xff\xfe\x80 bin \xc3", 8) + std::string(1, '\0') + "\xed\xa0\x80 end");
  const std::string text = tail.Text(30, 4096);
  EXPECT_EQ(ValidUtf8(text), text);
  EXPECT_THAT(text, HasSubstr(" bin "));
  EXPECT_THAT(text, HasSubstr(" end"));
  EXPECT_THAT(text, HasSubstr("\xEF\xBF\xBD"));
}

TEST(TextTest, ValidUtf8ReplacesEachBadByteAndKeepsGoodSequences) {
  EXPECT_EQ(ValidUtf8("plain"), "plain");
  EXPECT_EQ(ValidUtf8("h\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
            "h\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(ValidUtf8("\x80"), "\xEF\xBF\xBD");
  EXPECT_EQ(ValidUtf8("a\xc3"), "a\xEF\xBF\xBD");                // truncated
  EXPECT_EQ(ValidUtf8("\xc0\xaf"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong
  EXPECT_EQ(ValidUtf8("\xed\xa0\x80").size(), 9u);               // a surrogate: 3 bytes
  EXPECT_EQ(ValidUtf8("\xf4\x90\x80\x80").size(), 12u);          // past U+10FFFF
}

TEST(TextTest, KeepEndAndKeepStartNeverSplitACharacter) {
  const std::string euros = "\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac";  // three 3-byte characters
  EXPECT_EQ(KeepEnd(euros, 9, ".."), euros);
  EXPECT_EQ(KeepEnd(euros, 7, ".."), "..\xe2\x82\xac");
  EXPECT_EQ(KeepStart(euros, 7, ".."), "\xe2\x82\xac..");
  EXPECT_EQ(KeepEnd("a\nbb\nccc", 6, "."), ".ccc");
  EXPECT_EQ(KeepEnd("a\nbb\nccc", 7, "."), ".bb\nccc");
  EXPECT_EQ(KeepEnd("a\nbb\nccc", 8, "."), "a\nbb\nccc");
}

// restartPolicy.retryOn: causes as well as exit codes; without it, the default rule.
TEST(RetryOnTest, CausesAndCodesReplaceTheDefault) {
  api::RestartPolicy p;
  EXPECT_TRUE(api::IsRetryableFailure(p, 137, "Killed"));
  EXPECT_FALSE(api::IsRetryableFailure(p, 1, "CollectiveTimeout"));
  p.retry_on_causes = {"Killed", "OOMKilled", "CollectiveTimeout"};
  EXPECT_TRUE(api::IsRetryableFailure(p, 1, "CollectiveTimeout"));
  EXPECT_TRUE(api::IsRetryableFailure(p, 137, "Killed"));
  EXPECT_FALSE(api::IsRetryableFailure(p, 139, "Crashed")) << "the default 128-255 is replaced";
  EXPECT_FALSE(api::IsRetryableFailure(p, 1, ""));
  p.retry_on_exit_codes = {3};
  p.retryable_exit_codes = {42};
  EXPECT_TRUE(api::IsRetryableFailure(p, 3, "UserError"));
  EXPECT_TRUE(api::IsRetryableFailure(p, 42, "UserError"));
  // Every cause the agent reports is one retryOn accepts.
  for (int r = static_cast<int>(ExitReason::kUserError); r <= static_cast<int>(kLastExitReason);
       ++r) {
    const std::string name = ExitReasonName(static_cast<ExitReason>(r));
    EXPECT_NE(std::find(std::begin(api::kFailureCauses), std::end(api::kFailureCauses), name),
              std::end(api::kFailureCauses))
        << name;
    EXPECT_EQ(ExitReasonFromName(name), static_cast<ExitReason>(r));
  }
}

TEST(RetryOnTest, TheAgentRestartsACauseListedInRetryOn) {
  api::RestartPolicy p;
  p.retry_on_causes = {"CollectiveTimeout"};
  GangResult result;
  result.outcome = GangOutcome::kFailed;
  result.failure = RankFailure{};
  result.failure->status = {1, 0};
  result.failure->cause.reason = ExitReason::kCollectiveTimeout;
  AttemptDecision d = Decide(result, 0, p, /*owns_gang=*/true, /*quick=*/1);
  EXPECT_TRUE(d.restart);
  EXPECT_EQ(d.reason, "CollectiveTimeout");
  result.failure->cause.reason = ExitReason::kGpuOutOfMemory;
  d = Decide(result, 0, p, true, 1);
  EXPECT_FALSE(d.restart);
  EXPECT_EQ(d.message, "exit code 1 is not retryable, nor GpuOutOfMemory in restartPolicy.retryOn");
}

// The termination message: Kubernetes keeps 4 KiB of it and the operator parses it as JSON.
RankFailure OomWithATail(const std::string& tail) {
  RankFailure f;
  f.rank = 1;
  f.status = {1, 0};
  ExitStatus exited{1, 0};
  f.cause = RefineWithTail(ClassifyExit(exited, 0, 0), exited,
                           MatchTail({"RuntimeError: CUDA error: out of memory"}));
  f.log_tail = tail;
  f.log_stream = "stderr";
  f.failed_at_ms = 1'700'000'000'123;
  return f;
}

TEST(TerminationMessageTest, ALongTailIsTrimmedFromTheFrontAndTheRestStays) {
  std::string tail;
  for (int i = 0; i < 400; ++i) tail += "step " + std::to_string(i) + " \"quoted\" \t ok\n";
  tail += "RuntimeError: CUDA error: out of memory";
  RankFailure f = OomWithATail(tail);
  f.stack = std::string(3000, 's');
  const std::string text = FitTerminationMessage(f.ToJson(), kTerminationMessageLimit);
  EXPECT_LE(text.size(), kTerminationMessageLimit);
  auto j = nlohmann::json::parse(text, nullptr, false);
  ASSERT_TRUE(j.is_object()) << text;
  EXPECT_EQ(j["reason"], "GpuOutOfMemory");
  EXPECT_EQ(j["line"], "RuntimeError: CUDA error: out of memory");
  EXPECT_THAT(j["message"].get<std::string>(), HasSubstr("\"RuntimeError: CUDA error: out of"));
  EXPECT_EQ(j["failedAt"], "2023-11-14T22:13:20.123Z");
  const std::string kept = j["logTail"].get<std::string>();
  EXPECT_EQ(kept.rfind("...\nstep ", 0), 0u) << "whole lines, the oldest dropped: " << kept;
  EXPECT_THAT(kept, ::testing::EndsWith("RuntimeError: CUDA error: out of memory"));
  EXPECT_GT(kept.size(), 200u) << "the tail gives way, not all of it";
}

TEST(TerminationMessageTest, BinaryGarbageStillMakesOneValidJsonObject) {
  std::string garbage;
  for (int i = 0; i < 6000; ++i) garbage += static_cast<char>((i * 37) % 256);
  RankFailure f = OomWithATail(garbage);
  f.cause.message = garbage;  // whatever a message holds
  const std::string text = FitTerminationMessage(f.ToJson(), kTerminationMessageLimit);
  EXPECT_LE(text.size(), kTerminationMessageLimit);
  EXPECT_EQ(ValidUtf8(text), text);
  auto j = nlohmann::json::parse(text, nullptr, false);
  ASSERT_TRUE(j.is_object()) << text.substr(0, 300);
  EXPECT_EQ(j["rank"], 1);
  EXPECT_EQ(j["reason"], "GpuOutOfMemory");
}

TEST(TerminationMessageTest, ASmallMessageIsLeftAlone) {
  RankFailure f = OomWithATail("a\nb");
  const nlohmann::json j = f.ToJson();
  EXPECT_EQ(FitTerminationMessage(j, kTerminationMessageLimit), j.dump());
  EXPECT_EQ(j["logTail"], "a\nb");
  EXPECT_EQ(j["logStream"], "stderr");
}

}  // namespace
}  // namespace spawnpoint::agent
