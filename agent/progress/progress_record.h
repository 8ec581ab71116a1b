// The progress record: how a rank tells its agent about its training steps without
// touching its stdout. The agent creates one file per rank (4096 bytes, zeroed, magic and
// version set) and names it in the rank's SPAWNPOINT_PROGRESS_FILE; the rank maps it
// shared and writes, the agent maps it and reads. One writer per record (the rank; its
// writes from several threads are serialised by the writer library), any number of
// readers. The layout is fixed, little-endian, and shared by the C++ writer
// (agent/progress/step.h), the Python writer (agent/python/spawnpoint_rank/_progress.py)
// and the agent's reader (ProgressReader); a change of layout bumps kProgressVersion.
//
// A step's end is published in this order: the duration and the wait into their rings,
// last_step_ns, then steps (a release store). A reader loads steps first (acquire), then the rest,
// and takes a record whose steps changed under it as of the earlier count: the figures are never
// torn by more than the step in flight.
#pragma once

#include <cstddef>
#include <cstdint>

namespace spawnpoint::progress {

inline constexpr char kProgressMagic[8] = {'S', 'P', 'P', 'R', 'O', 'G', '1', '\0'};
inline constexpr uint32_t kProgressVersion = 3;  // 2: the waits ring; 3: waiting since
inline constexpr size_t kProgressFileSize = 4096;
inline constexpr size_t kDurationRing = 256;  // the latest steps' durations kept

// Where each step comes from. The first explicit step (spawnpoint::Step(),
// spawnpoint.step()) makes the record explicit: automatic counts stop from then on, so a
// trainer that calls step() and uses an optimizer is not counted twice.
enum class StepSource : uint32_t {
  kNone = 0,
  kOptimizer = 1,  // Python: torch.optim.Optimizer.step (the shim's post-import hook)
  kLoader = 2,     // C++: spawnpoint::loader's Next() handing out a batch
  kExplicit = 3,   // spawnpoint::Step() / spawnpoint.step()
};

// Byte offsets in the file.
struct ProgressLayout {
  static constexpr size_t kMagic = 0;            // char[8]
  static constexpr size_t kVersion = 8;          // u32
  static constexpr size_t kWriterPid = 12;       // u32: the rank's pid, set when it attaches
  static constexpr size_t kSteps = 16;           // u64: steps completed
  static constexpr size_t kLastStepNs = 24;      // u64: CLOCK_MONOTONIC ns at the latest step's end
  static constexpr size_t kFirstStepNs = 32;     // u64: CLOCK_MONOTONIC ns at the first step's end
  static constexpr size_t kSource = 40;          // u32: StepSource of the counted steps
  static constexpr size_t kAttachNs = 48;        // u64: CLOCK_MONOTONIC ns when the rank attached
  static constexpr size_t kWaitingSinceNs = 56;  // u64: CLOCK_MONOTONIC ns since when the rank
                                                 // has been waiting for its peers in a
                                                 // collective; 0 while it is not
  static constexpr size_t kDurations = 64;       // u32[kDurationRing]: microseconds, step n at
                                                 // index (n - 1) % kDurationRing
  static constexpr size_t kWaits =
      kDurations + 4 * kDurationRing;  // u32[kDurationRing]:
                                       // microseconds of step n spent waiting for
                                       // peers in collectives, at the same index
  static constexpr size_t kEnd = kWaits + 4 * kDurationRing;
};
static_assert(ProgressLayout::kEnd <= kProgressFileSize);

// A step's duration is the time since the previous step's end (for the first step, since
// the rank attached), capped at UINT32_MAX microseconds. Its wait is the part of it the rank
// spent blocked on its peers in collectives (DDP's gradient allreduce, a barrier), as the
// rank measured it (never more than the duration; 0 where nothing measures it). The
// duration minus the wait is the rank's own work for the step: in synchronous training
// every rank's durations are alike, so that difference is what tells a straggler.
//
// waiting_since is live, not per step: the writer sets it when the rank starts to wait for
// its peers (a blocking collective is entered; DDP's backward has computed a gradient, so
// the rank waits for the allreduce unless it computes another) and clears it when the wait
// ends. A rank that makes no step while a peer has long been waiting for it is the one the
// others wait on (agent/run/stall_watch.h).

}  // namespace spawnpoint::progress
