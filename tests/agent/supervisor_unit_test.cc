#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/run/node_facts.h"
#include "agent/run/preflight.h"
#include "agent/supervisor/exit_cause.h"
#include "agent/supervisor/process_table.h"
#include "api/restart_rule.h"
#include "tests/support/test_process.h"

namespace spawnpoint::agent {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

TEST(RestartPolicyTest, TheFirstQuickFailureRestartsAtOnceThenTheWaitDoublesAndIsCapped) {
  api::RestartPolicy p;
  p.backoff_seconds = 10;
  EXPECT_EQ(RestartBackoff(p, 1), milliseconds(0));
  EXPECT_EQ(RestartBackoff(p, 2), milliseconds(10'000));
  EXPECT_EQ(RestartBackoff(p, 3), milliseconds(20'000));
  EXPECT_EQ(RestartBackoff(p, 4), milliseconds(40'000));
  EXPECT_EQ(RestartBackoff(p, 7), milliseconds(300'000));
  EXPECT_EQ(RestartBackoff(p, 60), milliseconds(300'000));
  p.backoff_seconds = 0;
  EXPECT_EQ(RestartBackoff(p, 3), milliseconds(0));
}

// The schedule on a simulated timeline: only durations, no clock is read.
TEST(RestartPolicyTest, AFailureAfterAHealthyRunRestartsNowAndQuickOnesBackOff) {
  using std::chrono::seconds;
  api::RestartPolicy p;  // backoffSeconds 10, resetAfterSeconds 600
  int quick = 0;
  // A 2-hour run is preempted: restart at once.
  quick = QuickFailuresAfter(p, quick, seconds(7200));
  EXPECT_EQ(quick, 1);
  EXPECT_EQ(RestartBackoff(p, quick), milliseconds(0));
  EXPECT_EQ(RestartWhen(p, quick), "now");
  // Then it crashes 30 s into each attempt: 10 s, 20 s, 40 s ...
  quick = QuickFailuresAfter(p, quick, seconds(30));
  EXPECT_EQ(RestartBackoff(p, quick), milliseconds(10'000));
  EXPECT_EQ(RestartWhen(p, quick), "in 10s: 2nd quick failure in a row (attempts under 600s)");
  quick = QuickFailuresAfter(p, quick, seconds(30));
  EXPECT_EQ(RestartBackoff(p, quick), milliseconds(20'000));
  EXPECT_EQ(RestartWhen(p, quick), "in 20s: 3rd quick failure in a row (attempts under 600s)");
  quick = QuickFailuresAfter(p, quick, seconds(599));
  EXPECT_EQ(RestartBackoff(p, quick), milliseconds(40'000));
  // An attempt that runs resetAfterSeconds resets the count: the next failure restarts now.
  quick = QuickFailuresAfter(p, quick, seconds(600));
  EXPECT_EQ(quick, 1);
  EXPECT_EQ(RestartBackoff(p, quick), milliseconds(0));
  // The job's first attempt failing quickly is the first of a run too.
  EXPECT_EQ(QuickFailuresAfter(p, 0, seconds(1)), 1);
  // A shorter resetAfterSeconds forgets sooner.
  p.reset_after_seconds = 60;
  EXPECT_EQ(QuickFailuresAfter(p, 5, seconds(60)), 1);
  EXPECT_EQ(QuickFailuresAfter(p, 5, seconds(59)), 6);
  EXPECT_EQ(RestartWhen(p, 11), "in 300s: 11th quick failure in a row (attempts under 60s)");
  EXPECT_EQ(RestartWhen(p, 22), "in 300s: 22nd quick failure in a row (attempts under 60s)");
}

TEST(RestartPolicyTest, SignalsAreRetryableByDefaultAndUserErrorsAreNot) {
  api::RestartPolicy p;
  EXPECT_TRUE(IsRetryableExitCode(p, 137));
  EXPECT_TRUE(IsRetryableExitCode(p, 128));
  EXPECT_TRUE(IsRetryableExitCode(p, 255));
  EXPECT_FALSE(IsRetryableExitCode(p, 1));
  EXPECT_FALSE(IsRetryableExitCode(p, 127));
  p.retryable_exit_codes = {3};
  EXPECT_TRUE(IsRetryableExitCode(p, 3));
  EXPECT_FALSE(IsRetryableExitCode(p, 137));
}

TEST(RestartPolicyTest, RestartsStopAtMaxRestarts) {
  api::RestartPolicy p;
  p.max_restarts = 2;
  EXPECT_TRUE(ShouldRestart(p, 0, 137));
  EXPECT_TRUE(ShouldRestart(p, 1, 137));
  EXPECT_FALSE(ShouldRestart(p, 2, 137));
  EXPECT_FALSE(ShouldRestart(p, 0, 1));
}

TEST(ExitCauseTest, ClassifiesEachWayARankEnds) {
  EXPECT_EQ(ClassifyExit({0, 0}, {}, {}).reason, ExitReason::kSucceeded);
  auto user = ClassifyExit({3, 0}, {}, {});
  EXPECT_EQ(user.reason, ExitReason::kUserError);
  EXPECT_THAT(user.message, HasSubstr("exited with code 3"));
  EXPECT_EQ(ClassifyExit({0, SIGKILL}, 2, 2).reason, ExitReason::kKilled);
  EXPECT_EQ(ClassifyExit({0, SIGKILL}, {}, {}).reason, ExitReason::kKilled);
  auto oom = ClassifyExit({0, SIGKILL}, 2, 3);
  EXPECT_EQ(oom.reason, ExitReason::kOomKilled);
  EXPECT_THAT(oom.message, HasSubstr("from 2 to 3"));
  auto bus = ClassifyExit({0, SIGBUS}, {}, {});
  EXPECT_EQ(bus.reason, ExitReason::kShmExhausted);
  EXPECT_THAT(bus.message, HasSubstr("spec.shmSize"));
  EXPECT_EQ(ClassifyExit({0, SIGTERM}, {}, {}).reason, ExitReason::kTerminated);
  auto segv = ClassifyExit({0, SIGSEGV}, {}, {});
  EXPECT_EQ(segv.reason, ExitReason::kCrashed);
  EXPECT_THAT(segv.message, HasSubstr("SIGSEGV"));
}

TEST(ExitCauseTest, ShellCodeIs128PlusSignal) {
  EXPECT_EQ((ExitStatus{0, SIGKILL}).ShellCode(), 137);
  EXPECT_EQ((ExitStatus{3, 0}).ShellCode(), 3);
}

TEST(ExitCauseTest, ReadsTheOomKillCounter) {
  testing::TempDir dir;
  testing::WriteFile(dir.File("memory.events"),
                     "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n");
  EXPECT_EQ(ReadOomKillCount(dir.File("memory.events")), 2);
  EXPECT_EQ(ReadOomKillCount(dir.File("missing")), std::nullopt);
}

TEST(ExitCauseTest, FailureJsonCarriesWhatTheOperatorNeeds) {
  RankFailure f;
  f.rank = 5;
  f.local_rank = 1;
  f.node_rank = 1;
  f.status = {0, SIGKILL};
  f.cause = ClassifyExit(f.status, 0, 1);
  auto j = f.ToJson();
  EXPECT_EQ(j["rank"], 5);
  EXPECT_EQ(j["nodeRank"], 1);
  EXPECT_EQ(j["exitCode"], 137);
  EXPECT_EQ(j["reason"], "OOMKilled");
  EXPECT_EQ(j["signal"], "SIGKILL");
  EXPECT_THAT(f.Line(), HasSubstr("rank 5 (local rank 1, node 1"));
}

TEST(ProcessTableTest, ParsesAStatLineWhoseNameHoldsSpacesAndParentheses) {
  char state = 0;
  unsigned long flags = 0;
  pid_t ppid = 0, pgid = 0;
  ASSERT_TRUE(
      ParseStat("4242 (a (b) c) R 17 4242 4242 0 -1 4194380 12 0", &state, &flags, &ppid, &pgid));
  EXPECT_EQ(state, 'R');
  EXPECT_EQ(flags, 4194380u);  // 0x40004c: PF_EXITING (0x4) among them
  EXPECT_EQ(ppid, 17);
  EXPECT_EQ(pgid, 4242);
  EXPECT_FALSE(ParseStat("4242 no parenthesis", &state, &flags, &ppid, &pgid));
  EXPECT_FALSE(ParseStat("4242 (x) R 1", &state, &flags, &ppid, &pgid));
}

TEST(ProcessTableTest, ARunningProcessIsNotExitingAZombieOrAGoneOneIs) {
  pid_t child = fork();
  if (child == 0) {
    for (;;) pause();
  }
  ASSERT_GT(child, 0);
  EXPECT_FALSE(ProcessIsExiting(child));
  bool listed = false;
  for (const ProcEntry& e : ListProcesses())
    listed = listed || (e.pid == child && e.ppid == getpid());
  EXPECT_TRUE(listed);
  kill(child, SIGKILL);
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, child, &info, WEXITED | WNOWAIT), 0);  // a zombie, not reaped
  EXPECT_TRUE(ProcessIsExiting(child));
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  EXPECT_TRUE(ProcessIsExiting(child));  // gone
}

void* SleepForever(void*) {
  for (;;) pause();
  return nullptr;
}

// A main thread that exits alone (pthread_exit) leaves a zombie leader while the other
// threads run user code.
TEST(ProcessTableTest, AZombieLeaderWhoseThreadsRunIsNotExiting) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  if (child == 0) {
    pthread_t t;
    pthread_create(&t, nullptr, SleepForever, nullptr);
    (void)!write(ready[1], "x", 1);
    syscall(SYS_exit, 0);  // this thread only, as pthread_exit() ends it (no unwinding)
  }
  ASSERT_GT(child, 0);
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  close(ready[0]);
  close(ready[1]);
  // Wait (with a deadline) for the leader to become a zombie; the thread keeps the process.
  const std::string leader = "/proc/" + std::to_string(child) + "/task/" + std::to_string(child);
  ASSERT_TRUE(spawnpoint::testing::WaitUntil(
      [&] {
        char state = 0;
        unsigned long flags = 0;
        pid_t ppid = 0, pgid = 0;
        std::ifstream in(leader + "/stat");
        std::string line;
        return std::getline(in, line) && ParseStat(line, &state, &flags, &ppid, &pgid) &&
               state == 'Z';
      },
      std::chrono::milliseconds(10'000)));
  EXPECT_FALSE(ProcessIsExiting(child));
  kill(child, SIGKILL);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
}

TEST(PreflightTest, SharedMemoryNeedScalesWithTheLoaderAndIsCappedByShmSize) {
  api::TrainingJobSpec spec;
  spec.loader.workers_per_rank = 4;
  spec.loader.prefetch_factor = 2;
  spec.shm_size_bytes = 8LL << 30;
  EXPECT_EQ(SharedMemoryNeeded(spec, 2, 8), 2u * 4 * 2 * kAssumedBatchSlotBytes);
  spec.shm_size_bytes = 64LL << 20;
  EXPECT_EQ(SharedMemoryNeeded(spec, 2, 8), 64u << 20);
  spec.shm_size_bytes = 8LL << 30;
  spec.loader.workers_per_rank.reset();  // auto: min(8, cpus per rank)
  EXPECT_EQ(SharedMemoryNeeded(spec, 1, 3), 3u * 2 * kAssumedBatchSlotBytes);
}

TEST(PreflightTest, FormatsBytesLikeKubernetesQuantities) {
  EXPECT_EQ(FormatBytes(64ull << 20), "64Mi");
  EXPECT_EQ(FormatBytes(3ull << 29), "1.5Gi");
  EXPECT_EQ(FormatBytes(100), "100");
}

TEST(PreflightTest, MissingMountIsAClearError) {
  api::TrainingJobSpec spec;
  auto s = CheckSharedMemory(spec, 2, 1, "/nonexistent/shm");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("/nonexistent/shm is not usable"));
}

// The program a rank execs: a relative name with a '/' from the rank's workingDir (where it
// starts), not from the agent's directory; a bare name on the rank's PATH.
TEST(PreflightTest, ARanksProgramIsResolvedWhereTheRankStarts) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir.File("bin"));
  testing::WriteFile(dir.File("bin/train"), "#!/bin/sh\n");
  chmod(dir.File("bin/train").c_str(), 0755);
  RankPlan rank;
  rank.argv = {"./bin/train"};
  rank.working_dir = dir.path();
  rank.env["PATH"] = "/usr/bin:/bin";
  auto exe = ResolveRankExecutable(rank);
  ASSERT_TRUE(exe.ok()) << exe.status().message();
  EXPECT_EQ(*exe, dir.File("bin/train"));
  EXPECT_TRUE(CheckCommand(rank).ok());
  rank.argv = {"sh"};
  exe = ResolveRankExecutable(rank);
  ASSERT_TRUE(exe.ok()) << exe.status().message();
  EXPECT_TRUE(*exe == "/usr/bin/sh" || *exe == "/bin/sh") << *exe;
  rank.argv = {"./bin/missing"};
  Status missing = CheckCommand(rank);
  EXPECT_FALSE(missing.ok());
  EXPECT_THAT(missing.message(), HasSubstr("the trainer container's"));
  EXPECT_THAT(missing.message(), HasSubstr("bin/missing"));
}

}  // namespace
}  // namespace spawnpoint::agent
