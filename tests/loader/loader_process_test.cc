// The loader on real processes. This binary is its own loader worker: main() calls
// RunWorkerIfRequested before GoogleTest, so a standalone Loader re-executes it as its
// workers, and the test datasets (test_datasets.cc) are registered in both roles.
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/loader/contract.h"
#include "agent/loader/loader.h"
#include "agent/loader/pool_client.h"
#include "agent/loader/pool_supervisor.h"
#include "agent/loader/sampler.h"
#include "tests/support/test_process.h"

extern char** environ;

namespace spawnpoint::loader {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;

struct Got {
  int64_t epoch = 0;
  int64_t index = 0;
  int worker = -1;
  std::vector<int64_t> indices;
  std::vector<int64_t> field_index;  // what the "index" field says
  std::vector<int64_t> rand, seed;
  bool values_ok = true;
};

Got Record(const Batch& b) {
  Got g;
  g.epoch = b.epoch;
  g.index = b.index;
  g.worker = b.worker_id;
  g.indices = b.sample_indices;
  if (const BatchField* f = b.Find("index")) {
    auto v = f->As<int64_t>();
    g.field_index.assign(v.begin(), v.end());
  }
  if (const BatchField* f = b.Find("value")) {
    auto v = f->As<float>();
    const size_t per = b.size() ? v.size() / b.size() : 0;
    for (size_t i = 0; i < b.size(); ++i) {
      if (v[i * per] != static_cast<float>(b.sample_indices[i])) g.values_ok = false;
    }
  }
  if (const BatchField* f = b.Find("rand")) {
    auto v = f->As<int64_t>();
    g.rand.assign(v.begin(), v.end());
  }
  if (const BatchField* f = b.Find("seed")) {
    auto v = f->As<int64_t>();
    g.seed.assign(v.begin(), v.end());
  }
  return g;
}

// Runs one epoch to its end; `after_each(k)` is called after the k-th batch.
StatusOr<std::vector<Got>> RunEpoch(Loader& loader, int64_t epoch,
                                    const std::function<void(size_t)>& after_each = nullptr) {
  SP_RETURN_IF_ERROR(loader.StartEpoch(epoch));
  std::vector<Got> out;
  while (true) {
    SP_ASSIGN_OR_RETURN(BatchPtr b, loader.Next());
    if (b == nullptr) return out;
    out.push_back(Record(*b));
    if (after_each) after_each(out.size());
  }
}

// Every batch is the sampler's, in order, with values that encode the indices.
void ExpectExactlyTheSamplersBatches(const std::vector<Got>& got, const LoaderOptions& o,
                                     int64_t dataset_size, int64_t epoch) {
  SamplerOptions s;
  s.dataset_size = dataset_size;
  s.batch_size = o.batch_size;
  s.shuffle = o.shuffle;
  s.drop_last = o.drop_last;
  s.seed = o.seed.value_or(0);
  s.rank = o.rank.value_or(0);
  s.world_size = o.world_size.value_or(1);
  const auto expected = EpochBatches(s, epoch);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].epoch, epoch);
    EXPECT_EQ(got[i].index, static_cast<int64_t>(i));
    EXPECT_EQ(got[i].indices, expected[i]) << "batch " << i;
    EXPECT_EQ(got[i].field_index, expected[i]) << "batch " << i;
    EXPECT_TRUE(got[i].values_ok) << "batch " << i;
  }
}

LoaderOptions Options(const std::string& dataset, const std::string& arg, int workers,
                      int64_t batch) {
  LoaderOptions o;
  o.dataset = dataset;
  o.dataset_arg = arg;
  o.workers = workers;
  o.batch_size = batch;
  o.seed = 0;
  o.rank = 0;
  o.world_size = 1;
  o.timeout = seconds(20);
  return o;
}

std::unique_ptr<Loader> MustCreate(LoaderOptions o) {
  auto l = Loader::Create(std::move(o));
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  return l.ok() ? std::move(l).value() : nullptr;
}

// ---------------------------------------------------------------------------------------

TEST(Loader, EverySampleOnceInSamplerOrderAcrossEpochs) {
  LoaderOptions o = Options("index", "size=103,dim=8,sleep_ms=1", 2, 8);
  o.shuffle = true;
  o.seed = 11;
  auto loader = MustCreate(o);
  ASSERT_NE(loader, nullptr);
  EXPECT_EQ(loader->DatasetSize(), 103);
  EXPECT_EQ(loader->BatchesPerEpoch(), 13);
  std::vector<int64_t> first_order;
  for (int64_t e = 0; e < 3; ++e) {
    auto got = RunEpoch(*loader, e);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ExpectExactlyTheSamplersBatches(*got, o, 103, e);
    std::set<int64_t> seen;
    for (const Got& g : *got) seen.insert(g.indices.begin(), g.indices.end());
    EXPECT_EQ(seen.size(), 103u);
    std::set<int> workers;
    for (const Got& g : *got) workers.insert(g.worker);
    EXPECT_EQ(workers, (std::set<int>{0, 1})) << "both workers serve";
    if (e == 0) first_order = got->front().indices;
    if (e == 1) {
      EXPECT_NE(got->front().indices, first_order) << "epochs reshuffle";
    }
  }
  const LoaderStats s = loader->Stats();
  EXPECT_EQ(s.batches, 39);
  EXPECT_EQ(s.samples, 309);
  EXPECT_EQ(s.pool_workers, 2);
  EXPECT_EQ(s.restarts_died + s.restarts_hung + s.restarts_oom + s.restarts_shm, 0);
  EXPECT_GT(s.slot_bytes, 0u);
  EXPECT_EQ(s.slots, 2u * 2 + 4);
}

TEST(Loader, RanksTogetherSeeEachSampleOnceWithDistributedSamplerPadding) {
  std::multiset<int64_t> all;
  for (int r = 0; r < 3; ++r) {
    LoaderOptions o = Options("index", "size=100,dim=2", 1, 7);
    o.shuffle = true;
    o.seed = 5;
    o.rank = r;
    o.world_size = 3;
    auto loader = MustCreate(o);
    ASSERT_NE(loader, nullptr);
    auto got = RunEpoch(*loader, 2);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ExpectExactlyTheSamplersBatches(*got, o, 100, 2);
    for (const Got& g : *got) all.insert(g.indices.begin(), g.indices.end());
  }
  // 102 positions (padded to a multiple of 3): every sample, two of them twice.
  EXPECT_EQ(all.size(), 102u);
  const auto perm = EpochPermutation(100, true, 5, 2);
  for (int64_t i = 0; i < 100; ++i) {
    EXPECT_EQ(all.count(i), (i == perm[0] || i == perm[1]) ? 2u : 1u) << "sample " << i;
  }
}

TEST(Loader, ZeroWorkersLoadInProcessWithTheSameBatches) {
  LoaderOptions o = Options("index", "size=50,dim=3", 0, 6);
  o.shuffle = true;
  o.drop_last = true;
  auto in_process = MustCreate(o);
  ASSERT_NE(in_process, nullptr);
  EXPECT_TRUE(in_process->WorkerPids().empty());
  auto a = RunEpoch(*in_process, 1);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ExpectExactlyTheSamplersBatches(*a, o, 50, 1);
  EXPECT_EQ(a->size(), 8u);  // 50 / 6, the short last batch dropped
  o.workers = 2;
  auto pooled = MustCreate(o);
  ASSERT_NE(pooled, nullptr);
  auto b = RunEpoch(*pooled, 1);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(a->size(), b->size());
  for (size_t i = 0; i < a->size(); ++i) EXPECT_EQ((*a)[i].indices, (*b)[i].indices);
}

TEST(Loader, OutOfOrderModeStillDeliversEveryBatchOnce) {
  LoaderOptions o = Options("index", "size=60,dim=2,sleep_ms=1", 2, 3);
  o.in_order = false;
  auto loader = MustCreate(o);
  ASSERT_NE(loader, nullptr);
  auto got = RunEpoch(*loader, 0);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  std::multiset<int64_t> batches, samples;
  for (const Got& g : *got) {
    batches.insert(g.index);
    samples.insert(g.indices.begin(), g.indices.end());
    EXPECT_EQ(g.indices, g.field_index);
  }
  EXPECT_EQ(batches.size(), 20u);
  EXPECT_EQ(std::set<int64_t>(batches.begin(), batches.end()).size(), 20u);
  EXPECT_EQ(std::set<int64_t>(samples.begin(), samples.end()).size(), 60u);
}

