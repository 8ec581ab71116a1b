// A split trainer (agent/loader/split_trainer.h), run as a user runs it: its workers are the
// executable alone (the module is never mapped in them), its rank runs the module, with
// workers and with none; a missing module is said and exits 127.
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/support/test_process.h"

namespace spawnpoint {
namespace {

using std::chrono::seconds;

const std::string kModuleName = std::filesystem::path(SPLIT_MODULE).filename().string();

TEST(SplitTrainer, WorkersServeWithoutTheModuleAndTheRankRunsIt) {
  testing::TestProcess p({SPLIT_BIN, "--maps-of", kModuleName, "--dataset", "index", "--arg",
                          "size=30,dim=2", "--batch", "5", "--workers", "2", "--epochs", "2"});
  ASSERT_EQ(p.Wait(seconds(30)), 0) << p.Stderr();
  EXPECT_EQ(testing::CountLines(p.Stdout(), " ok=1"), 12) << p.Stdout();
  EXPECT_EQ(testing::CountLines(p.Stdout(), "maps rank=1 worker=0,0"), 1) << p.Stdout();
}

TEST(SplitTrainer, ZeroWorkersFindTheDatasetsInTheModule) {
  testing::TestProcess p({SPLIT_BIN, "--dataset", "index", "--arg", "size=12,dim=2", "--batch", "4",
                          "--workers", "0"});
  ASSERT_EQ(p.Wait(seconds(30)), 0) << p.Stderr();
  EXPECT_EQ(testing::CountLines(p.Stdout(), " ok=1"), 3) << p.Stdout();
}

TEST(SplitTrainer, AMissingModuleIsSaidWithExitCode127) {
  testing::TempDir dir;
  const std::string copy = dir.File("trainer");
  std::filesystem::copy_file(SPLIT_BIN, copy);
  std::filesystem::permissions(copy, std::filesystem::perms::owner_all);
  testing::TestProcess p({copy, "--workers", "0"});
  ASSERT_EQ(p.Wait(seconds(30)), 127) << p.Stderr();
  EXPECT_THAT(p.Stderr(), ::testing::HasSubstr("cannot load the trainer's torch half"));
  EXPECT_THAT(p.Stderr(), ::testing::HasSubstr(dir.File(kModuleName)));
}

}  // namespace
}  // namespace spawnpoint
