// Unit tests of the loader's pure parts: data types and collation, the sampler, seeds, the
// wire protocol (over a socketpair), the shared-memory ring and the pool contract files.
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <numeric>
#include <set>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/loader/contract.h"
#include "agent/loader/dataset.h"
#include "agent/loader/protocol.h"
#include "agent/loader/sampler.h"
#include "agent/loader/shm_ring.h"
#include "agent/loader/types.h"
#include "tests/support/test_process.h"

namespace spawnpoint::loader {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Sample MakeSample(int64_t index, int dim) {
  Sample s;
  s.AddScalar<int64_t>("index", index);
  auto v = s.Add("value", DType::kF32, {dim}).As<float>();
  for (int i = 0; i < dim; ++i) v[static_cast<size_t>(i)] = static_cast<float>(index * 100 + i);
  return s;
}

TEST(Collate, StacksFieldsWithTheBatchDimensionFirst) {
  std::vector<Sample> samples;
  for (int i = 0; i < 3; ++i) samples.push_back(MakeSample(10 + i, 5));
  BatchWriter w = BatchWriter::ForHeap();
  ASSERT_TRUE(DefaultCollate(samples, w).ok());
  ASSERT_EQ(w.fields().size(), 2u);
  EXPECT_EQ(w.fields()[0].spec.name, "index");
  EXPECT_THAT(w.fields()[0].spec.shape, ElementsAre(3));
  EXPECT_THAT(w.fields()[1].spec.shape, ElementsAre(3, 5));
  EXPECT_EQ(w.fields()[1].offset % BatchWriter::kAlignment, 0u);
  const auto* idx = static_cast<const int64_t*>(w.FieldData(0));
  EXPECT_EQ(idx[0], 10);
  EXPECT_EQ(idx[2], 12);
  const auto* val = static_cast<const float*>(w.FieldData(1));
  EXPECT_EQ(val[1 * 5 + 4], 1104.0f);
}

TEST(Collate, MismatchedShapesNameTheSampleAndField) {
  std::vector<Sample> samples;
  samples.push_back(MakeSample(0, 5));
  samples.push_back(MakeSample(1, 6));
  BatchWriter w = BatchWriter::ForHeap();
  Status st = DefaultCollate(samples, w);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("sample 1"));
  EXPECT_THAT(st.message(), HasSubstr("value f32[6]"));
  EXPECT_THAT(st.message(), HasSubstr("custom Collate"));
}

TEST(BatchWriter, RegionOverflowReportsTheFullNeedAndKeepsUserCodeRunning) {
  std::vector<std::byte> region(256);
  BatchWriter w = BatchWriter::ForRegion(region.data(), region.size());
  auto a = w.AddField({"a", DType::kF32, {16}});  // 64 bytes: fits
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, region.data());
  auto b = w.AddField({"b", DType::kF64, {100}});  // 800 bytes at offset 64: does not
  ASSERT_TRUE(b.ok());
  std::fill_n(static_cast<double*>(*b), 100, 1.0);  // writable scratch, not the region
  EXPECT_TRUE(w.Overflowed());
  EXPECT_EQ(w.BytesUsed(), 64u + 800u);
  EXPECT_FALSE(w.AddField({"a", DType::kU8, {1}}).ok());  // duplicate name
  EXPECT_FALSE(w.AddField({"neg", DType::kU8, {-1}}).ok());
}

TEST(BatchWriter, HeapBatchCopiesIntoARegionOnlyIfItFits) {
  BatchWriter w = BatchWriter::ForHeap();
  auto p = w.AddField({"x", DType::kI32, {4}});
  ASSERT_TRUE(p.ok());
  int32_t vals[4] = {1, 2, 3, 4};
  std::memcpy(*p, vals, sizeof(vals));
  std::vector<std::byte> small(8), big(64);
  EXPECT_FALSE(w.CopyTo(small.data(), small.size()));
  ASSERT_TRUE(w.CopyTo(big.data(), big.size()));
  EXPECT_EQ(reinterpret_cast<int32_t*>(big.data())[3], 4);
}

TEST(Batch, ReleaseRunsHooksLastFirstThenReleasesOnceFromAnyThread) {
  std::vector<int> order;
  std::atomic<int> releases{0};
  BatchPtr b = MakeBatch(std::make_unique<Batch>(), [&] {
    order.push_back(0);
    ++releases;
  });
  b->AddReleaseHook([&] { order.push_back(1); });
  b->AddReleaseHook([&] { order.push_back(2); });
  BatchPtr copy = b;
  b.reset();
  EXPECT_EQ(releases.load(), 0);
  std::thread t([c = std::move(copy)]() mutable { c.reset(); });
  t.join();
  EXPECT_EQ(releases.load(), 1);
  EXPECT_THAT(order, ElementsAre(2, 1, 0));
}