TEST(Loader, SameSeedSameBatchesAndEveryWorkerHasItsOwnRandomStream) {
  // Samples slow enough that a worker's queue fills, so both workers build batches.
  LoaderOptions o = Options("augment", "size=64,dim=2,sleep_ms=1", 2, 4);
  o.shuffle = true;
  o.seed = 42;
  std::vector<std::vector<int64_t>> first_run;
  for (int run = 0; run < 2; ++run) {
    auto loader = MustCreate(o);
    ASSERT_NE(loader, nullptr);
    auto got = RunEpoch(*loader, 3);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    std::map<int, std::set<int64_t>> rand_by_worker;
    for (const Got& g : *got) {
      ASSERT_EQ(g.seed.size(), g.indices.size());
      for (size_t i = 0; i < g.seed.size(); ++i) {
        // The context's seed is the documented function of (seed, rank, worker, epoch).
        EXPECT_EQ(static_cast<uint64_t>(g.seed[i]), DeriveSeed(42, 0, g.worker, 3));
        rand_by_worker[g.worker].insert(g.rand[i]);
      }
      if (run == 0) first_run.push_back(g.indices);
    }
    if (run == 1) {
      std::vector<std::vector<int64_t>> second;
      for (const Got& g : *got) second.push_back(g.indices);
      EXPECT_EQ(second, first_run);
    }
    ASSERT_EQ(rand_by_worker.size(), 2u);
    std::vector<int64_t> common;
    std::set_intersection(rand_by_worker[0].begin(), rand_by_worker[0].end(),
                          rand_by_worker[1].begin(), rand_by_worker[1].end(),
                          std::back_inserter(common));
    EXPECT_TRUE(common.empty()) << "workers 0 and 1 drew the same random numbers";
  }
  o.seed = 43;
  auto other = MustCreate(o);
  ASSERT_NE(other, nullptr);
  auto got = RunEpoch(*other, 3);
  ASSERT_TRUE(got.ok());
  EXPECT_NE(got->front().indices, first_run.front());
}

TEST(Loader, PersistentWorkersKeepTheirPidsAcrossEpochs) {
  auto loader = MustCreate(Options("index", "size=40,dim=2", 2, 4));
  ASSERT_NE(loader, nullptr);
  const std::vector<pid_t> pids = loader->WorkerPids();
  ASSERT_EQ(pids.size(), 2u);
  for (pid_t p : pids) EXPECT_TRUE(testing::ProcessExists(p));
  for (int e = 0; e < 4; ++e) {
    auto got = RunEpoch(*loader, e);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(loader->WorkerPids(), pids) << "epoch " << e;
  }
  // The workers belong to the Loader: they are gone once it is.
  loader.reset();
  for (pid_t p : pids) EXPECT_FALSE(testing::ProcessExists(p)) << p;
}

TEST(Loader, NextEpochIsIssuedBeforeTheTrainerAsksForIt) {
  auto loader = MustCreate(Options("index", "size=24,dim=2", 2, 4));
  ASSERT_NE(loader, nullptr);
  auto e0 = RunEpoch(*loader, 0);
  ASSERT_TRUE(e0.ok());
  // Epoch 1's first batches are built while epoch 0 ends.
  EXPECT_TRUE(testing::WaitUntil([&] { return loader->Stats().queue_depth > 0; }, seconds(10)));
  auto e1 = RunEpoch(*loader, 1);
  ASSERT_TRUE(e1.ok());
  ExpectExactlyTheSamplersBatches(*e1, loader->options(), 24, 1);
  // Skipping ahead drops what was issued for epoch 2 and still yields epoch 5 exactly.
  auto e5 = RunEpoch(*loader, 5);
  ASSERT_TRUE(e5.ok());
  ExpectExactlyTheSamplersBatches(*e5, loader->options(), 24, 5);
}

TEST(Loader, LeavingOrRestartingAnEpochEarlyIsExact) {
  auto loader = MustCreate(Options("index", "size=80,dim=2", 2, 4));
  ASSERT_NE(loader, nullptr);
  ASSERT_TRUE(loader->StartEpoch(0).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(loader->Next().ok());
  // Starting the same epoch again starts it from its first batch.
  auto e0 = RunEpoch(*loader, 0);
  ASSERT_TRUE(e0.ok()) << e0.status().ToString();
  ExpectExactlyTheSamplersBatches(*e0, loader->options(), 80, 0);
  ASSERT_TRUE(loader->StartEpoch(1).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(loader->Next().ok());
  // Leaving epoch 1 early for epoch 2.
  auto e1 = RunEpoch(*loader, 2);
  ASSERT_TRUE(e1.ok()) << e1.status().ToString();
  ExpectExactlyTheSamplersBatches(*e1, loader->options(), 80, 2);
}

TEST(Loader, HeldBatchesKeepTheirBytesUntilReleased) {
  auto loader = MustCreate(Options("index", "size=200,dim=16", 2, 2));
  ASSERT_NE(loader, nullptr);
  ASSERT_TRUE(loader->StartEpoch(0).ok());
  std::vector<BatchPtr> held;
  for (int i = 0; i < 4; ++i) {  // the 4 spare slots
    auto b = loader->Next();
    ASSERT_TRUE(b.ok());
    held.push_back(*b);
  }
  // While these are held, later batches must go to other slots, never overwrite them.
  int seen = 0;
  while (true) {
    auto b = loader->Next();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    if (*b == nullptr) break;
    ++seen;
  }
  EXPECT_EQ(seen, 96);
  for (const BatchPtr& b : held) EXPECT_TRUE(Record(*b).values_ok);
}

TEST(Loader, TrainerHoldingEverySlotGetsAnErrorNotAHang) {
  auto loader = MustCreate(Options("index", "size=200,dim=2", 1, 2));
  ASSERT_NE(loader, nullptr);
  ASSERT_TRUE(loader->StartEpoch(0).ok());
  std::vector<BatchPtr> held;
  Status failure;
  for (int i = 0; i < 20 && failure.ok(); ++i) {
    auto b = loader->Next();
    if (b.ok()) {
      held.push_back(*b);
    } else {
      failure = b.status();
    }
  }
  ASSERT_FALSE(failure.ok());
  EXPECT_EQ(held.size(), 1u * 2 + 4);
  EXPECT_THAT(failure.message(), HasSubstr("held by batches the trainer has not released"));
}

// --- faults ------------------------------------------------------------------------------

TEST(LoaderFaults, WorkerSigkilledMidEpochLosesNoSample) {
  LoaderOptions o = Options("index", "size=240,dim=16,sleep_ms=2", 2, 4);
  o.shuffle = true;
  auto loader = MustCreate(o);
  ASSERT_NE(loader, nullptr);
  const std::vector<pid_t> before = loader->WorkerPids();
  auto got = RunEpoch(*loader, 0, [&](size_t k) {
    if (k == 6) {
      ASSERT_EQ(kill(before[0], SIGKILL), 0);
    }
  });
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectExactlyTheSamplersBatches(*got, o, 240, 0);
  EXPECT_TRUE(testing::WaitUntil(
      [&] {
        pid_t now = loader->WorkerPids()[0];
        return now != before[0] && now > 0;
      },
      seconds(10)));
  EXPECT_EQ(loader->WorkerPids()[1], before[1]);
  EXPECT_EQ(loader->Stats().restarts_died, 1);
  // The respawned worker serves the next epoch too.
  auto next = RunEpoch(*loader, 1);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  ExpectExactlyTheSamplersBatches(*next, o, 240, 1);
}

TEST(LoaderFaults, AProgramThatIgnoresSigchldStillGetsItsWorkersRespawned) {
  // With SIGCHLD ignored the kernel reaps children itself, so the pool never sees an exit
  // status; it must still notice the death, record it and respawn.
  struct sigaction ignore {
  }, old{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGCHLD, &ignore, &old), 0);
  {
    LoaderOptions o = Options("index", "size=120,dim=4,sleep_ms=2", 1, 4);
    auto loader = MustCreate(o);
    ASSERT_NE(loader, nullptr);
    const pid_t victim = loader->WorkerPids()[0];
    auto got = RunEpoch(*loader, 0, [&](size_t k) {
      if (k == 3) kill(victim, SIGKILL);
    });
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ExpectExactlyTheSamplersBatches(*got, o, 120, 0);
    EXPECT_EQ(loader->Stats().restarts_died, 1);
    EXPECT_NE(loader->WorkerPids()[0], victim);
  }
  sigaction(SIGCHLD, &old, nullptr);
}

TEST(LoaderFaults, HungWorkerIsKilledAfterTheTimeoutAndItsBatchReissued) {
  testing::TempDir dir;
  LoaderOptions o = Options("hang", "size=80,dim=2,at=37,marker=" + dir.File("hung-once"), 2, 4);
  o.timeout = milliseconds(800);
  auto loader = MustCreate(o);
  ASSERT_NE(loader, nullptr);
  const auto start = std::chrono::steady_clock::now();
  auto got = RunEpoch(*loader, 0);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectExactlyTheSamplersBatches(*got, o, 80, 0);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, milliseconds(800));
  const LoaderStats s = loader->Stats();
  EXPECT_EQ(s.restarts_hung, 1);
  EXPECT_EQ(s.restarts_died, 0);
  // The trainer waited for the hung batch; how long depends on how far ahead the other
  // worker got, which load decides, so only the bounds that hold regardless.
  EXPECT_GT(s.wait_seconds, 0);
  EXPECT_LE(s.wait_seconds, std::chrono::duration<double>(took).count());
}

