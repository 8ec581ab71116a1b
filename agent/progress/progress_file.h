// One rank's progress record (progress_record.h) as a file: ProgressFile is the agent's
// side (create, then read snapshots), ProgressWriter the rank's (count steps into it).
// ProgressFile: Create/Open from one thread; Read() from any thread (it only loads).
// ProgressWriter: thread-safe. No torch and no other dependency than common/.
//
// A rank does not use ProgressWriter directly: spawnpoint::Step() (step.h) and
// progress::CountStep() write through one process-wide writer that attaches on first use
// to the record named by SPAWNPOINT_PROGRESS_FILE (unset: both are no-ops).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "agent/progress/progress_record.h"
#include "common/status.h"

namespace spawnpoint::progress {

// The environment variable naming a rank's record (set by the agent).
inline constexpr char kProgressFileEnv[] = "SPAWNPOINT_PROGRESS_FILE";

// What a record says at one moment. Times are CLOCK_MONOTONIC ns (0: not yet).
struct ProgressSnapshot {
  uint64_t steps = 0;
  int64_t last_step_ns = 0, first_step_ns = 0, attach_ns = 0;
  StepSource source = StepSource::kNone;
  pid_t writer_pid = 0;
  std::vector<uint32_t> recent_us;       // the latest min(steps, 256) durations, oldest first
                                         // (fewer only under a racing writer: ProgressFile::Read)
  std::vector<uint32_t> recent_wait_us;  // the same steps' waits for peers (same length)
  int64_t waiting_since_ns = 0;          // waiting for peers in a collective since; 0: not
};

// A mapped record. Movable, not copyable; unmaps on destruction.
class ProgressFile {
 public:
  // Creates `path` (or truncates it), sized kProgressFileSize, zeroed, with magic and
  // version: a fresh record for a rank to attach to. Mode 0600.
  static StatusOr<ProgressFile> Create(const std::string& path);
  // Maps an existing record read-only; fails if it is short or not a record (a clear error
  // naming the file).
  static StatusOr<ProgressFile> Open(const std::string& path);

  ProgressFile(ProgressFile&& other) noexcept;
  ProgressFile& operator=(ProgressFile&& other) noexcept;
  ProgressFile(const ProgressFile&) = delete;
  ProgressFile& operator=(const ProgressFile&) = delete;
  ~ProgressFile();

  // The record as of one step count: steps is loaded first (acquire), then the rest, and
  // all again if a step landed meanwhile. The oldest duration may be the step in flight's;
  // if the writer keeps racing ahead (a few tries), the durations it may have overwritten
  // are left out (recent_us is then shorter than min(steps, 256)).
  // Errors (naming the file): it was truncated, or its magic or version is not ours.
  StatusOr<ProgressSnapshot> Read() const;
  const std::string& path() const { return path_; }

 private:
  ProgressFile(std::string path, int fd, void* data);
  Status Check() const;

  std::string path_;
  int fd_ = -1;
  void* data_ = nullptr;  // kProgressFileSize bytes, shared
};

// The rank's side of one record: maps it writable and counts steps. Thread-safe: Count()
// from any thread (one mutex; a step is milliseconds long, the count microseconds).
class ProgressWriter {
 public:
  // Maps the record at `path` (made by ProgressFile::Create) and stamps `pid` and
  // `attach_ns` (CLOCK_MONOTONIC ns; the first step's duration is measured from it).
  static StatusOr<std::unique_ptr<ProgressWriter>> Attach(const std::string& path, pid_t pid,
                                                          int64_t attach_ns);
  ~ProgressWriter();
  ProgressWriter(const ProgressWriter&) = delete;
  ProgressWriter& operator=(const ProgressWriter&) = delete;

  // Counts one step of `source` that ended at `now_ns`: its duration into the ring, then
  // last_step_ns, then steps (release). Once an explicit step was counted, steps of other
  // sources are ignored (the explicit step itself counts, from the previous step's end).
  void Count(StepSource source, int64_t now_ns);
  // Adds `ns` to the time the step in flight waited for peers in collectives; the next
  // counted step takes it (capped at its duration) into the waits ring.
  void AddWait(int64_t ns);
  // The rank has waited for its peers in a collective since `since_ns` (0: it does not
  // wait now). One store; any thread.
  void SetWaitingSince(int64_t since_ns);
  uint64_t steps() const;

 private:
  ProgressWriter(void* data, int64_t attach_ns);

  void* const data_;  // constant after Attach
  mutable std::mutex mu_;
  uint64_t steps_ = 0;     // guarded by mu_
  int64_t last_end_ns_;    // guarded by mu_: the previous step's end (or attach)
  bool explicit_ = false;  // guarded by mu_: an explicit step was counted
  int64_t wait_ns_ = 0;    // guarded by mu_: the step in flight's wait so far
};

// CLOCK_MONOTONIC now, in ns.
int64_t MonotonicNs();

// Counts one step of `source` in this process's record (SPAWNPOINT_PROGRESS_FILE), if any:
// attaches on the first call (its attach time is this process's start, from /proc), then
// counts. Without the variable, or in a forked child of the process that attached, a no-op
// costing an atomic load. A record that cannot be attached is reported once on stderr and
// steps go uncounted. Thread-safe.
void CountStep(StepSource source);

// Adds `ns` waited for peers in a collective to this process's step in flight (same record
// and rules as CountStep). Thread-safe.
void AddCollectiveWait(int64_t ns);
// Marks this process as waiting for its peers since `since_ns` (0: no more), in the same
// record. Thread-safe.
void SetCollectiveWaitingSince(int64_t since_ns);

// Tests only: forgets the process-wide writer, so the next CountStep attaches (or not)
// again from the environment. Not thread-safe against concurrent CountStep calls.
void ResetProcessWriterForTest();

}  // namespace spawnpoint::progress
