// The progress record: ProgressFile (the agent's reader), ProgressWriter (the rank's), and
// the process-wide writer behind spawnpoint::Step() and progress::CountStep().
#include "agent/progress/progress_file.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/progress/step.h"

namespace spawnpoint::progress {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kMs = 1'000'000;

class ProgressFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/spawnpoint-progress-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/rank-0.progress";
    ::unsetenv(kProgressFileEnv);
    ResetProcessWriterForTest();
  }
  void TearDown() override {
    ::unsetenv(kProgressFileEnv);
    ResetProcessWriterForTest();
    std::filesystem::remove_all(dir_);
  }

  // Overwrites `bytes` at `offset` of the file at path_.
  void Patch(size_t offset, const void* bytes, size_t n) {
    std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(n));
  }

  ProgressSnapshot MustRead(const ProgressFile& file) {
    StatusOr<ProgressSnapshot> s = file.Read();
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? *s : ProgressSnapshot{};
  }

  std::string dir_, path_;
};

TEST_F(ProgressFileTest, CreatedRecordReadsEmpty) {
  StatusOr<ProgressFile> file = ProgressFile::Create(path_);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(std::filesystem::file_size(path_), kProgressFileSize);
  ProgressSnapshot s = MustRead(*file);
  EXPECT_EQ(s.steps, 0u);
  EXPECT_EQ(s.last_step_ns, 0);
  EXPECT_EQ(s.first_step_ns, 0);
  EXPECT_EQ(s.attach_ns, 0);
  EXPECT_EQ(s.source, StepSource::kNone);
  EXPECT_EQ(s.writer_pid, 0);
  EXPECT_TRUE(s.recent_us.empty());

  // Another reader of the same file, and Create again truncates a used record.
  ASSERT_TRUE(ProgressWriter::Attach(path_, 42, 1 * kMs).ok());
  StatusOr<ProgressFile> again = ProgressFile::Create(path_);
  ASSERT_TRUE(again.ok());
  StatusOr<ProgressFile> reader = ProgressFile::Open(path_);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ(MustRead(*reader).writer_pid, 0);
}