TEST(LoaderFaults, DatasetExceptionNamesTheIndexAndMessage) {
  auto loader = MustCreate(Options("throw", "size=100,dim=2,at=37", 2, 8));
  ASSERT_NE(loader, nullptr);
  auto got = RunEpoch(*loader, 0);
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(),
              AllOf(HasSubstr("sample index 37"), HasSubstr("cannot decode sample 37"),
                    HasSubstr("batch 4 of epoch 0"), HasSubstr("pid")));
  // Sticky: the Loader stays failed.
  EXPECT_FALSE(loader->Next().ok());
  EXPECT_FALSE(loader->StartEpoch(1).ok());
}

TEST(LoaderFaults, DatasetErrorStatusNamesTheIndex) {
  for (int workers : {0, 1}) {
    auto loader = MustCreate(Options("throw", "size=20,dim=2,at=5,mode=status", workers, 4));
    ASSERT_NE(loader, nullptr);
    auto got = RunEpoch(*loader, 0);
    ASSERT_FALSE(got.ok()) << workers;
    EXPECT_THAT(got.status().message(),
                AllOf(HasSubstr("sample index 5"), HasSubstr("corrupt record 5")))
        << workers;
  }
}

TEST(LoaderFaults, RepeatedCrashOnOneBatchFailsWithIndexPidSignalAndStderr) {
  auto loader = MustCreate(Options("crash", "size=40,dim=2,at=13,signal=9", 2, 4));
  ASSERT_NE(loader, nullptr);
  auto got = RunEpoch(*loader, 0);
  ASSERT_FALSE(got.ok());
  const std::string& m = got.status().message();
  EXPECT_THAT(m, AllOf(HasSubstr("batch 3 of epoch 0"), HasSubstr("[12, 13, 14, 15]"),
                       HasSubstr("failed 3 times"), HasSubstr("attempt 3"), HasSubstr("pid "),
                       HasSubstr("SIGKILL"), HasSubstr("exit code 137"),
                       HasSubstr("about to crash on index 13 with signal 9")));
  EXPECT_THAT(m, ::testing::Not(HasSubstr("exited unexpectedly")));
}

TEST(LoaderFaults, CrashOnTheFirstIncarnationIsRetriedOnTheRespawnedWorker) {
  LoaderOptions o = Options("crash", "size=40,dim=2,at=13,signal=9,until_incarnation=1", 1, 4);
  auto loader = MustCreate(o);
  ASSERT_NE(loader, nullptr);
  const pid_t first = loader->WorkerPids()[0];
  auto got = RunEpoch(*loader, 0);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectExactlyTheSamplersBatches(*got, o, 40, 0);
  EXPECT_EQ(loader->Stats().restarts_died, 1);
  EXPECT_NE(loader->WorkerPids()[0], first);
}

TEST(LoaderFaults, SigbusOnceCountsAsSharedMemoryAndRecovers) {
  testing::TempDir dir;
  LoaderOptions o =
      Options("crash", "size=40,dim=2,at=9,signal=7,marker=" + dir.File("bus-once"), 2, 4);
  auto loader = MustCreate(o);
  ASSERT_NE(loader, nullptr);
  auto got = RunEpoch(*loader, 0);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectExactlyTheSamplersBatches(*got, o, 40, 0);
  EXPECT_EQ(loader->Stats().restarts_shm, 1);
}

TEST(LoaderFaults, RepeatedSigbusSaysSharedMemoryIsExhaustedAndHowToFixIt) {
  auto loader = MustCreate(Options("crash", "size=40,dim=2,at=9,signal=7", 2, 4));
  ASSERT_NE(loader, nullptr);
  auto got = RunEpoch(*loader, 0);
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(),
              AllOf(HasSubstr("SIGBUS"), HasSubstr("shared memory exhausted"),
                    HasSubstr("raise spec.shmSize"), HasSubstr("sample indices [8, 9, 10, 11]")));
}

TEST(LoaderFaults, ShmTooSmallFailsAtCreateWithTheFix) {
  testing::TempDir dir;
  LoaderOptions o = Options("index", "size=10", 2, 2);
  o.shm_dir = dir.path();
  o.slot_bytes = size_t{1} << 40;
  auto loader = Loader::Create(o);
  ASSERT_FALSE(loader.ok());
  EXPECT_EQ(loader.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(loader.status().message(),
              AllOf(HasSubstr(dir.path()), HasSubstr("free"), HasSubstr("8 slots x 1Ti"),
                    HasSubstr("raise spec.shmSize"), HasSubstr("rank 0")));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(LoaderFaults, SlotSizeFromEnvironmentIsChecked) {
  testing::TempDir dir;
  setenv(kEnvSlotBytes, "1099511627776", 1);
  setenv(kEnvShmDir, dir.path().c_str(), 1);
  auto loader = Loader::Create(Options("index", "size=10", 1, 2));
  unsetenv(kEnvSlotBytes);
  unsetenv(kEnvShmDir);
  ASSERT_FALSE(loader.ok());
  EXPECT_THAT(loader.status().message(), HasSubstr(dir.path()));
}

TEST(LoaderFaults, BatchLargerThanItsSlotNamesBothSizesAndTheOption) {
  auto loader = MustCreate(Options("varsize", "size=80,dim=16,grow_at=40,big_dim=50000", 2, 4));
  ASSERT_NE(loader, nullptr);
  auto got = RunEpoch(*loader, 0);
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(),
              AllOf(HasSubstr("batch 10 of epoch 0 needs"), HasSubstr("slot holds"),
                    HasSubstr("sized from the first batch"), HasSubstr("slot_bytes"),
                    HasSubstr("SPAWNPOINT_LOADER_SLOT_BYTES")));
  // With a slot size that fits, the same data loads.
  LoaderOptions o = Options("varsize", "size=80,dim=16,grow_at=40,big_dim=50000", 2, 4);
  o.slot_bytes = 1 << 20;
  auto sized = MustCreate(o);
  ASSERT_NE(sized, nullptr);
  auto ok = RunEpoch(*sized, 0);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->size(), 20u);
}

TEST(LoaderFaults, UnknownDatasetIsReportedByTheWorkers) {
  auto loader = Loader::Create(Options("no-such-dataset", "", 2, 2));
  ASSERT_FALSE(loader.ok());
  EXPECT_THAT(loader.status().message(),
              AllOf(HasSubstr("no-such-dataset"), HasSubstr("not registered"),
                    HasSubstr("augment, crash, hang, index")));
}

TEST(LoaderFaults, AWorkerCommandThatCannotStartIsReportedWithItsExitAndStderr) {
  LoaderOptions o = Options("index", "size=10", 1, 2);
  o.worker_command = {"/bin/sh", "-c", "echo missing libfoo.so >&2; exit 7"};
  // Long enough for the pool to record an exit however loaded the machine is.
  o.timeout = seconds(4);
  auto loader = Loader::Create(o);
  ASSERT_FALSE(loader.ok());
  // The start's wait or the I/O thread's "has not served", whichever looks first: both say
  // how the worker last exited and what it wrote.
  EXPECT_THAT(loader.status().code(),
              AnyOf(StatusCode::kDeadlineExceeded, StatusCode::kUnavailable));
  EXPECT_THAT(loader.status().message(), AllOf(HasSubstr("worker-0.sock"), HasSubstr("exit code 7"),
                                               HasSubstr("missing libfoo.so")));
}

// --- workers auto --------------------------------------------------------------------------

// Which worker count the search picks is AutoWorkerPolicy's business, tested on synthetic
// time (auto_worker_policy_test.cc): measured speed depends on what else the machine runs.
// Here the real pool under it, with assertions no load can break: the search ends within a
// bound that follows from the batch counts alone, stays within the pool (the CPU cap), and
// never costs or repeats a batch.

