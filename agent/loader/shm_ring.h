// One shared-memory ring per rank: `slots` equal slots, each holding one batch. The rank's
// Loader creates it as a file in a tmpfs directory (default /dev/shm), checks the free
// space for the whole ring first and reserves the pages with posix_fallocate, so a /dev/shm
// too small for the ring fails now with a message naming the directory, the free space, the
// need and the fix, instead of a worker dying of SIGBUS later. Reserving zeroes every page
// (tens of ms for a few hundred MiB), so Create may reserve only the leading slots and leave
// the others to ReserveSlot, called before a slot is first handed out (the Loader does that
// on a background thread while the first batches are built): no slot is written before it
// is reserved. The file is unlinked as soon as it
// is mapped (nothing is left behind whatever happens to the process); workers receive its
// descriptor over the socket and map it too.
//
// Thread-safety: immutable after construction; Slot() and ReserveSlot() may be called from
// any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
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
  // Reserves the first `reserve_slots` slots (all by default). Errors: kFailedPrecondition
  // with the fix when the directory lacks the space for the whole ring.
  static StatusOr<std::shared_ptr<ShmRing>> Create(
      const std::string& dir, size_t slots, size_t slot_bytes,
      size_t reserve_slots = std::numeric_limits<size_t>::max());
  // Makes the ring out of the file a worker built the first batch in, at offset 0 (an
  // in-place probe, protocol.h): sizes it to the ring, checks the free space for the rest,
  // reserves slot 0 (the pages the batch already holds are kept) and maps it. Takes
  // ownership of `fd`. Errors as Create's.
  static StatusOr<std::shared_ptr<ShmRing>> Adopt(int fd, const std::string& dir, size_t slots,
                                                  size_t slot_bytes, size_t used_bytes);
  // A new unlinked file of `bytes` (no pages reserved) in tmpfs directory `dir`, where a
  // worker builds the first batch before the ring exists; the caller owns the descriptor.
  static StatusOr<int> CreateUnlinkedFile(const std::string& dir, size_t bytes);
  // Maps a ring received from its creator; takes ownership of `fd`.
  static StatusOr<std::shared_ptr<ShmRing>> Attach(int fd, size_t slots, size_t slot_bytes);
  ~ShmRing();
  ShmRing(const ShmRing&) = delete;
  ShmRing& operator=(const ShmRing&) = delete;

  int fd() const { return fd_; }  // stays open: (re)connecting workers get a copy
  size_t slots() const { return slots_; }
  size_t slot_bytes() const { return slot_bytes_; }
  std::byte* Slot(size_t i) const { return base_ + i * slot_bytes_; }
  // Reserves slot i's pages (a no-op for a slot already reserved). Errors as Create's, when
  // the space went elsewhere since Create checked it.
  Status ReserveSlot(size_t i) const;

 private:
  // Maps `fd` (sized slots x slot_bytes) shared and makes the ring own it; closes it on
  // failure.
  static StatusOr<std::shared_ptr<ShmRing>> MapRing(int fd, const std::string& dir, size_t slots,
                                                    size_t slot_bytes);
  ShmRing() = default;
  std::string dir_;
  int fd_ = -1;
  std::byte* base_ = nullptr;
  size_t slots_ = 0;
  size_t slot_bytes_ = 0;
};

}  // namespace spawnpoint::loader