TEST(Sampler, RanksPartitionAnEpochAndPadByWrappingAround) {
  SamplerOptions o;
  o.dataset_size = 10;
  o.world_size = 4;
  o.shuffle = true;
  o.seed = 3;
  const auto perm = EpochPermutation(10, true, 3, 0);
  std::vector<int64_t> all;
  for (int r = 0; r < 4; ++r) {
    o.rank = r;
    auto mine = RankIndices(o, 0);
    EXPECT_EQ(mine.size(), 3u);  // ceil(10 / 4)
    EXPECT_EQ(mine[0], perm[static_cast<size_t>(r)]);
    all.insert(all.end(), mine.begin(), mine.end());
  }
  // 12 positions: every index once, plus perm[0] and perm[1] again (the wrap-around).
  std::multiset<int64_t> counts(all.begin(), all.end());
  for (int64_t i = 0; i < 10; ++i) {
    const size_t expected = (i == perm[0] || i == perm[1]) ? 2 : 1;
    EXPECT_EQ(counts.count(i), expected) << "index " << i;
  }
}

TEST(Sampler, PermutationDependsOnSeedAndEpochOnly) {
  auto a = EpochPermutation(1000, true, 7, 2);
  EXPECT_EQ(a, EpochPermutation(1000, true, 7, 2));
  EXPECT_NE(a, EpochPermutation(1000, true, 7, 3));
  EXPECT_NE(a, EpochPermutation(1000, true, 8, 2));
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted, iota);
  EXPECT_EQ(EpochPermutation(5, false, 7, 2), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(Sampler, BatchesAndDropLast) {
  SamplerOptions o;
  o.dataset_size = 10;
  o.batch_size = 4;
  EXPECT_EQ(BatchesPerEpoch(o), 3);
  auto b = EpochBatches(o, 0);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_THAT(b[2], ElementsAre(8, 9));
  o.drop_last = true;
  EXPECT_EQ(BatchesPerEpoch(o), 2);
  EXPECT_EQ(EpochBatches(o, 0).size(), 2u);
}

TEST(Seeds, DifferPerRankWorkerAndEpoch) {
  std::set<uint64_t> seen;
  for (int r = 0; r < 4; ++r) {
    for (int w = 0; w < 8; ++w) {
      for (int e = 0; e < 4; ++e) seen.insert(DeriveSeed(1, r, w, e));
    }
  }
  EXPECT_EQ(seen.size(), 4u * 8 * 4);
  EXPECT_EQ(DeriveSeed(1, 2, 3, 4), DeriveSeed(1, 2, 3, 4));
  EXPECT_NE(DeriveSeed(1, 0, 0, 0), DeriveSeed(2, 0, 0, 0));
}

TEST(Registry, UnknownDatasetListsTheRegisteredOnes) {
  RegisterDataset("unit-registered", [](const std::string&) -> StatusOr<std::unique_ptr<Dataset>> {
    return InvalidArgument("bad arg");
  });
  EXPECT_FALSE(RegisterDataset("unit-registered", nullptr));
  auto missing = CreateDataset("nope", "");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("unit-registered"));
  auto bad = CreateDataset("unit-registered", "x");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("bad arg"));
}

TEST(Protocol, FramesSurvivePartialReadsAndCarryADescriptor) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  ASSERT_TRUE(SendMessage(sv[0], {MsgType::kTask, {{"id", 7}, {"indices", {1, 2, 3}}}}).ok());
  ASSERT_TRUE(SendMessage(sv[0], {MsgType::kRing, {{"slots", 2}}, pipefd[1]}).ok());
  // Larger than one read (64 KiB), smaller than the socket buffer, so sending cannot block.
  std::string big(100000, 'x');
  ASSERT_TRUE(SendMessage(sv[0], {MsgType::kError, {{"message", big}}}).ok());
  close(pipefd[1]);
  MessageReader reader(sv[1]);
  std::vector<Message> got;
  std::string error;
  while (got.size() < 3) {
    ASSERT_EQ(reader.ReadSome(true, &error), MessageReader::Result::kOk) << error;
    while (auto m = reader.Pop(&error)) got.push_back(std::move(*m));
    ASSERT_TRUE(error.empty()) << error;
  }
  EXPECT_EQ(got[0].type, MsgType::kTask);
  EXPECT_EQ(got[0].body["id"], 7);
  EXPECT_EQ(got[0].fd, -1);
  EXPECT_EQ(got[1].type, MsgType::kRing);
  ASSERT_GE(got[1].fd, 0);
  // The received descriptor is the pipe's write end: writing through it reaches the reader.
  ASSERT_EQ(write(got[1].fd, "k", 1), 1);
  close(got[1].fd);
  char c = 0;
  ASSERT_EQ(read(pipefd[0], &c, 1), 1);
  EXPECT_EQ(c, 'k');
  EXPECT_EQ(got[2].body["message"].get<std::string>().size(), big.size());
  close(sv[0]);
  EXPECT_EQ(reader.ReadSome(true, &error), MessageReader::Result::kEof);
  close(sv[1]);
  close(pipefd[0]);
}