// Runs epoch 0 calling `step` after each batch; returns the batch after which the search
// settled (0 if it did not).
int64_t RunAutoEpoch(Loader& loader, const LoaderOptions& o, int64_t dataset_size,
                     const std::function<void()>& step = nullptr) {
  int64_t settled_after = 0;
  auto got = RunEpoch(loader, 0, [&](size_t k) {
    if (step) step();
    if (settled_after == 0 && loader.Stats().auto_settled) settled_after = static_cast<int64_t>(k);
  });
  EXPECT_TRUE(got.ok()) << got.status().ToString();
  if (got.ok()) ExpectExactlyTheSamplersBatches(*got, o, dataset_size, 0);
  const LoaderStats s = loader.Stats();
  EXPECT_TRUE(s.auto_workers);
  EXPECT_TRUE(s.auto_settled);
  EXPECT_GE(s.active_workers, 1);
  EXPECT_LE(s.active_workers, s.pool_workers);
  EXPECT_EQ(s.restarts_died + s.restarts_hung, 0);
  return settled_after;
}

TEST(LoaderAuto, ASlowTrainerSettlesWithinThePoolAndGetsEveryBatchOnce) {
  LoaderOptions o = Options("index", "size=600,dim=2", kAutoWorkers, 4);
  o.cpus = 2;
  o.auto_window = milliseconds(300);
  auto loader = MustCreate(o);
  ASSERT_NE(loader, nullptr);
  EXPECT_EQ(loader->Stats().pool_workers, 2);
  EXPECT_EQ(loader->Stats().active_workers, 1);
  // A batch takes at least the 8 ms step, so a 300 ms window holds at most 38 of them; with
  // 2 workers the search is over after 1 x 4 + 2 x 4 prefetched and 2 windows: <= 88.
  const int64_t settled_after =
      RunAutoEpoch(*loader, o, 600, [] { std::this_thread::sleep_for(milliseconds(8)); });
  EXPECT_GT(settled_after, 0);
  EXPECT_LE(settled_after, 88);
}

TEST(LoaderAuto, SlowSamplesSettleWithinTheCpusAndGetEveryBatchOnce) {
  // Samples that take 4 ms of waiting (not CPU): a batch keeps a worker >= 8 ms, so in a
  // 300 ms window n workers build at most n x 38 batches, and n x 2 were prefetched before it:
  // at most 41, 81 and 121 batches with 1, 2 and 3 workers, plus 2 x (1 + 2 + 3) skipped
  // after the changes: <= 255.
  LoaderOptions o = Options("index", "size=1200,dim=2,sleep_ms=4", kAutoWorkers, 2);
  o.cpus = 3;
  o.auto_window = milliseconds(300);
  auto loader = MustCreate(o);
  ASSERT_NE(loader, nullptr);
  EXPECT_EQ(loader->Stats().pool_workers, 3);
  const int64_t settled_after = RunAutoEpoch(*loader, o, 1200);
  EXPECT_GT(settled_after, 0);
  EXPECT_LE(settled_after, 255);
}

TEST(LoaderAuto, PoolIsCappedByTheRankCpus) {
  setenv(kEnvCpus, "3-3", 1);  // a single CPU, as a list
  LoaderOptions o = Options("index", "size=100,dim=2", kAutoWorkers, 4);
  auto loader = Loader::Create(o);
  unsetenv(kEnvCpus);
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  EXPECT_EQ((*loader)->Stats().pool_workers, 1);
  EXPECT_EQ((*loader)->Stats().active_workers, 1);
}

// --- agent mode ------------------------------------------------------------------------------

// Runs a PoolSupervisor the way the agent does: one long-lived thread spawns, reaps and
// respawns. It reaps by pid (pidfds) rather than waitpid(-1) because the test binary may
// have other children (trainer processes).
class AgentLikePool {
 public:
  AgentLikePool(int rank, int workers, std::vector<std::string> argv, int sink_fd = 2) {
    spec_.rank = rank;
    spec_.workers = workers;
    spec_.dir = dir_.File("rank-" + std::to_string(rank));
    spec_.argv = std::move(argv);
    for (char** e = environ; *e; ++e) spec_.env.push_back(*e);
    spec_.sink_fd = sink_fd;
    spec_.crash_loop_window = seconds(10);
    auto pool = StandalonePool::Start(spec_);
    EXPECT_TRUE(pool.ok()) << pool.status().ToString();
    if (pool.ok()) pool_ = std::move(pool).value();
  }
  PoolSupervisor& pool() { return pool_->pool(); }
  const std::string& dir() const { return spec_.dir; }
  std::map<std::string, std::string> RankEnv() const {
    return {{kEnvPoolDir, spec_.dir}, {kEnvWorkers, std::to_string(spec_.workers)}};
  }

 private:
  testing::TempDir dir_;
  PoolSpec spec_;
  std::unique_ptr<StandalonePool> pool_;
};

std::string SelfExe() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

class ScopedEnv {
 public:
  explicit ScopedEnv(const std::map<std::string, std::string>& vars) {
    for (const auto& [k, v] : vars) {
      setenv(k.c_str(), v.c_str(), 1);
      names_.push_back(k);
    }
  }
  ~ScopedEnv() {
    for (const auto& k : names_) unsetenv(k.c_str());
  }

 private:
  std::vector<std::string> names_;
};

TEST(LoaderAgentMode, ANewLoaderReconnectsToTheSameWorkers) {
  AgentLikePool agent(0, 2, {SelfExe()});
  ScopedEnv env(agent.RankEnv());
  LoaderOptions o = Options("index", "size=60,dim=4", kWorkersFromEnv, 4);
  std::vector<pid_t> pids;
  {
    auto first = MustCreate(o);
    ASSERT_NE(first, nullptr);
    pids = first->WorkerPids();
    std::vector<pid_t> pool_pids = agent.pool().Pids();
    std::sort(pool_pids.begin(), pool_pids.end());
    auto sorted = pids;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, pool_pids);
    for (int e = 0; e < 2; ++e) {
      auto got = RunEpoch(*first, e);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ExpectExactlyTheSamplersBatches(*got, o, 60, e);
    }
    // Statistics for the agent, rewritten about every second.
    EXPECT_TRUE(testing::WaitUntil(
        [&] {
          auto j = nlohmann::json::parse(testing::ReadFile(StatsPath(agent.dir())), nullptr, false);
          return !j.is_discarded() && j.value("batches", 0) == 30;
        },
        seconds(5)));
  }
  // A restarted rank: a new Loader, the same pool, the same processes.
  auto second = MustCreate(o);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->WorkerPids(), pids);
  auto got = RunEpoch(*second, 0);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectExactlyTheSamplersBatches(*got, o, 60, 0);
  EXPECT_EQ(agent.pool().Exits(), 0);
}

TEST(LoaderAgentMode, WorkersOutliveAKilledTrainerProcess) {
  AgentLikePool agent(0, 2, {TRAINER_BIN});
  const std::vector<std::string> args = {TRAINER_BIN, "--print-pids",
                                         "--dataset", "index",
                                         "--arg",     "size=400,dim=64,sleep_ms=3",
                                         "--batch",   "4",
                                         "--workers", "-1"};
  std::vector<pid_t> pool_pids = agent.pool().Pids();
  std::sort(pool_pids.begin(), pool_pids.end());
  std::string first_pids;
  {
    testing::TestProcess rank(args, agent.RankEnv());
    // Killed mid-epoch, with batches in flight at the workers.
    ASSERT_TRUE(testing::WaitUntil(
        [&] { return testing::CountLines(rank.Stdout(), "batch ") >= 5; }, seconds(20)))
        << rank.Stderr();
    kill(rank.pid(), SIGKILL);
    EXPECT_EQ(rank.Wait(seconds(10)), 128 + SIGKILL);
    std::istringstream out(rank.Stdout());
    std::getline(out, first_pids);
  }
  testing::TestProcess again({TRAINER_BIN, "--print-pids", "--dataset", "index", "--arg",
                              "size=40,dim=64", "--batch", "4", "--workers", "-1", "--epochs", "2"},
                             agent.RankEnv());
  ASSERT_EQ(again.Wait(seconds(30)), 0) << again.Stderr();
  const std::string out = again.Stdout();
  EXPECT_THAT(out, HasSubstr(first_pids + "\n"));
  EXPECT_EQ(testing::CountLines(out, " ok=1"), 20);
  EXPECT_EQ(testing::CountLines(out, " ok=0"), 0);
  std::vector<pid_t> after = agent.pool().Pids();
  std::sort(after.begin(), after.end());
  EXPECT_EQ(after, pool_pids);
  EXPECT_EQ(agent.pool().Exits(), 0);
}

