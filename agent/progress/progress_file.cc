#include "agent/progress/progress_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "agent/progress/step.h"

namespace spawnpoint::progress {
namespace {

using L = ProgressLayout;

template <typename T>
std::atomic_ref<T> Field(void* data, size_t offset) {
  return std::atomic_ref<T>(*reinterpret_cast<T*>(static_cast<char*>(data) + offset));
}
template <typename T>
T Load(const void* data, size_t offset, std::memory_order order = std::memory_order_relaxed) {
  return Field<T>(const_cast<void*>(data), offset).load(order);
}

std::string Errno(const std::string& what, const std::string& path) {
  return "progress record " + path + ": " + what + ": " + std::strerror(errno);
}

// The record's header is ours: magic and version (the size is checked by the caller).
Status CheckHeader(const void* data, const std::string& path) {
  if (std::memcmp(data, kProgressMagic, sizeof(kProgressMagic)) != 0) {
    return FailedPrecondition("progress record " + path +
                              ": not a progress record (bad magic; expected \"SPPROG1\")");
  }
  const uint32_t version = Load<uint32_t>(data, L::kVersion);
  if (version != kProgressVersion) {
    return FailedPrecondition("progress record " + path + ": version " + std::to_string(version) +
                              ", this build reads version " + std::to_string(kProgressVersion));
  }
  return Status::Ok();
}

// Opens `path` with `flags` and maps its kProgressFileSize bytes; the fd stays open.
StatusOr<std::pair<int, void*>> MapRecord(const std::string& path, int flags, int prot) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC, 0600);
  if (fd < 0)
    return Status(errno == ENOENT ? StatusCode::kNotFound : StatusCode::kInternal,
                  Errno("cannot open", path));
  if (flags & O_CREAT) {
    if (::ftruncate(fd, kProgressFileSize) != 0) {
      Status st = Internal(Errno("cannot size", path));
      ::close(fd);
      return st;
    }
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    Status s = Internal(Errno("cannot stat", path));
    ::close(fd);
    return s;
  }
  if (static_cast<size_t>(st.st_size) < kProgressFileSize) {
    ::close(fd);
    return FailedPrecondition("progress record " + path + ": " + std::to_string(st.st_size) +
                              " bytes, a record has " + std::to_string(kProgressFileSize) +
                              " (truncated, or not a progress record)");
  }
  void* data = ::mmap(nullptr, kProgressFileSize, prot, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    Status s = Internal(Errno("cannot map", path));
    ::close(fd);
    return s;
  }
  return std::make_pair(fd, data);
}

}  // namespace

int64_t MonotonicNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// ---- ProgressFile ----

ProgressFile::ProgressFile(std::string path, int fd, void* data)
    : path_(std::move(path)), fd_(fd), data_(data) {}