TEST(ShmRing, ReservesMapsAndLeavesNoFileBehind) {
  testing::TempDir dir;
  auto ring = ShmRing::Create(dir.path(), 3, RoundUpToPages(10000));
  ASSERT_TRUE(ring.ok()) << ring.status().ToString();
  EXPECT_EQ((*ring)->slot_bytes() % PageSize(), 0u);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  std::memset((*ring)->Slot(2), 0x5a, (*ring)->slot_bytes());
  // A second mapping of the same descriptor (what a worker does) sees the bytes.
  auto other = ShmRing::Attach(dup((*ring)->fd()), 3, (*ring)->slot_bytes());
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_EQ(static_cast<unsigned char>((*other)->Slot(2)[17]), 0x5a);
  EXPECT_FALSE(ShmRing::Attach(dup((*ring)->fd()), 4, (*ring)->slot_bytes()).ok());
}

TEST(ShmRing, ReservesLaterSlotsOnlyWhenAskedAndOnce) {
  // /dev/shm is the tmpfs the loader uses: fallocate there really takes pages.
  std::string dir = "/dev/shm/spawnpoint-ring-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  const size_t slot = RoundUpToPages(1 << 20);
  auto ring = ShmRing::Create(dir, 4, slot, /*reserve_slots=*/1);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(ring.ok()) << ring.status().ToString();
  auto reserved = [&] {
    struct stat st {};
    EXPECT_EQ(fstat((*ring)->fd(), &st), 0);
    return static_cast<size_t>(st.st_blocks) * 512;
  };
  EXPECT_EQ(reserved(), slot);  // only slot 0 up front: the first batch is not delayed
  ASSERT_TRUE((*ring)->ReserveSlot(2).ok());
  EXPECT_EQ(reserved(), 2 * slot);
  ASSERT_TRUE((*ring)->ReserveSlot(2).ok());  // a slot already reserved costs nothing
  EXPECT_EQ(reserved(), 2 * slot);
  for (size_t i = 0; i < 4; ++i) ASSERT_TRUE((*ring)->ReserveSlot(i).ok());
  EXPECT_EQ(reserved(), 4 * slot);
}

TEST(ShmRing, TooLittleSpaceFailsNowWithTheFix) {
  testing::TempDir dir;
  auto ring = ShmRing::Create(dir.path(), 12, size_t{1} << 40);
  ASSERT_FALSE(ring.ok());
  EXPECT_EQ(ring.status().code(), StatusCode::kFailedPrecondition);
  const std::string& m = ring.status().message();
  EXPECT_THAT(m, HasSubstr(dir.path()));
  EXPECT_THAT(m, HasSubstr("12 slots x 1Ti"));
  EXPECT_THAT(m, HasSubstr("free"));
  EXPECT_THAT(m, HasSubstr("spec.shmSize"));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(SlotSizing, IsAQuarterMoreThanTheBatchInWholePages) {
  EXPECT_EQ(SlotBytesForBatch(1), PageSize());
  EXPECT_EQ(SlotBytesForBatch(100 * PageSize()), 125 * PageSize());
  EXPECT_EQ(SlotBytesForBatch(100 * PageSize() + 1), 126 * PageSize());
}

TEST(Contract, ExitRecordRoundTripsThroughAnAtomicFile) {
  testing::TempDir dir;
  WorkerExitRecord r;
  r.worker_id = 2;
  r.pid = 4321;
  r.incarnation = 5;
  r.status.signal = 7;
  r.cause = agent::ClassifyExit(r.status, std::nullopt, std::nullopt);
  r.stderr_tail = {"a", "b"};
  const std::string path = WorkerExitRecordPath(dir.path(), 2);
  ASSERT_TRUE(WriteFileAtomically(path, r.ToJson().dump()).ok());
  auto back = ReadExitRecord(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->pid, 4321);
  EXPECT_EQ(back->incarnation, 5);
  EXPECT_EQ(back->status.ShellCode(), 135);
  EXPECT_EQ(back->cause.reason, agent::ExitReason::kShmExhausted);
  EXPECT_THAT(back->stderr_tail, ElementsAre("a", "b"));
  EXPECT_THAT(back->Describe(), HasSubstr("SIGBUS"));
  auto j = nlohmann::json::parse(testing::ReadFile(path));
  EXPECT_EQ(j["signal"], "SIGBUS");
  EXPECT_EQ(j["reason"], "ShmExhausted");
  EXPECT_EQ(ReadExitRecord(dir.File("none.json")).status().code(), StatusCode::kNotFound);
}

TEST(Contract, CpuSpecs) {
  auto list = ParseCpuSpec("0-3,8");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->count, 5);
  EXPECT_THAT(list->ids, ElementsAre(0, 1, 2, 3, 8));
  auto count = ParseCpuSpec("6");
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(count->count, 6);
  EXPECT_TRUE(count->ids.empty());
  EXPECT_FALSE(ParseCpuSpec("3-1").ok());
  EXPECT_FALSE(ParseCpuSpec("x").ok());
  EXPECT_FALSE(ParseCpuSpec("0").ok());
  EXPECT_GE(AffinityCpuCount(), 1);
}

}  // namespace
}  // namespace spawnpoint::loader