TEST(LoaderAgentMode, AWorkerKilledUnderTheAgentIsRespawnedAndReconnected) {
  AgentLikePool agent(1, 2, {SelfExe()});
  ScopedEnv env(agent.RankEnv());
  LoaderOptions o = Options("index", "size=200,dim=4,sleep_ms=2", kWorkersFromEnv, 4);
  o.rank = 1;
  o.world_size = 2;
  auto loader = MustCreate(o);
  ASSERT_NE(loader, nullptr);
  const pid_t victim = loader->WorkerPids()[1];
  auto got = RunEpoch(*loader, 0, [&](size_t k) {
    if (k == 4) kill(victim, SIGKILL);
  });
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectExactlyTheSamplersBatches(*got, o, 200, 0);
  auto record = ReadExitRecord(WorkerExitRecordPath(agent.dir(), 1));
  ASSERT_TRUE(record.ok()) << record.status().ToString();
  EXPECT_EQ(record->pid, victim);
  EXPECT_EQ(record->status.signal, SIGKILL);
  EXPECT_EQ(agent.pool().Exits(), 1);
  EXPECT_EQ(loader->Stats().restarts_died, 1);
}

// A worker stopped (SIGSTOP) while no rank used it never answers the next rank's Loader: it
// is killed as hung at the timeout and its successor serves, instead of the rank failing
// with "no answer within N s". Found by the chaos run (tests/chaos): a loader worker
// SIGSTOPped, then its rank SIGKILLed and restarted in place, failed the job.
TEST(LoaderAgentMode, AWorkerThatNeverAnswersANewLoaderIsKilledAsHungAndReplaced) {
  AgentLikePool agent(0, 2, {SelfExe()});
  ScopedEnv env(agent.RankEnv());
  LoaderOptions o = Options("index", "size=60,dim=4", kWorkersFromEnv, 4);
  o.timeout = std::chrono::milliseconds(1000);
  pid_t victim = 0;
  {
    auto first = MustCreate(o);
    ASSERT_NE(first, nullptr);
    victim = first->WorkerPids()[0];
    auto got = RunEpoch(*first, 0);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
  }
  ASSERT_EQ(kill(victim, SIGSTOP), 0);
  auto second = MustCreate(o);
  ASSERT_NE(second, nullptr);
  auto got = RunEpoch(*second, 0);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectExactlyTheSamplersBatches(*got, o, 60, 0);
  EXPECT_NE(second->WorkerPids()[0], victim);
  EXPECT_EQ(second->Stats().restarts_hung, 1);
  EXPECT_EQ(agent.pool().Exits(), 1);
}

TEST(LoaderAgentMode, NoPoolAtTheGivenDirectoryIsAnErrorNotAHang) {
  testing::TempDir dir;
  ScopedEnv env({{kEnvPoolDir, dir.path()}, {kEnvWorkers, "1"}});
  LoaderOptions o = Options("index", "size=10", kWorkersFromEnv, 2);
  o.timeout = milliseconds(500);
  auto loader = Loader::Create(o);
  ASSERT_FALSE(loader.ok());
  // Two clocks of the same length end it, whichever looks first on a busy machine: the
  // start's wait (DeadlineExceeded) or the I/O thread's "has not served" (Unavailable). Both
  // name the socket and why it cannot be reached.
  EXPECT_THAT(loader.status().code(),
              AnyOf(StatusCode::kDeadlineExceeded, StatusCode::kUnavailable));
  EXPECT_THAT(loader.status().message(), AllOf(HasSubstr(WorkerSocketPath(dir.path(), 0)),
                                               HasSubstr("No such file or directory")));
}

TEST(LoaderAgentMode, APoolThatGoesAwayFailsNextInsteadOfHanging) {
  auto agent = std::make_unique<AgentLikePool>(0, 1, std::vector<std::string>{SelfExe()});
  ScopedEnv env(agent->RankEnv());
  LoaderOptions o = Options("index", "size=100000,dim=2", kWorkersFromEnv, 2);
  // A first Loader with the usual timeout waits out the worker's start, however slow the
  // machine is; the 1 s one below then only needs an answer from a running worker.
  ASSERT_NE(MustCreate(o), nullptr);
  o.timeout = seconds(1);
  auto loader = MustCreate(o);
  ASSERT_NE(loader, nullptr);
  ASSERT_TRUE(loader->StartEpoch(0).ok());
  ASSERT_TRUE(loader->Next().ok());
  agent.reset();  // the agent stops its pool and is gone
  Status failure;
  for (int i = 0; i < 100000 && failure.ok(); ++i) {
    auto b = loader->Next();
    if (!b.ok()) failure = b.status();
  }
  EXPECT_EQ(failure.code(), StatusCode::kUnavailable);
  EXPECT_THAT(failure.message(),
              AllOf(HasSubstr("has not served for 1 s"), HasSubstr("is its pool's owner")));
}

// --- the pool client on its own ----------------------------------------------------------

// PoolClient driven as a Python rank's service will drive it: sample indices in, ready slots
// out; no sampler and no Dataset on this side.
class PoolClientTest : public ::testing::Test {
 protected:
  PoolClientOptions ClientOptions() const {
    return {.dir = agent_.dir(),
            .workers = 2,
            .initial_active = 2,
            .timeout = seconds(20),
            .dataset = "index",
            .dataset_arg = "size=50,dim=3",
            .probe_batch = [](int64_t) {
              return std::vector<int64_t>{0, 1, 2, 3};
            }};
  }
  // What the "index" field of a ready batch says, read from its slot.
  static std::vector<int64_t> IndexField(const PoolClient& client, const ReadyBatch& r) {
    for (const auto& f : r.fields) {
      if (f.value("name", "") != "index") continue;
      const auto* p = reinterpret_cast<const int64_t*>(client.ring()->Slot(r.slot) +
                                                       f.value("offset", size_t{0}));
      return std::vector<int64_t>(p, p + f.value("nbytes", size_t{0}) / sizeof(int64_t));
    }
    return {};
  }

  AgentLikePool agent_{0, 2, {SelfExe()}};
};

TEST_F(PoolClientTest, SampleIndicesInReadySlotsOutEachExactlyOnce) {
  PoolClient client(ClientOptions());
  ASSERT_TRUE(client.Start().ok());
  EXPECT_EQ(client.dataset_size(), 50);
  // Indices in an order no sampler would choose, in an epoch that never started.
  const std::vector<std::vector<int64_t>> batches = {{49, 3}, {7}, {0, 1, 2, 10}, {25, 24, 23}};
  client.Submit(5, 0, batches);
  for (int64_t b = 0; b < 4; ++b) {
    auto r = client.Take(5, b, seconds(10));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(r->has_value()) << "batch " << b;
    const ReadyBatch& ready = **r;
    EXPECT_EQ(ready.epoch, 5);
    EXPECT_EQ(ready.batch, b);
    EXPECT_EQ(ready.indices, batches[static_cast<size_t>(b)]);
    EXPECT_EQ(IndexField(client, ready), batches[static_cast<size_t>(b)]);
    client.Release(ready.slot);
  }
  auto none = client.Take(5, 4, milliseconds(100));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  EXPECT_EQ(client.Stats().queue_depth, 0);
  EXPECT_EQ(client.Stats().in_flight, 0);
}

TEST_F(PoolClientTest, DroppedEpochsAreNeverHandedOutAndFreeTheirSlots) {
  PoolClient client(ClientOptions());
  ASSERT_TRUE(client.Start().ok());
  client.Submit(0, 0, {{1}, {2}, {3}, {4}, {5}, {6}});
  client.Submit(1, 0, {{7}, {8}});
  client.DropAllBut(1);
  for (int64_t b = 0; b < 2; ++b) {
    auto r = client.Take(1, b, seconds(10));
    ASSERT_TRUE(r.ok() && r->has_value()) << "batch " << b;
    EXPECT_EQ((*r)->indices, std::vector<int64_t>{7 + b});
    client.Release((*r)->slot);
  }
  auto dropped = client.Take(0, std::nullopt, milliseconds(100));
  ASSERT_TRUE(dropped.ok());
  EXPECT_FALSE(dropped->has_value());
  // Every slot comes back, also those of batches dropped while at a worker.
  EXPECT_TRUE(testing::WaitUntil(
      [&] { return client.slot_pool()->FreeCount() == client.slot_count(); }, seconds(10)));
}

// --- strict round robin ------------------------------------------------------------------