ProgressFile::ProgressFile(ProgressFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(other.fd_), data_(other.data_) {
  other.fd_ = -1;
  other.data_ = nullptr;
}

ProgressFile& ProgressFile::operator=(ProgressFile&& other) noexcept {
  std::swap(path_, other.path_);  // `other` unmaps what this held
  std::swap(fd_, other.fd_);
  std::swap(data_, other.data_);
  return *this;
}

ProgressFile::~ProgressFile() {
  if (data_ != nullptr) ::munmap(data_, kProgressFileSize);
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<ProgressFile> ProgressFile::Create(const std::string& path) {
  SP_ASSIGN_OR_RETURN(auto mapped,
                      MapRecord(path, O_RDWR | O_CREAT | O_TRUNC, PROT_READ | PROT_WRITE));
  ProgressFile file(path, mapped.first, mapped.second);
  std::memcpy(file.data_, kProgressMagic, sizeof(kProgressMagic));
  Field<uint32_t>(file.data_, L::kVersion).store(kProgressVersion, std::memory_order_release);
  return file;
}

StatusOr<ProgressFile> ProgressFile::Open(const std::string& path) {
  SP_ASSIGN_OR_RETURN(auto mapped, MapRecord(path, O_RDONLY, PROT_READ));
  ProgressFile file(path, mapped.first, mapped.second);
  SP_RETURN_IF_ERROR(CheckHeader(file.data_, path));
  return file;
}

Status ProgressFile::Check() const {
  // A mapping past the file's end faults (SIGBUS): look at its size before each read.
  struct stat st {};
  if (::fstat(fd_, &st) != 0) return Internal(Errno("cannot stat", path_));
  if (static_cast<size_t>(st.st_size) < kProgressFileSize) {
    return FailedPrecondition("progress record " + path_ + ": truncated to " +
                              std::to_string(st.st_size) + " bytes (a record has " +
                              std::to_string(kProgressFileSize) + ")");
  }
  return CheckHeader(data_, path_);
}

StatusOr<ProgressSnapshot> ProgressFile::Read() const {
  SP_RETURN_IF_ERROR(Check());
  ProgressSnapshot s;
  uint64_t later = 0;  // steps, loaded again after the copy
  for (int attempt = 0; attempt < 4; ++attempt) {
    s.steps = Load<uint64_t>(data_, L::kSteps, std::memory_order_acquire);
    s.last_step_ns = static_cast<int64_t>(Load<uint64_t>(data_, L::kLastStepNs));
    s.first_step_ns = static_cast<int64_t>(Load<uint64_t>(data_, L::kFirstStepNs));
    s.attach_ns = static_cast<int64_t>(Load<uint64_t>(data_, L::kAttachNs));
    s.source = static_cast<StepSource>(Load<uint32_t>(data_, L::kSource));
    s.writer_pid = static_cast<pid_t>(Load<uint32_t>(data_, L::kWriterPid));
    s.waiting_since_ns = static_cast<int64_t>(Load<uint64_t>(data_, L::kWaitingSinceNs));
    const uint64_t n = std::min<uint64_t>(s.steps, kDurationRing);
    s.recent_us.resize(n);
    s.recent_wait_us.resize(n);
    for (uint64_t i = 0; i < n; ++i) {  // steps s.steps - n + 1 .. s.steps, oldest first
      const uint64_t slot = 4 * ((s.steps - n + i) % kDurationRing);
      s.recent_us[i] = Load<uint32_t>(data_, L::kDurations + slot);
      s.recent_wait_us[i] = Load<uint32_t>(data_, L::kWaits + slot);
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    later = Load<uint64_t>(data_, L::kSteps);
    if (later == s.steps) return s;  // at most the step in flight touched the oldest entry
  }
  // The writer kept racing ahead: drop the durations its later steps may have overwritten
  // (step m's slot is step m - 256's; steps up to later + 1 may have written).
  if (later + 2 > kDurationRing) {
    const uint64_t first_valid = later + 2 - kDurationRing;
    const uint64_t first_kept = s.steps - s.recent_us.size() + 1;
    if (first_valid > first_kept) {
      const auto drop = std::min<uint64_t>(first_valid - first_kept, s.recent_us.size());
      s.recent_us.erase(s.recent_us.begin(), s.recent_us.begin() + static_cast<long>(drop));
      s.recent_wait_us.erase(s.recent_wait_us.begin(),
                             s.recent_wait_us.begin() + static_cast<long>(drop));
    }
  }
  return s;
}

// ---- ProgressWriter ----

ProgressWriter::ProgressWriter(void* data, int64_t attach_ns)
    : data_(data), last_end_ns_(attach_ns) {}

ProgressWriter::~ProgressWriter() { ::munmap(data_, kProgressFileSize); }

StatusOr<std::unique_ptr<ProgressWriter>> ProgressWriter::Attach(const std::string& path, pid_t pid,
                                                                 int64_t attach_ns) {
  SP_ASSIGN_OR_RETURN(auto mapped, MapRecord(path, O_RDWR, PROT_READ | PROT_WRITE));
  ::close(mapped.first);  // the mapping stays
  void* data = mapped.second;
  if (Status st = CheckHeader(data, path); !st.ok()) {
    ::munmap(data, kProgressFileSize);
    return st;
  }
  std::unique_ptr<ProgressWriter> w(new ProgressWriter(data, attach_ns));
  // A record counted before (by a writer now gone) goes on from its count.
  w->steps_ = Load<uint64_t>(data, L::kSteps, std::memory_order_acquire);
  w->explicit_ = Load<uint32_t>(data, L::kSource) == static_cast<uint32_t>(StepSource::kExplicit);
  Field<uint32_t>(data, L::kWriterPid).store(static_cast<uint32_t>(pid), std::memory_order_relaxed);
  Field<uint64_t>(data, L::kAttachNs)
      .store(static_cast<uint64_t>(attach_ns), std::memory_order_release);
  return w;
}

void ProgressWriter::Count(StepSource source, int64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  if (explicit_ && source != StepSource::kExplicit) return;
  if (source == StepSource::kExplicit) explicit_ = true;
  const uint64_t n = steps_ + 1;
  const int64_t us = std::max<int64_t>(0, (now_ns - last_end_ns_) / 1000);
  const auto duration =
      static_cast<uint32_t>(std::min<int64_t>(us, std::numeric_limits<uint32_t>::max()));
  const int64_t wait_us = std::min<int64_t>(wait_ns_ / 1000, duration);
  Field<uint32_t>(data_, L::kDurations + 4 * ((n - 1) % kDurationRing))
      .store(duration, std::memory_order_relaxed);
  Field<uint32_t>(data_, L::kWaits + 4 * ((n - 1) % kDurationRing))
      .store(static_cast<uint32_t>(wait_us), std::memory_order_relaxed);
  Field<uint64_t>(data_, L::kLastStepNs)
      .store(static_cast<uint64_t>(now_ns), std::memory_order_relaxed);
  if (n == 1) {
    Field<uint64_t>(data_, L::kFirstStepNs)
        .store(static_cast<uint64_t>(now_ns), std::memory_order_relaxed);
  }
  Field<uint32_t>(data_, L::kSource)
      .store(static_cast<uint32_t>(source), std::memory_order_relaxed);
  Field<uint64_t>(data_, L::kSteps).store(n, std::memory_order_release);
  steps_ = n;
  last_end_ns_ = now_ns;
  wait_ns_ = 0;
}

void ProgressWriter::AddWait(int64_t ns) {
  std::lock_guard<std::mutex> lock(mu_);
  wait_ns_ += std::max<int64_t>(0, ns);
}

void ProgressWriter::SetWaitingSince(int64_t since_ns) {
  Field<uint64_t>(data_, L::kWaitingSinceNs)
      .store(static_cast<uint64_t>(std::max<int64_t>(0, since_ns)), std::memory_order_relaxed);
}

uint64_t ProgressWriter::steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return steps_;
}

// ---- The process-wide writer ----
namespace {

enum : int { kUnknown = 0, kAttached = 1, kNone = 2 };

struct ProcessWriter {
  std::atomic<int> state{kUnknown};
  std::mutex mu;  // guards attaching and writer
  std::unique_ptr<ProgressWriter> writer;
  pid_t pid = 0;  // the process that attached (a forked child does not write)
};

ProcessWriter& Process() {
  static auto* p = new ProcessWriter();  // never destroyed: steps may come during exit
  return *p;
}

// This process's start as CLOCK_MONOTONIC ns (from /proc/self/stat's starttime, ticks since
// boot, i.e. CLOCK_BOOTTIME), or `fallback` if it cannot be read.
int64_t ProcessStartNs(int64_t fallback) {
  std::ifstream in("/proc/self/stat");
  std::string line;
  if (!std::getline(in, line)) return fallback;
  const size_t paren = line.rfind(')');  // the command may hold spaces and parentheses
  if (paren == std::string::npos) return fallback;
  std::istringstream fields(line.substr(paren + 1));
  std::string field;
  for (int i = 3; i <= 22 && (fields >> field); ++i) {
  }
  const long ticks = ::sysconf(_SC_CLK_TCK);
  char* end = nullptr;
  const unsigned long long start = std::strtoull(field.c_str(), &end, 10);
  if (ticks <= 0 || end == field.c_str()) return fallback;
  timespec boot{}, mono{};
  if (::clock_gettime(CLOCK_BOOTTIME, &boot) != 0 || ::clock_gettime(CLOCK_MONOTONIC, &mono) != 0) {
    return fallback;
  }
  const int64_t suspended =
      (boot.tv_sec - mono.tv_sec) * 1'000'000'000LL + (boot.tv_nsec - mono.tv_nsec);
  const int64_t start_ns = static_cast<int64_t>(start / ticks) * 1'000'000'000LL +
                           static_cast<int64_t>(start % ticks) * 1'000'000'000LL / ticks -
                           suspended;
  return start_ns > 0 && start_ns <= fallback ? start_ns : fallback;
}

bool Alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

// REQUIRES: p.mu held. Attaches to the environment's record, if any and not another live
// process's (a child of the rank inherits the variable but must not write).
void AttachLocked(ProcessWriter& p) {
  const char* path = std::getenv(kProgressFileEnv);
  if (path == nullptr || *path == '\0') {
    p.state.store(kNone, std::memory_order_release);
    return;
  }
  const pid_t self = ::getpid();
  auto fail = [&](const Status& st) {
    std::fprintf(stderr, "[spawnpoint] %s; this process's steps are not reported\n",
                 st.message().c_str());
    p.state.store(kNone, std::memory_order_release);
  };
  StatusOr<ProgressFile> file = ProgressFile::Open(path);
  if (!file.ok()) return fail(file.status());
  StatusOr<ProgressSnapshot> now = file->Read();
  if (!now.ok()) return fail(now.status());
  if (now->writer_pid != 0 && now->writer_pid != self && Alive(now->writer_pid)) {
    p.state.store(kNone, std::memory_order_release);  // the rank's record, not ours
    return;
  }
  const int64_t t = MonotonicNs();
  StatusOr<std::unique_ptr<ProgressWriter>> w =
      ProgressWriter::Attach(path, self, ProcessStartNs(t));
  if (!w.ok()) return fail(w.status());
  p.writer = std::move(w).value();
  p.pid = self;
  p.state.store(kAttached, std::memory_order_release);
}

}  // namespace

// This process's writer, attaching on the first call; null without one (or in a forked
// child of the process that attached).
ProgressWriter* ProcessWriterOrNull() {
  ProcessWriter& p = Process();
  int state = p.state.load(std::memory_order_acquire);
  if (state == kNone) return nullptr;
  if (state == kUnknown) {
    std::lock_guard<std::mutex> lock(p.mu);
    if (p.state.load(std::memory_order_relaxed) == kUnknown) AttachLocked(p);
    state = p.state.load(std::memory_order_relaxed);
    if (state != kAttached) return nullptr;
  }
  if (::getpid() != p.pid) return nullptr;  // a forked child
  return p.writer.get();
}

void CountStep(StepSource source) {
  if (ProgressWriter* w = ProcessWriterOrNull()) w->Count(source, MonotonicNs());
}

void AddCollectiveWait(int64_t ns) {
  if (ProgressWriter* w = ProcessWriterOrNull()) w->AddWait(ns);
}

void SetCollectiveWaitingSince(int64_t since_ns) {
  if (ProgressWriter* w = ProcessWriterOrNull()) w->SetWaitingSince(since_ns);
}

void ResetProcessWriterForTest() {
  ProcessWriter& p = Process();
  std::lock_guard<std::mutex> lock(p.mu);
  p.writer.reset();
  p.pid = 0;
  p.state.store(kUnknown, std::memory_order_release);
}

}  // namespace spawnpoint::progress

namespace spawnpoint {

void Step() { progress::CountStep(progress::StepSource::kExplicit); }

PeerWait::PeerWait() : start_ns_(progress::MonotonicNs()) {
  progress::SetCollectiveWaitingSince(start_ns_);
}
PeerWait::~PeerWait() {
  progress::SetCollectiveWaitingSince(0);
  progress::AddCollectiveWait(progress::MonotonicNs() - start_ns_);
}

}  // namespace spawnpoint
