// One shared-memory ring per rank: `slots` equal slots, each holding one batch. The rank's
// Loader creates it as a file in a tmpfs directory (default /dev/shm), checks the free
// space first and reserves every page with posix_fallocate, so a /dev/shm too small for
// the ring fails now with a message naming the directory, the free space, the need and
// the fix, instead of a worker dying of SIGBUS later. The file is unlinked as soon as it
// is mapped (nothing is left behind whatever happens to the process); workers receive its
// descriptor over the socket and map it too.
//
// Thread-safety: immutable after construction; Slot() may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace spawnpoint::loader {

size_t PageSize();
size_t RoundUpToPages(size_t bytes);
// ceil(1.25 x bytes) rounded up to whole pages: room for batches somewhat larger than the
// probed one.
size_t SlotBytesForBatch(size_t batch_bytes);

class ShmRing {
 public:
  // Errors: kFailedPrecondition with the fix when the directory lacks the space.
  static StatusOr<std::shared_ptr<ShmRing>> Create(const std::string& dir, size_t slots,
                                                   size_t slot_bytes);
  // Maps a ring received from its creator; takes ownership of `fd`.
  static StatusOr<std::shared_ptr<ShmRing>> Attach(int fd, size_t slots, size_t slot_bytes);
  ~ShmRing();
  ShmRing(const ShmRing&) = delete;
  ShmRing& operator=(const ShmRing&) = delete;

  int fd() const { return fd_; }  // stays open: (re)connecting workers get a copy
  size_t slots() const { return slots_; }
  size_t slot_bytes() const { return slot_bytes_; }
  std::byte* Slot(size_t i) const { return base_ + i * slot_bytes_; }

 private:
  ShmRing() = default;
  int fd_ = -1;
  std::byte* base_ = nullptr;
  size_t slots_ = 0;
  size_t slot_bytes_ = 0;
};

}  // namespace spawnpoint::loader