// PoolClient with strict_round_robin over three workers, worker 1 slower than the others.
class StrictRoundRobinTest : public ::testing::Test {
 protected:
  PoolClientOptions ClientOptions(const std::string& dataset, const std::string& arg) const {
    return {.dir = agent_.dir(),
            .workers = 3,
            .initial_active = 3,
            .timeout = seconds(20),
            .strict_round_robin = true,
            .dataset = dataset,
            .dataset_arg = arg,
            .probe_batch = [](int64_t) {
              return std::vector<int64_t>{0, 1, 2, 3};
            }};
  }

  // Submits `batches` of 4 samples (sample k * 11 mod size at position k, size = 4 x
  // batches) as `epoch`,
  // takes them in order and expects batch b from worker b % 3, its "worker" field too, and
  // its samples. Returns each batch's "pid" field (of its first sample).
  static std::vector<int64_t> ExpectRoundRobin(PoolClient& client, int64_t epoch, int64_t batches) {
    std::vector<std::vector<int64_t>> submitted(static_cast<size_t>(batches));
    const int64_t size = 4 * batches;
    for (int64_t k = 0; k < size; ++k) submitted[k / 4].push_back(k * 11 % size);
    client.Submit(epoch, 0, submitted);
    std::vector<int64_t> pids;
    for (int64_t b = 0; b < batches; ++b) {
      auto r = client.Take(epoch, b, seconds(30));
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      if (!r.ok() || !r->has_value()) {
        ADD_FAILURE() << "no batch " << b << " of epoch " << epoch;
        return pids;
      }
      const ReadyBatch& ready = **r;
      EXPECT_EQ(ready.worker, b % 3) << "epoch " << epoch << " batch " << b;
      EXPECT_EQ(Int64Field(client, ready, "index"), submitted[static_cast<size_t>(b)]);
      for (int32_t w : Int32Field(client, ready, "worker")) EXPECT_EQ(w, b % 3);
      pids.push_back(Int64Field(client, ready, "pid").at(0));
      client.Release(ready.slot);
    }
    return pids;
  }

  static const nlohmann::json* FieldNamed(const ReadyBatch& r, const std::string& name) {
    for (const auto& f : r.fields) {
      if (f.value("name", "") == name) return &f;
    }
    return nullptr;
  }
  template <typename T>
  static std::vector<T> Read(const PoolClient& client, const ReadyBatch& r,
                             const std::string& name) {
    const nlohmann::json* f = FieldNamed(r, name);
    if (f == nullptr) return {};
    const auto* p =
        reinterpret_cast<const T*>(client.ring()->Slot(r.slot) + f->value("offset", size_t{0}));
    return std::vector<T>(p, p + f->value("nbytes", size_t{0}) / sizeof(T));
  }
  static std::vector<int64_t> Int64Field(const PoolClient& c, const ReadyBatch& r,
                                         const std::string& name) {
    return Read<int64_t>(c, r, name);
  }
  static std::vector<int32_t> Int32Field(const PoolClient& c, const ReadyBatch& r,
                                         const std::string& name) {
    return Read<int32_t>(c, r, name);
  }

  testing::TempDir dir_;
  AgentLikePool agent_{0, 3, {SelfExe()}};
};

// Epochs of 13 batches (more than the 6 issued at once, and no multiple of 3): each restarts
// at worker 0, as DataLoader's does.
TEST_F(StrictRoundRobinTest, BatchBIsWorkerBModWorkersEveryEpochThoughOneWorkerIsSlow) {
  PoolClient client(ClientOptions("index", "size=52,dim=2,sleep_ms=30,slow_worker=1"));
  ASSERT_TRUE(client.Start().ok());
  const std::vector<pid_t> pids = client.WorkerPids();
  for (int64_t epoch = 0; epoch < 2; ++epoch) ExpectRoundRobin(client, epoch, 13);
  EXPECT_EQ(client.WorkerPids(), pids);
}

// The first batch is built in place (protocol.h's in-place probe): in a file that becomes
// the ring, slot 0, and handed over as batch 0 of epoch 0 with no task and no copy; the
// rest of the ring is reserved meanwhile. (The other tests here probe a batch that is not
// the first one submitted: its slot is freed and the batch built as a task.)
TEST_F(StrictRoundRobinTest, TheProbedFirstBatchIsBuiltInItsSlotAndHandedOver) {
  PoolClientOptions o = ClientOptions("index", "size=52,dim=2");
  o.probe_batch = [](int64_t) { return std::vector<int64_t>{0, 11, 22, 33}; };
  PoolClient client(o);
  ASSERT_TRUE(client.Start().ok());
  const PoolStartTimes t = client.start_times();
  EXPECT_TRUE(t.in_place);
  EXPECT_GE(t.probe_build_s, 0);
  ExpectRoundRobin(client, 0, 13);
  ExpectRoundRobin(client, 1, 13);
}

// Worker 1 dies once on sample 10, in batch 7 (positions 28-31 hold 28, 39, 10, 21): its
// tasks wait for its successor, which builds them; no other worker does.
TEST_F(StrictRoundRobinTest, ADeadWorkersBatchesGoToItsSuccessor) {
  PoolClient client(
      ClientOptions("crash", "size=40,dim=2,at=10,signal=9,marker=" + dir_.File("crashed-once")));
  ASSERT_TRUE(client.Start().ok());
  const pid_t first = client.WorkerPids()[1];
  const std::vector<int64_t> pids = ExpectRoundRobin(client, 0, 10);
  ASSERT_EQ(pids.size(), 10u);
  EXPECT_NE(pids[7], first);
  EXPECT_NE(client.WorkerPids()[1], first);
  EXPECT_EQ(client.Stats().restarts_died, 1);
}

// Worker 1 hangs once on sample 10 (batch 7) and is killed after the timeout: the batch goes
// back to worker 1's successor.
TEST_F(StrictRoundRobinTest, AHungWorkersBatchesGoToItsSuccessor) {
  PoolClientOptions o =
      ClientOptions("hang", "size=40,dim=2,at=10,marker=" + dir_.File("hung-once"));
  o.timeout = seconds(2);
  PoolClient client(o);
  ASSERT_TRUE(client.Start().ok());
  const pid_t first = client.WorkerPids()[1];
  const std::vector<int64_t> pids = ExpectRoundRobin(client, 0, 10);
  ASSERT_EQ(pids.size(), 10u);
  EXPECT_NE(pids[7], first);
  EXPECT_EQ(client.Stats().restarts_hung, 1);
}

// --- waiting for a CPU is not hanging -------------------------------------------------------

// PoolClient on a SimulatedClock over one real worker, with what it reads about the worker's
// process injected (PoolClientOptions::process_times): the test says how long the worker
// waited for a CPU. The I/O thread ticks every simulated millisecond, and CheckHung runs
// before on_tick with the same time, so Step() returns once the client has looked at the
// new time. The timeout is 60 s: looks every 7.5 s, the first one the CPU wait's baseline.
class StarvedWorkerTest : public ::testing::Test {
 protected:
  static constexpr milliseconds kTimeout = seconds(60);

  PoolClientOptions ClientOptions(const std::string& dataset, const std::string& arg) {
    return {.dir = agent_.dir(),
            .workers = 1,
            .initial_active = 1,
            .timeout = kTimeout,
            .dataset = dataset,
            .dataset_arg = arg,
            .probe_batch =
                [](int64_t) {
                  return std::vector<int64_t>{0, 1};
                },
            .on_tick =
                [this] {
                  std::lock_guard<std::mutex> lock(mu_);
                  ++ticks_;
                },
            .tick_interval = milliseconds(1),
            .clock = &clock_,
            .process_times = [this](pid_t pid) { return Times(pid); }};
  }

