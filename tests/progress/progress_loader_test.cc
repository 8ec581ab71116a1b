// The loader's Next() counts the rank's steps in its progress record (in-process and pool
// loaders), and spawnpoint::Step() stops that count. RunWorkerIfRequested before GoogleTest:
// the standalone pool re-executes this program as its workers (which inherit the variable
// but never write: they do not call Next()).
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "agent/loader/loader.h"
#include "agent/progress/progress_file.h"
#include "agent/progress/step.h"

namespace spawnpoint::progress {
namespace {

class Ints : public loader::Dataset {
 public:
  int64_t Size() const override { return 8; }
  StatusOr<loader::Sample> Get(int64_t index, loader::WorkerContext&) override {
    loader::Sample s;
    s.AddScalar<int64_t>("index", index);
    return s;
  }
};
SPAWNPOINT_REGISTER_DATASET("progress-ints",
                            [](const std::string&) { return std::make_unique<Ints>(); });

class LoaderStepsTest : public ::testing::TestWithParam<int> {  // the loader's workers
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/spawnpoint-progress-loader-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ResetProcessWriterForTest();
  }
  void TearDown() override {
    ::unsetenv(kProgressFileEnv);
    ResetProcessWriterForTest();
    std::filesystem::remove_all(dir_);
  }
  std::string dir_;
};

// Runs one epoch of 4 batches; returns how many it took.
int Epoch(loader::Loader& l, int64_t epoch) {
  EXPECT_TRUE(l.StartEpoch(epoch).ok());
  int batches = 0;
  while (true) {
    auto b = l.Next();
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (!b.ok() || *b == nullptr) return batches;
    ++batches;
  }
}

TEST_P(LoaderStepsTest, NextCountsEachBatchUntilStepIsCalled) {
  const std::string path = dir_ + "/rank-0.progress";
  StatusOr<ProgressFile> file = ProgressFile::Create(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  ASSERT_EQ(::setenv(kProgressFileEnv, path.c_str(), 1), 0);
  loader::LoaderOptions o;
  o.dataset = "progress-ints";
  o.workers = GetParam();
  o.batch_size = 2;
  o.rank = 0;
  o.world_size = 1;
  auto l = loader::Loader::Create(o);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(Epoch(**l, 0), 4);
  StatusOr<ProgressSnapshot> s = file->Read();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->steps, 4u);
  EXPECT_EQ(s->source, StepSource::kLoader);
  EXPECT_EQ(s->writer_pid, ::getpid());
  EXPECT_EQ(s->recent_us.size(), 4u);

  spawnpoint::Step();  // explicit from now on: the next epoch's batches are not counted
  ASSERT_EQ(Epoch(**l, 1), 4);
  s = file->Read();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->steps, 5u);
  EXPECT_EQ(s->source, StepSource::kExplicit);
}

INSTANTIATE_TEST_SUITE_P(Workers, LoaderStepsTest, ::testing::Values(0, 1));

}  // namespace
}  // namespace spawnpoint::progress

int main(int argc, char** argv) {
  if (int rc = spawnpoint::loader::RunWorkerIfRequested(argc, argv); rc >= 0) return rc;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