TEST_F(ProgressFileTest, WriterPublishesStepsWithTheirDurations) {
  StatusOr<ProgressFile> file = ProgressFile::Create(path_);
  ASSERT_TRUE(file.ok());
  StatusOr<std::unique_ptr<ProgressWriter>> w = ProgressWriter::Attach(path_, 4321, 100 * kMs);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ProgressSnapshot s = MustRead(*file);
  EXPECT_EQ(s.writer_pid, 4321);
  EXPECT_EQ(s.attach_ns, 100 * kMs);
  EXPECT_EQ(s.steps, 0u);

  (*w)->Count(StepSource::kLoader, 150 * kMs);  // 50 ms since attach
  (*w)->Count(StepSource::kLoader, 160 * kMs);
  (*w)->Count(StepSource::kLoader, 190 * kMs);
  s = MustRead(*file);
  EXPECT_EQ(s.steps, 3u);
  EXPECT_EQ((*w)->steps(), 3u);
  EXPECT_EQ(s.first_step_ns, 150 * kMs);
  EXPECT_EQ(s.last_step_ns, 190 * kMs);
  EXPECT_EQ(s.source, StepSource::kLoader);
  EXPECT_THAT(s.recent_us, ElementsAre(50'000u, 10'000u, 30'000u));
}

// The waits ring: each step takes the waits added while it was in flight, capped at its
// duration; a step without waits records 0.
TEST_F(ProgressFileTest, EachStepRecordsItsWaitForPeersCappedAtItsDuration) {
  StatusOr<ProgressFile> file = ProgressFile::Create(path_);
  ASSERT_TRUE(file.ok());
  StatusOr<std::unique_ptr<ProgressWriter>> w = ProgressWriter::Attach(path_, 4321, 0);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  (*w)->AddWait(10 * kMs);
  (*w)->AddWait(5 * kMs);
  (*w)->Count(StepSource::kOptimizer, 40 * kMs);  // 40 ms, 15 of them waiting
  (*w)->Count(StepSource::kOptimizer, 60 * kMs);  // no wait
  (*w)->AddWait(50 * kMs);
  (*w)->Count(StepSource::kOptimizer, 80 * kMs);  // 20 ms: a wait cannot be longer
  (*w)->AddWait(-3 * kMs);                        // a clock that went back adds nothing
  (*w)->Count(StepSource::kOptimizer, 90 * kMs);
  ProgressSnapshot s = MustRead(*file);
  EXPECT_THAT(s.recent_us, ElementsAre(40'000u, 20'000u, 20'000u, 10'000u));
  EXPECT_THAT(s.recent_wait_us, ElementsAre(15'000u, 0u, 20'000u, 0u));
}

// spawnpoint::PeerWait adds its scope's time to this process's step in flight.
TEST_F(ProgressFileTest, PeerWaitAddsItsScopeToTheStepInFlight) {
  StatusOr<ProgressFile> file = ProgressFile::Create(path_);
  ASSERT_TRUE(file.ok());
  ASSERT_EQ(::setenv(kProgressFileEnv, path_.c_str(), 1), 0);
  int64_t inside = 0;
  {
    const int64_t before = MonotonicNs();
    spawnpoint::PeerWait waiting;
    const int64_t start = MonotonicNs();
    // While it waits the record says since when, for the agent's stall rule.
    const int64_t since = MustRead(*file).waiting_since_ns;
    EXPECT_GE(since, before);
    EXPECT_LE(since, start);
    while (MonotonicNs() - start < 2 * kMs) {
    }
    inside = MonotonicNs() - start;
  }
  EXPECT_EQ(MustRead(*file).waiting_since_ns, 0) << "the wait is over";
  Step();
  Step();
  ProgressSnapshot s = MustRead(*file);
  ASSERT_EQ(s.recent_wait_us.size(), 2u);
  EXPECT_GE(s.recent_wait_us[0], static_cast<uint32_t>(inside / 1000));
  EXPECT_LE(s.recent_wait_us[0], s.recent_us[0]);
  EXPECT_EQ(s.recent_wait_us[1], 0u);
}

TEST_F(ProgressFileTest, ExplicitStepsStopAutomaticCounting) {
  StatusOr<ProgressFile> file = ProgressFile::Create(path_);
  ASSERT_TRUE(file.ok());
  auto w = ProgressWriter::Attach(path_, 1, 0);
  ASSERT_TRUE(w.ok());
  (*w)->Count(StepSource::kOptimizer, 10 * kMs);
  (*w)->Count(StepSource::kOptimizer, 20 * kMs);
  (*w)->Count(StepSource::kExplicit, 25 * kMs);   // counts, from the previous step's end
  (*w)->Count(StepSource::kOptimizer, 30 * kMs);  // ignored from now on
  (*w)->Count(StepSource::kLoader, 31 * kMs);
  (*w)->Count(StepSource::kExplicit, 45 * kMs);
  ProgressSnapshot s = MustRead(*file);
  EXPECT_EQ(s.steps, 4u);
  EXPECT_EQ(s.source, StepSource::kExplicit);
  EXPECT_EQ(s.last_step_ns, 45 * kMs);
  EXPECT_THAT(s.recent_us, ElementsAre(10'000u, 10'000u, 5'000u, 20'000u));

  // A writer attaching to an explicit record (a restarted writer) stays explicit.
  auto w2 = ProgressWriter::Attach(path_, 2, 50 * kMs);
  ASSERT_TRUE(w2.ok());
  (*w2)->Count(StepSource::kLoader, 60 * kMs);
  EXPECT_EQ(MustRead(*file).steps, 4u);
  (*w2)->Count(StepSource::kExplicit, 60 * kMs);
  EXPECT_EQ(MustRead(*file).steps, 5u);
}

TEST_F(ProgressFileTest, RingKeepsTheLatest256Durations) {
  StatusOr<ProgressFile> file = ProgressFile::Create(path_);
  ASSERT_TRUE(file.ok());
  auto w = ProgressWriter::Attach(path_, 1, 0);
  ASSERT_TRUE(w.ok());
  int64_t now = 0;
  for (int n = 1; n <= 300; ++n) {  // step n takes n µs
    now += n * 1000;
    (*w)->Count(StepSource::kLoader, now);
  }
  ProgressSnapshot s = MustRead(*file);
  EXPECT_EQ(s.steps, 300u);
  ASSERT_EQ(s.recent_us.size(), kDurationRing);
  for (size_t i = 0; i < kDurationRing; ++i) EXPECT_EQ(s.recent_us[i], 300 - 255 + i) << i;
  EXPECT_EQ(s.first_step_ns, 1000);
  EXPECT_EQ(s.last_step_ns, now);
}

TEST_F(ProgressFileTest, DurationsAreCappedAndNeverNegative) {
  StatusOr<ProgressFile> file = ProgressFile::Create(path_);
  ASSERT_TRUE(file.ok());
  auto w = ProgressWriter::Attach(path_, 1, 10 * kMs);
  ASSERT_TRUE(w.ok());
  (*w)->Count(StepSource::kLoader, 5 * kMs);  // a clock before attach: 0, not negative
  (*w)->Count(StepSource::kLoader, 5 * kMs + 10'000'000 * kMs);  // ~2.8 h: capped
  EXPECT_THAT(MustRead(*file).recent_us, ElementsAre(0u, 0xFFFFFFFFu));
}

TEST_F(ProgressFileTest, BadRecordsAreClearErrorsNamingTheFile) {
  {  // missing
    StatusOr<ProgressFile> f = ProgressFile::Open(path_);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
    EXPECT_THAT(f.status().message(), HasSubstr(path_));
  }
  {  // short
    std::ofstream(path_) << "SPPROG1";
    StatusOr<ProgressFile> f = ProgressFile::Open(path_);
    ASSERT_FALSE(f.ok());
    EXPECT_THAT(f.status().message(), HasSubstr(path_));
    EXPECT_THAT(f.status().message(), HasSubstr("7 bytes, a record has 4096"));
    EXPECT_FALSE(ProgressWriter::Attach(path_, 1, 0).ok());
  }
  ASSERT_TRUE(ProgressFile::Create(path_).ok());
  {  // bad magic
    Patch(0, "XXPROG1", 8);
    StatusOr<ProgressFile> f = ProgressFile::Open(path_);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(f.status().message(), HasSubstr(path_ + ": not a progress record (bad magic"));
    auto w = ProgressWriter::Attach(path_, 1, 0);
    ASSERT_FALSE(w.ok());
    EXPECT_THAT(w.status().message(), HasSubstr("bad magic"));
  }
  ASSERT_TRUE(ProgressFile::Create(path_).ok());
  {  // another version
    const uint32_t version = 7;
    Patch(ProgressLayout::kVersion, &version, sizeof(version));
    StatusOr<ProgressFile> f = ProgressFile::Open(path_);
    ASSERT_FALSE(f.ok());
    EXPECT_THAT(f.status().message(), HasSubstr(path_ + ": version 7, this build reads version 3"));
  }
  {  // changed under an open reader: version, then truncated
    StatusOr<ProgressFile> f = ProgressFile::Create(path_);
    ASSERT_TRUE(f.ok());
    const uint32_t version = 1;  // a writer of the layout before the waits ring
    Patch(ProgressLayout::kVersion, &version, sizeof(version));
    StatusOr<ProgressSnapshot> s = f->Read();
    ASSERT_FALSE(s.ok());
    EXPECT_THAT(s.status().message(), HasSubstr("version 1"));
    ASSERT_EQ(::truncate(path_.c_str(), 100), 0);
    s = f->Read();
    ASSERT_FALSE(s.ok());
    EXPECT_THAT(s.status().message(), HasSubstr(path_ + ": truncated to 100 bytes"));
  }
}

TEST_F(ProgressFileTest, ReaderNeverSeesATornRecordWhileAThreadCounts) {
  StatusOr<ProgressFile> file = ProgressFile::Create(path_);
  ASSERT_TRUE(file.ok());
  auto w = ProgressWriter::Attach(path_, 1, 0);
  ASSERT_TRUE(w.ok());
  constexpr int kSteps = 20'000;
  std::thread writer([&] {
    int64_t now = 0;
    for (int n = 1; n <= kSteps; ++n) {  // step n takes n µs and ends at now
      now += int64_t{n} * 1000;
      (*w)->Count(StepSource::kLoader, now);
    }
  });
  uint64_t seen = 0;
  while (seen < kSteps) {
    ProgressSnapshot s = MustRead(*file);
    ASSERT_GE(s.steps, seen);  // never goes back
    seen = s.steps;
    ASSERT_LE(s.recent_us.size(), std::min<uint64_t>(seen, kDurationRing));
    // Every duration but the oldest (which the step in flight may overwrite) is its step's.
    for (size_t i = 1; i < s.recent_us.size(); ++i) {
      ASSERT_EQ(s.recent_us[i], seen - s.recent_us.size() + 1 + i) << "steps " << seen;
    }
    // last_step_ns is at least step `seen`'s end (sum of 1..seen µs).
    ASSERT_GE(s.last_step_ns, static_cast<int64_t>(seen * (seen + 1) / 2 * 1000));
  }
  writer.join();
}

TEST_F(ProgressFileTest, StepAttachesFromTheEnvironmentAndCounts) {
  StatusOr<ProgressFile> file = ProgressFile::Create(path_);
  ASSERT_TRUE(file.ok());
  ASSERT_EQ(::setenv(kProgressFileEnv, path_.c_str(), 1), 0);
  const int64_t before = MonotonicNs();
  CountStep(StepSource::kLoader);
  CountStep(StepSource::kLoader);
  const int64_t after = MonotonicNs();
  ProgressSnapshot s = MustRead(*file);
  EXPECT_EQ(s.steps, 2u);
  EXPECT_EQ(s.source, StepSource::kLoader);
  EXPECT_EQ(s.writer_pid, ::getpid());
  // Attached lazily, but measured from the process's start (before this test began).
  EXPECT_GT(s.attach_ns, 0);
  EXPECT_LE(s.attach_ns, before);
  EXPECT_GE(s.first_step_ns, before);
  EXPECT_LE(s.last_step_ns, after);
  ASSERT_EQ(s.recent_us.size(), 2u);
  EXPECT_GE(s.recent_us[0], static_cast<uint32_t>((s.first_step_ns - s.attach_ns) / 1000 - 1));

  Step();  // explicit from now on
  CountStep(StepSource::kLoader);
  Step();
  s = MustRead(*file);
  EXPECT_EQ(s.steps, 4u);
  EXPECT_EQ(s.source, StepSource::kExplicit);
}

TEST_F(ProgressFileTest, WithoutTheEnvironmentStepIsANoOp) {
  StatusOr<ProgressFile> file = ProgressFile::Create(path_);
  ASSERT_TRUE(file.ok());
  Step();
  CountStep(StepSource::kLoader);
  // Setting the variable later changes nothing: the process decided on its first step.
  ASSERT_EQ(::setenv(kProgressFileEnv, path_.c_str(), 1), 0);
  Step();
  EXPECT_EQ(MustRead(*file).steps, 0u);
  EXPECT_EQ(MustRead(*file).writer_pid, 0);
}

TEST_F(ProgressFileTest, ARecordOfAnotherLiveProcessIsNotWritten) {
  // A child of the rank inherits the variable; the rank (here: our parent, alive) attached.
  StatusOr<ProgressFile> file = ProgressFile::Create(path_);
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE(ProgressWriter::Attach(path_, ::getppid(), 1).ok());
  ASSERT_EQ(::setenv(kProgressFileEnv, path_.c_str(), 1), 0);
  Step();
  CountStep(StepSource::kLoader);
  ProgressSnapshot s = MustRead(*file);
  EXPECT_EQ(s.steps, 0u);
  EXPECT_EQ(s.writer_pid, ::getppid());
}

TEST_F(ProgressFileTest, AnUnusableRecordIsReportedAndStepsGoUncounted) {
  std::ofstream(path_) << "not a record";
  ASSERT_EQ(::setenv(kProgressFileEnv, path_.c_str(), 1), 0);
  ::testing::internal::CaptureStderr();
  Step();
  Step();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, HasSubstr("[spawnpoint] progress record " + path_));
  EXPECT_THAT(err, HasSubstr("steps are not reported"));
  EXPECT_EQ(err.find("[spawnpoint]", 1), std::string::npos) << "reported once: " << err;
}

}  // namespace
}  // namespace spawnpoint::progress