  // The victim has lived 1000 s when the test starts, and waited for a CPU as SetWait says;
  // any other process (its successor) has just started and never waited.
  std::optional<ProcessTimes> Times(pid_t pid) {
    std::lock_guard<std::mutex> lock(mu_);
    ++reads_;
    if (pid != victim_) return ProcessTimes{Clock::Duration{0}, Clock::Duration{0}};
    return ProcessTimes{seconds(1000) + (clock_.Now() - start_), wait_};
  }
  // Worker 0's pid of a pool started (on the real clock and the real /proc readings) and left
  // running for the test's own client to meet; 0 if that start failed.
  pid_t FirstWorkerOfAPool(std::optional<std::chrono::milliseconds> timeout = std::nullopt) {
    PoolClientOptions o = ClientOptions("index", "size=20,dim=2");
    o.clock = RealClock::Get();
    o.on_tick = nullptr;
    o.process_times = ReadProcessTimes;
    if (timeout) o.timeout = *timeout;
    PoolClient first(o);
    if (!first.Start().ok()) return 0;
    return first.WorkerPids()[0];
  }
  void SetVictim(pid_t pid) {
    std::lock_guard<std::mutex> lock(mu_);
    victim_ = pid;
  }
  void SetWait(std::optional<Clock::Duration> wait) {
    std::lock_guard<std::mutex> lock(mu_);
    wait_ = wait;
  }
  int Ticks() {
    std::lock_guard<std::mutex> lock(mu_);
    return ticks_;
  }
  int Reads() {
    std::lock_guard<std::mutex> lock(mu_);
    return reads_;
  }
  void WaitForFirstTick() {
    ASSERT_TRUE(testing::WaitUntil([&] { return Ticks() > 0; }, seconds(20)));
  }
  // Returns once the client has read the silent worker's times once: its baseline. A tick
  // alone is not enough: the client may connect after it, and read the baseline at a later
  // tick, after the test changed the wait it would then read (seen 1 in 3 runs: the baseline
  // read the new wait, none of it counted as waiting, and the worker was killed at once).
  void WaitForTheBaseline() {
    WaitForFirstTick();
    ASSERT_TRUE(testing::WaitUntil([&] { return Reads() > 0; }, seconds(20)));
  }
  // Advances the clock by `d` and returns once the I/O thread has looked at the new time.
  void Step(Clock::Duration d) {
    const int before = Ticks();
    clock_.Advance(d);
    ASSERT_TRUE(testing::WaitUntil([&] { return Ticks() > before; }, seconds(20)));
  }
  // Worker 0 hangs on sample 5 (a real hang: pause()); the test says whether it is starved.
  // Returns once batch 0 of epoch 1 is at the worker, the clock not moved since.
  void StartHungBatch(PoolClient& client) {
    ASSERT_TRUE(client.Start().ok());
    WaitForFirstTick();
    SetVictim(client.WorkerPids()[0]);
    client.Submit(1, 0, {{4, 5}});
    ASSERT_TRUE(testing::WaitUntil([&] { return client.Stats().in_flight == 1; }, seconds(20)));
  }
  // Its successor builds the batch.
  static void ExpectTheBatchFromASuccessor(PoolClient& client) {
    auto r = client.Take(1, 0, seconds(30));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(r->has_value());
    EXPECT_EQ((*r)->indices, (std::vector<int64_t>{4, 5}));
    EXPECT_EQ(client.Stats().restarts_hung, 1);
  }
  std::string HangOnce() const { return "size=20,dim=2,at=5,marker=" + dir_.File("hung-once"); }

  testing::TempDir dir_;
  AgentLikePool agent_{0, 1, {SelfExe()}};
  SimulatedClock clock_;
  const Clock::TimePoint start_ = clock_.Now();
  std::mutex mu_;
  int ticks_ = 0;
  int reads_ = 0;  // of Times()
  pid_t victim_ = -1;
  std::optional<Clock::Duration> wait_ = Clock::Duration{0};
};

// Its batch overdue by 65 s of wall time, 50 of them waiting for a CPU: not hung. It gets
// the CPU from then on: killed when 60 s count, 110 s in.
TEST_F(StarvedWorkerTest, ATaskOverdueOnlyByWaitsForACpuDoesNotKillItsWorkerUntilTheRestIs) {
  PoolClient client(ClientOptions("hang", HangOnce()));
  StartHungBatch(client);
  SetWait(seconds(100));
  Step(milliseconds(7500));  // the baseline
  SetWait(seconds(150));
  Step(milliseconds(57500));  // 65 s in, 15 s counted
  EXPECT_EQ(client.Stats().hung_kills, 0);
  Step(seconds(44));  // 109 s in, 59 s counted
  EXPECT_EQ(client.Stats().hung_kills, 0);
  Step(seconds(1));
  EXPECT_EQ(client.Stats().hung_kills, 1);
  ExpectTheBatchFromASuccessor(client);
}

// Waiting for a CPU all the time, it is still killed at 10 timeouts of wall time.
TEST_F(StarvedWorkerTest, AWorkerStarvedForGoodIsKilledAtTheCeiling) {
  PoolClient client(ClientOptions("hang", HangOnce()));
  StartHungBatch(client);
  SetWait(seconds(100));
  Step(milliseconds(7500));
  SetWait(seconds(100) + seconds(599) - milliseconds(7500));
  Step(seconds(599) - milliseconds(7500));  // 599 s in, 7.5 s counted
  EXPECT_EQ(client.Stats().hung_kills, 0);
  SetWait(seconds(100) + seconds(600) - milliseconds(7500));
  Step(seconds(1));
  EXPECT_EQ(client.Stats().hung_kills, 1);
  ExpectTheBatchFromASuccessor(client);
}

// No CPU wait can be read (a kernel without schedstats): killed at the timeout, as always.
TEST_F(StarvedWorkerTest, WithoutReadingsAWorkerIsKilledAtTheTimeout) {
  PoolClient client(ClientOptions("hang", HangOnce()));
  SetWait(std::nullopt);
  StartHungBatch(client);
  Step(milliseconds(7500));
  Step(kTimeout - milliseconds(7500) - milliseconds(1));
  EXPECT_EQ(client.Stats().hung_kills, 0);
  Step(milliseconds(1));
  EXPECT_EQ(client.Stats().hung_kills, 1);
  ExpectTheBatchFromASuccessor(client);
}

// A worker that says no Hello to a new connection (stopped here; starved, the test says):
// 65 s without an answer, 50 of them waiting for a CPU, is neither killed nor reason to give
// up on the pool; once 60 s count it is killed and its successor answers.
TEST_F(StarvedWorkerTest, ASilentWorkerWaitingForACpuIsNotKilledUntilTheRestIsOverdue) {
  const pid_t victim = FirstWorkerOfAPool();
  ASSERT_GT(victim, 0);
  SetVictim(victim);
  SetWait(seconds(100));  // Start reads the baseline
  ASSERT_EQ(kill(victim, SIGSTOP), 0);
  PoolClient client(ClientOptions("index", "size=20,dim=2"));
  Status started = Internal("not returned");
  std::thread start([&] { started = client.Start(); });  // waits for a Hello
  WaitForTheBaseline();
  SetWait(seconds(150));
  Step(seconds(65));  // 65 s in, 15 s counted
  EXPECT_EQ(client.Stats().hung_kills, 0);
  EXPECT_TRUE(client.error().ok()) << client.error().ToString();
  Step(seconds(44));
  EXPECT_EQ(client.Stats().hung_kills, 0);
  EXPECT_TRUE(client.error().ok()) << client.error().ToString();
  Step(seconds(1));  // 110 s in, 60 s counted
  EXPECT_EQ(client.Stats().hung_kills, 1);
  start.join();
  ASSERT_TRUE(started.ok()) << started.ToString();
  EXPECT_NE(client.WorkerPids()[0], victim);
  EXPECT_EQ(client.Stats().restarts_hung, 1);
}

// The same during Start(), whose own wait (as long as the timeout) ends while the worker is
// spared: Start looks at it itself, and waits on instead of failing with "no answer within
// 1 s".
TEST_F(StarvedWorkerTest, StartWaitsOnForASilentWorkerWaitingForACpu) {
  const pid_t victim = FirstWorkerOfAPool(seconds(20));
  ASSERT_GT(victim, 0);
  SetVictim(victim);
  SetWait(seconds(100));  // Start reads the baseline
  ASSERT_EQ(kill(victim, SIGSTOP), 0);
  PoolClientOptions o = ClientOptions("index", "size=20,dim=2");
  o.timeout = seconds(1);
  PoolClient client(o);
  Status started = Internal("not returned");
  std::thread start([&] { started = client.Start(); });
  WaitForTheBaseline();
  SetWait(seconds(100) + milliseconds(1300));
  const int reads = Reads();
  Step(milliseconds(1500));  // 1.5 s in, 0.2 s counted
  // One of them looked, the I/O thread or Start (its wait over), and spared the worker; the
  // one that looks first may leave the other no reason to look before the clock moves (seen:
  // Start first, and the I/O thread did not read again), and a later look reads the same.
  EXPECT_TRUE(testing::WaitUntil([&] { return Reads() > reads; }, seconds(20)));
  EXPECT_EQ(client.Stats().hung_kills, 0);
  EXPECT_TRUE(client.error().ok()) << client.error().ToString();
  Step(seconds(1));  // 2.5 s in, 1.2 s counted
  start.join();
  ASSERT_TRUE(started.ok()) << started.ToString();
  EXPECT_EQ(client.Stats().hung_kills, 1);
  EXPECT_NE(client.WorkerPids()[0], victim);
}

