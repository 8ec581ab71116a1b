// StallWatch on simulated time, and the stack parsers on recorded dumps.
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/run/rank_stacks.h"
#include "agent/run/stall_watch.h"
#include "tests/agent/sim_rank.h"

namespace spawnpoint::agent {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<int> Ranks(const std::vector<StalledRank>& stalled) {
  std::vector<int> out;
  for (const StalledRank& s : stalled) out.push_back(s.rank);
  return out;
}

TEST(StallWatchTest, ARankSilentForTheTimeoutIsReportedOnceUntilItStepsAgain) {
  api::StallPolicy policy;
  policy.timeout_seconds = 5;
  StallWatch watch(policy);
  SimRank a{.rank = 0}, b{.rank = 1};
  for (int i = 0; i < 10; ++i) {
    a.Step(100 * kMs);
    b.Step(100 * kMs);
  }
  const int64_t t = a.now_ns;
  EXPECT_THAT(watch.Check({a.Progress(), b.Progress()}, t + 4'999 * kMs), IsEmpty());
  b.Step(4'000 * kMs);  // rank 1 is slow, not silent
  auto stalled = watch.Check({a.Progress(), b.Progress()}, t + 5 * kS);
  ASSERT_EQ(Ranks(stalled), std::vector<int>{0});
  EXPECT_EQ(stalled[0].silent_ns, 5 * kS);
  EXPECT_EQ(stalled[0].steps, 10u);
  EXPECT_FALSE(stalled[0].before_first_step);
  for (const StalledRank& s : watch.Check({a.Progress(), b.Progress()}, t + 60 * kS)) {
    EXPECT_NE(s.rank, 0);  // rank 0 already reported for this silence
  }
  // It steps again, then falls silent again: reported again.
  a.now_ns = t + 61 * kS;
  a.Step(100 * kMs);
  b.now_ns = a.now_ns;
  b.Step(0);
  EXPECT_THAT(watch.Check({a.Progress(), b.Progress()}, a.now_ns + kS), IsEmpty());
  EXPECT_EQ(Ranks(watch.Check({a.Progress(), b.Progress()}, a.now_ns + 5 * kS)),
            (std::vector<int>{0, 1}));
}

TEST(StallWatchTest, AutoWaitsForTwentyStepsThenTakesTheLargerOf30sAnd10Medians) {
  StallWatch watch(api::StallPolicy{});  // timeoutSeconds: auto
  SimRank a{.rank = 0};
  for (int i = 0; i < 19; ++i) a.Step(100 * kMs);
  EXPECT_THAT(watch.Check({a.Progress()}, a.now_ns + 3'600 * kS), IsEmpty());
  EXPECT_FALSE(watch.TimeoutNs().has_value());
  a.Step(100 * kMs);
  EXPECT_THAT(watch.Check({a.Progress()}, a.now_ns + 29 * kS), IsEmpty());
  EXPECT_EQ(watch.TimeoutNs(), 30 * kS);  // 10 x 0.1 s is under the floor
  EXPECT_DOUBLE_EQ(watch.MedianStepSeconds(), 0.1);
  EXPECT_EQ(Ranks(watch.Check({a.Progress()}, a.now_ns + 30 * kS)), std::vector<int>{0});

  StallWatch slow(api::StallPolicy{});
  SimRank b{.rank = 0};
  for (int i = 0; i < 40; ++i) b.Step(5 * kS);
  EXPECT_THAT(slow.Check({b.Progress()}, b.now_ns + 49 * kS), IsEmpty());
  EXPECT_EQ(slow.TimeoutNs(), 50 * kS);
  EXPECT_EQ(Ranks(slow.Check({b.Progress()}, b.now_ns + 50 * kS)), std::vector<int>{0});
}

// Issue 13's "no false alarm": an epoch boundary, a validation pass of 10x the step time
// and a checkpoint pause under the timeout, at the defaults.
TEST(StallWatchTest, EpochBoundariesValidationAndCheckpointsRaiseNothing) {
  StallWatch watch(api::StallPolicy{});
  SimRank a{.rank = 0}, b{.rank = 1};
  auto step_both = [&](int64_t d) {
    a.Step(d);
    b.Step(d);
  };
  auto check_gap = [&](int64_t gap) {
    for (int64_t t = 0; t <= gap; t += 500 * kMs) {
      EXPECT_THAT(watch.Check({a.Progress(), b.Progress()}, a.now_ns + t), IsEmpty()) << t;
    }
  };
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (int i = 0; i < 50; ++i) {
      step_both(200 * kMs);
      EXPECT_THAT(watch.Check({a.Progress(), b.Progress()}, a.now_ns), IsEmpty());
    }
    check_gap(400 * kMs);  // the epoch boundary: the loader's next epoch
    check_gap(2 * kS);     // validation: 10 steps' time
    check_gap(25 * kS);    // a checkpoint written, under the 30 s floor
    step_both(25 * kS);    // the first step after it ends late
  }
}

TEST(StallWatchTest, BeforeItsFirstStepARankIsJudgedByTheStartupTimeoutOnly) {
  SimRank a{.rank = 0, .started_ns = 100 * kS};
  StallWatch off(api::StallPolicy{});
  EXPECT_THAT(off.Check({a.Progress()}, 100 * kS + 3'600 * kS), IsEmpty());
  api::StallPolicy policy;
  policy.timeout_seconds = 5;
  policy.startup_timeout_seconds = 600;
  StallWatch on(policy);
  EXPECT_THAT(on.Check({a.Progress()}, 100 * kS + 599 * kS), IsEmpty());
  auto stalled = on.Check({a.Progress()}, 100 * kS + 600 * kS);
  ASSERT_EQ(stalled.size(), 1u);
  EXPECT_TRUE(stalled[0].before_first_step);
  EXPECT_EQ(stalled[0].silent_ns, 600 * kS);
}

TEST(StallWatchTest, APeerMarkedAsWaitingIsNotReportedUntilItSteps) {
  api::StallPolicy policy;
  policy.timeout_seconds = 5;
  StallWatch watch(policy);
  SimRank a{.rank = 0}, b{.rank = 1};
  a.Step(kS);
  b.Step(kS);
  watch.MarkReported(1, 1);
  EXPECT_EQ(Ranks(watch.Check({a.Progress(), b.Progress()}, a.now_ns + 6 * kS)),
            std::vector<int>{0});
}

// The peer-wait rule ("auto", issue 39): from the first step on, a rank that neither steps
// nor works nor waits while a peer has waited 30 s for it in a collective. Checked once a
// second from `from`, with each rank's CPU sampled then: `busy` ranks use a whole CPU.
struct PeerWaitRun {
  std::vector<StalledRank> named;  // at the first Check that named anyone
  int64_t at_ns = -1;              // when, or -1
};
PeerWaitRun RunChecks(StallWatch& watch, std::vector<SimRank*> ranks, std::vector<bool> busy,
                      int64_t from, int64_t to) {
  PeerWaitRun run;
  for (int64_t t = from; t <= to; t += kS) {
    std::vector<RankProgress> progress;
    for (size_t i = 0; i < ranks.size(); ++i) {
      ranks[i]->cpu_ns = busy[i] ? t - from : 7 * kMs;  // an idle rank's CPU stands still
      progress.push_back(ranks[i]->Progress());
    }
    auto stalled = watch.Check(progress, t);
    if (!stalled.empty()) return {stalled, t};
  }
  return run;
}

TEST(StallWatchTest, ARankItsPeerWaitsOnIsNamedFromTheFirstStepWithin30s) {
  for (int steps : {0, 4}) {  // a hang at step 1 and at step 5, before "auto" is armed
    StallWatch watch(api::StallPolicy{});
    SimRank a{.rank = 0}, b{.rank = 1};
    for (int i = 0; i < steps; ++i) {
      a.Step(100 * kMs);
      b.Step(100 * kMs);
    }
    const int64_t t0 = a.now_ns;
    a.snapshot.waiting_since_ns = t0 + kS;  // in its next step's allreduce, b never comes
    PeerWaitRun run = RunChecks(watch, {&a, &b}, {false, false}, t0, t0 + 120 * kS);
    ASSERT_EQ(Ranks(run.named), std::vector<int>{1}) << steps;
    EXPECT_EQ(run.at_ns, t0 + 31 * kS) << "30 s after rank 0 began to wait, not before";
    EXPECT_EQ(run.named[0].waited_on_by, 0);
    EXPECT_EQ(run.named[0].waited_on_ns, 30 * kS);
    EXPECT_EQ(run.named[0].before_first_step, steps == 0);
    EXPECT_EQ(run.named[0].steps, static_cast<uint64_t>(steps));
  }
}

TEST(StallWatchTest, ARankAtWorkIsNeverNamedHoweverLongItsPeerWaits) {
  // A first step of 90 s of real work on rank 1, rank 0 waiting for it all along.
  StallWatch watch(api::StallPolicy{});
  SimRank a{.rank = 0}, b{.rank = 1};
  a.snapshot.waiting_since_ns = kS;
  EXPECT_THAT(RunChecks(watch, {&a, &b}, {false, true}, 0, 90 * kS).named, IsEmpty());
  // Its loader workers' CPU counts too (RankProgress::cpu_ns): the same.
}

TEST(StallWatchTest, ThePeerWaitRuleNeedsAWaitingPeerAnIdleRankAndAutoTimeouts) {
  {  // both wait in a collective: neither is the one the other waits on
    StallWatch watch(api::StallPolicy{});
    SimRank a{.rank = 0}, b{.rank = 1};
    a.snapshot.waiting_since_ns = b.snapshot.waiting_since_ns = kS;
    EXPECT_THAT(RunChecks(watch, {&a, &b}, {false, false}, 0, 120 * kS).named, IsEmpty());
  }
  {  // idle, but nobody waits for it (a single rank, or peers elsewhere at work)
    StallWatch watch(api::StallPolicy{});
    SimRank a{.rank = 0}, b{.rank = 1};
    EXPECT_THAT(RunChecks(watch, {&a, &b}, {true, false}, 0, 120 * kS).named, IsEmpty());
  }
  {  // CPU never sampled: not known to be idle
    StallWatch watch(api::StallPolicy{});
    SimRank a{.rank = 0}, b{.rank = 1};
    a.snapshot.waiting_since_ns = kS;
    for (int64_t t = 0; t <= 120 * kS; t += kS) {
      EXPECT_THAT(watch.Check({a.Progress(), b.Progress()}, t), IsEmpty());
    }
  }
  {  // an explicit timeoutSeconds is the user's rule alone
    api::StallPolicy policy;
    policy.timeout_seconds = 600;
    StallWatch watch(policy);
    SimRank a{.rank = 0}, b{.rank = 1};
    a.Step(kS);
    b.Step(kS);
    a.snapshot.waiting_since_ns = 2 * kS;
    EXPECT_THAT(RunChecks(watch, {&a, &b}, {false, false}, kS, 120 * kS).named, IsEmpty());
  }
}

TEST(RankStacksTest, PythonDumpsNameTheMainThreadsInnermostFrame) {
  const std::string dump =
      "Thread 0x00007f1 (most recent call first):\n"
      "  File \"/usr/lib/python3.11/threading.py\", line 320 in wait\n"
      "  File \"/usr/lib/python3.11/threading.py\", line 995 in _bootstrap\n"
      "\n"
      "Current thread 0x00007f2 (most recent call first):\n"
      "  File \"/job/train.py\", line 19 in blocked_here\n"
      "  File \"/job/train.py\", line 32 in main\n"
      "  File \"/job/train.py\", line 43 in <module>\n";
  RankStack s = ParsePythonStacks(dump);
  EXPECT_EQ(s.source, "python");
  EXPECT_EQ(s.top_frame, "blocked_here (train.py:19)");
  EXPECT_FALSE(s.in_collective);
  EXPECT_EQ(s.text.rfind("Current thread", 0), 0u);  // the main thread first
  EXPECT_THAT(s.text, HasSubstr("_bootstrap"));

  const std::string waiting =
      "Current thread 0x00007f2 (most recent call first):\n"
      "  File \"/usr/lib/python3/dist-packages/torch/autograd/__init__.py\", line 197 in "
      "backward\n"
      "  File \"/usr/lib/python3/dist-packages/torch/_tensor.py\", line 487 in backward\n"
      "  File \"/job/train.py\", line 36 in main\n"
      "  File \"/job/train.py\", line 43 in <module>\n";
  EXPECT_TRUE(ParsePythonStacks(waiting).in_collective);
  const std::string barrier =
      "Current thread 0x1 (most recent call first):\n"
      "  File \"/x/torch/distributed/distributed_c10d.py\", line 3 in barrier\n"
      "  File \"/job/train.py\", line 9 in <module>\n";
  EXPECT_TRUE(ParsePythonStacks(barrier).in_collective);
  EXPECT_EQ(ParsePythonStacks("").top_frame, "");
}

TEST(RankStacksTest, NativeFramesFromEuStackAndGdb) {
  const std::string eu =
      "TID 13116:\n"
      "#0  0x00007f77654ed545 clock_nanosleep@GLIBC_2.2.5\n"
      "#1  0x00007f77654f1e53 __nanosleep\n"
      "#2  0x0000565010d2acae spawnpoint::trainer::(anonymous namespace)::HangForever("
      "spawnpoint::trainer::RankEnv const&, long) [clone .isra.0]\n"
      "#3  0x0000565010d296f5 main\n";
  RankStack s = ParseNativeBacktrace(eu, "eu-stack");
  EXPECT_EQ(s.top_frame, "spawnpoint::trainer::(anonymous namespace)::HangForever");
  EXPECT_FALSE(s.in_collective);
  EXPECT_THAT(s.text, HasSubstr("#3 main"));

  const std::string gdb =
      "#0  __futex_abstimed_wait_common64 (private=0) at ./nptl/futex-internal.c:57\n"
      "#4  ___pthread_cond_wait (cond=0x1, mutex=0x2) at ./nptl/pthread_cond_wait.c:618\n"
      "#5  0x00007f4decec2843 in c10d::Work::wait(std::chrono::duration<long, std::ratio<1l, "
      "1000l> >) () from /lib/x86_64-linux-gnu/libtorch_cpu.so.1.13\n"
      "#6  0x000055a1b24b4cd8 in spawnpoint::trainer::(anonymous namespace)::AverageGradients "
      "(pg=...) at /work/examples/ddp-trainer/trainer.cc:114\n";
  const std::string eu_waiting =
      "TID 19265:\n"
      "#0  0x00007f1 __futex_abstimed_wait_common\n"
      "#1  0x00007f2 pthread_cond_wait@@GLIBC_2.3.2\n"
      "#2  0x00007f3 c10d::Work::wait(std::chrono::duration<long, std::ratio<1l, 1000l> >)\n"
      "#3  0x00005a4 spawnpoint::trainer::(anonymous namespace)::AverageGradients(int)\n";
  RankStack e = ParseNativeBacktrace(eu_waiting, "eu-stack");
  EXPECT_TRUE(e.in_collective) << e.text;
  EXPECT_EQ(e.top_frame, "c10d::Work::wait");

  RankStack w = ParseNativeBacktrace(gdb, "gdb");
  EXPECT_TRUE(w.in_collective);
  EXPECT_EQ(w.top_frame, "c10d::Work::wait");
  EXPECT_THAT(w.text, HasSubstr("AverageGradients (trainer.cc:114)"));
}

TEST(RankStacksTest, TheKernelViewListsTheMainThreadFirst) {
  const std::string view = KernelView(getpid());
  EXPECT_EQ(view.rfind("thread " + std::to_string(getpid()) + " state ", 0), 0u) << view;
  EXPECT_EQ(KernelView(0x7ffffff0), "");
}

}  // namespace
}  // namespace spawnpoint::agent