// --- the program as a user runs it -------------------------------------------------------

TEST(LoaderProgram, StandaloneRunForwardsWorkerOutputAndLeavesNothingBehind) {
  testing::TestProcess p({TRAINER_BIN, "--print-pids", "--dataset", "index", "--arg",
                          "size=30,dim=2,print=1", "--batch", "5", "--workers", "2", "--epochs",
                          "2"});
  ASSERT_EQ(p.Wait(seconds(30)), 0) << p.Stderr();
  EXPECT_EQ(testing::CountLines(p.Stdout(), " ok=1"), 12);
  EXPECT_EQ(testing::CountLines(p.Stderr(), "[rank 0 worker 0] dataset ready in pid"), 1);
  EXPECT_EQ(testing::CountLines(p.Stderr(), "[rank 0 worker 1] dataset ready in pid"), 1);
  std::istringstream out(p.Stdout());
  std::string word;
  out >> word;
  ASSERT_EQ(word, "pids");
  for (int i = 0; i < 2; ++i) {
    pid_t pid = 0;
    out >> pid;
    EXPECT_FALSE(testing::ProcessExists(pid)) << pid;
  }
  for (const auto& entry :
       std::filesystem::directory_iterator(std::filesystem::temp_directory_path())) {
    EXPECT_THAT(
        entry.path().filename().string(),
        ::testing::Not(::testing::StartsWith("spawnpoint-" + std::to_string(p.pid()) + "-rank")));
  }
}

TEST(LoaderProgram, AProgramWithoutTheWorkerEntryPointIsTold) {
  testing::TestProcess p({TRAINER_BIN, "--no-worker-entry", "--workers", "2"});
  EXPECT_EQ(p.Wait(seconds(20)), 1);
  EXPECT_THAT(p.Stderr(), HasSubstr("RunWorkerIfRequested(argc, argv) first thing in main"));
}

// --- the pool on its own ---------------------------------------------------------------------

class SinkFile {
 public:
  SinkFile() : fd_(open(dir_.File("sink").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644)) {}
  ~SinkFile() { close(fd_); }
  int fd() const { return fd_; }
  std::string Text() const { return testing::ReadFile(dir_.File("sink")); }

 private:
  testing::TempDir dir_;
  int fd_;
};

TEST(PoolSupervisor, WorkersGetTheListeningSocketAndTheirIdentity) {
  SinkFile sink;
  AgentLikePool agent(
      2, 2,
      {"/bin/sh", "-c",
       "echo \"env $SPAWNPOINT_LOADER_LISTEN_FD $SPAWNPOINT_LOADER_WORKER_ID "
       "$SPAWNPOINT_LOADER_RANK $SPAWNPOINT_LOADER_INCARNATION $(readlink /proc/$$/fd/3)\"; "
       "exec sleep 600"},
      sink.fd());
  ASSERT_TRUE(testing::WaitUntil([&] { return testing::CountLines(sink.Text(), "] env 3 ") == 2; },
                                 seconds(10)))
      << sink.Text();
  EXPECT_THAT(sink.Text(), HasSubstr("[rank 2 worker 0] env 3 0 2 0 socket:["));
  EXPECT_THAT(sink.Text(), HasSubstr("[rank 2 worker 1] env 3 1 2 0 socket:["));
  EXPECT_FALSE(agent.pool().OnChildExited(getpid(), 0)) << "not one of its workers";
}

TEST(PoolSupervisor, ExitRecordsCarryTheCauseAndStderrTailAndWorkersRespawn) {
  SinkFile sink;
  AgentLikePool agent(
      5, 1,
      {"/bin/sh", "-c",
       "echo to-stdout; i=1; while [ $i -le 30 ]; do echo line$i >&2; i=$((i+1)); done; "
       "[ \"$SPAWNPOINT_LOADER_INCARNATION\" = 0 ] && exit 3; exec sleep 600"},
      sink.fd());
  const std::string path = WorkerExitRecordPath(agent.dir(), 0);
  ASSERT_TRUE(testing::WaitUntil([&] { return ReadExitRecord(path).ok(); }, seconds(10)));
  auto r = ReadExitRecord(path);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->incarnation, 0);
  EXPECT_EQ(r->status.exit_code, 3);
  EXPECT_EQ(r->cause.reason, agent::ExitReason::kUserError);
  ASSERT_EQ(r->stderr_tail.size(), 20u);
  EXPECT_EQ(r->stderr_tail.front(), "line11");
  EXPECT_EQ(r->stderr_tail.back(), "line30");
  // Respawned as incarnation 1, which stays up.
  ASSERT_TRUE(testing::WaitUntil([&] { return agent.pool().WorkerPid(0) > 0; }, seconds(10)));
  EXPECT_NE(agent.pool().WorkerPid(0), r->pid);
  EXPECT_TRUE(testing::WaitUntil(
      [&] { return testing::CountLines(sink.Text(), "[rank 5 worker 0] to-stdout") == 2; },
      seconds(10)));
  EXPECT_THAT(sink.Text(), HasSubstr("[rank 5 worker 0] spawnpoint: pid " + std::to_string(r->pid) +
                                     " (incarnation 0) exited: exit code 3"));
  EXPECT_EQ(agent.pool().StatusJson()["workers"][0]["incarnation"], 1);
}

TEST(PoolSupervisor, ASigkillWhileTheCgroupCountsAnOomKillIsRecordedAsOom) {
  testing::TempDir dir;
  const std::string events = dir.File("memory.events");
  testing::WriteFile(events, "low 0\nhigh 0\nmax 0\noom 1\noom_kill 1\n");
  auto spawner = agent::MakeVforkSpawner();
  PoolSpec spec;
  spec.workers = 1;
  spec.dir = dir.File("pool");
  spec.argv = {"/bin/sh", "-c", "exec sleep 600"};
  spec.memory_events_path = events;
  PoolSupervisor pool(spawner.get(), spec);
  ASSERT_TRUE(pool.Start().ok());
  const pid_t pid = pool.WorkerPid(0);
  // The kernel's OOM killer, as the cgroup reports it.
  testing::WriteFile(events, "low 0\nhigh 0\nmax 0\noom 2\noom_kill 2\n");
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(pool.OnChildExited(pid, status));
  auto r = ReadExitRecord(WorkerExitRecordPath(spec.dir, 0));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->cause.reason, agent::ExitReason::kOomKilled);
  EXPECT_THAT(r->cause.message, HasSubstr("from 1 to 2"));
  pool.StopAndReap(seconds(5));
}

TEST(PoolSupervisor, ACrashLoopIsSlowedDownAndSaysSo) {
  SinkFile sink;
  AgentLikePool agent(0, 1, {"/bin/sh", "-c", "exit 1"}, sink.fd());
  ASSERT_TRUE(testing::WaitUntil(
      [&] { return sink.Text().find("crash-looping") != std::string::npos; }, seconds(10)))
      << sink.Text();
  const int64_t exits = agent.pool().Exits();
  EXPECT_EQ(exits, 6);
  // While the delay runs nothing is spawned.
  EXPECT_EQ(agent.pool().WorkerPid(0), 0);
  EXPECT_TRUE(agent.pool().TimeToNextRespawn().has_value());
  // And it keeps trying afterwards.
  EXPECT_TRUE(testing::WaitUntil([&] { return agent.pool().Exits() > exits; }, seconds(5)));
}

TEST(PoolSupervisor, StopAndReapLeavesNoProcess) {
  testing::TempDir dir;
  auto spawner = agent::MakeVforkSpawner();
  PoolSpec spec;
  spec.workers = 2;
  spec.dir = dir.File("pool");
  spec.argv = {"/bin/sh", "-c", "exec sleep 600"};
  std::vector<pid_t> pids;
  {
    PoolSupervisor pool(spawner.get(), spec);
    ASSERT_TRUE(pool.Start().ok());
    pids = pool.Pids();
    ASSERT_EQ(pids.size(), 2u);
    EXPECT_TRUE(std::filesystem::exists(WorkerSocketPath(spec.dir, 0)));
    pool.StopAndReap(seconds(5));
    EXPECT_TRUE(pool.Pids().empty());
  }
  for (pid_t p : pids) EXPECT_FALSE(testing::ProcessExists(p));
  EXPECT_FALSE(std::filesystem::exists(WorkerSocketPath(spec.dir, 0)));
}

}  // namespace
}  // namespace spawnpoint::loader

int main(int argc, char** argv) {
  if (int rc = spawnpoint::loader::RunWorkerIfRequested(argc, argv); rc >= 0) return rc;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
