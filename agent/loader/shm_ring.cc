#include "agent/loader/shm_ring.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "agent/loader/types.h"

namespace spawnpoint::loader {
namespace {

std::string SpaceAdvice(const std::string& dir, size_t slots, size_t slot_bytes, uint64_t need,
                        uint64_t free_bytes) {
  return "the data loader's shared-memory ring needs " + FormatBytes(need) + " (" +
         std::to_string(slots) + " slots x " + FormatBytes(slot_bytes) + ") in " + dir +
         ", which has " + FormatBytes(free_bytes) +
         " free: raise spec.shmSize (the size of the pod's /dev/shm), or lower the batch size, "
         "prefetchFactor or the number of workers; the slot size comes from the first batch "
         "unless LoaderOptions::slot_bytes or SPAWNPOINT_LOADER_SLOT_BYTES sets it, and "
         "SPAWNPOINT_LOADER_SHM_DIR chooses another tmpfs";
}

}  // namespace

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

size_t RoundUpToPages(size_t bytes) {
  const size_t p = PageSize();
  return (std::max<size_t>(bytes, 1) + p - 1) / p * p;
}

size_t SlotBytesForBatch(size_t batch_bytes) {
  return RoundUpToPages(batch_bytes + (batch_bytes + 3) / 4);
}

namespace {

// posix_fallocate of [offset, offset + bytes) of a ring's file, with the advice on ENOSPC.
Status Reserve(int fd, const std::string& dir, size_t slots, size_t slot_bytes, uint64_t offset,
               uint64_t bytes) {
  if (bytes == 0) return Status::Ok();
  // posix_fallocate returns the error instead of setting errno.
  const int rc = posix_fallocate(fd, static_cast<off_t>(offset), static_cast<off_t>(bytes));
  if (rc == 0) return Status::Ok();
  struct statvfs vfs {};
  if (rc == ENOSPC && statvfs(dir.c_str(), &vfs) == 0) {
    return FailedPrecondition("shared memory: reserving the ring failed (ENOSPC): " +
                              SpaceAdvice(dir, slots, slot_bytes,
                                          static_cast<uint64_t>(slots) * slot_bytes,
                                          static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize));
  }
  return FailedPrecondition("shared memory: posix_fallocate(" + FormatBytes(bytes) + ") in " + dir +
                            ": " + strerror(rc));
}

}  // namespace

StatusOr<std::shared_ptr<ShmRing>> ShmRing::MapRing(int fd, const std::string& dir, size_t slots,
                                                    size_t slot_bytes) {
  const uint64_t need = static_cast<uint64_t>(slots) * slot_bytes;
  void* base = mmap(nullptr, need, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int e = errno;
    close(fd);
    return FailedPrecondition("shared memory: mmap of " + FormatBytes(need) + " from " + dir +
                              ": " + strerror(e));
  }
  auto ring = std::shared_ptr<ShmRing>(new ShmRing());
  ring->dir_ = dir;
  ring->fd_ = fd;
  ring->base_ = static_cast<std::byte*>(base);
  ring->slots_ = slots;
  ring->slot_bytes_ = slot_bytes;
  return ring;
}

StatusOr<std::shared_ptr<ShmRing>> ShmRing::Create(const std::string& dir, size_t slots,
                                                   size_t slot_bytes, size_t reserve_slots) {
  if (slots == 0 || slot_bytes == 0) return InvalidArgument("shared-memory ring: empty ring");
  uint64_t need = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(slots), static_cast<uint64_t>(slot_bytes),
                             &need)) {
    need = UINT64_MAX;
  }
  struct statvfs vfs {};
  if (statvfs(dir.c_str(), &vfs) != 0) {
    return FailedPrecondition("shared memory: cannot use " + dir + ": " + strerror(errno) +
                              " (SPAWNPOINT_LOADER_SHM_DIR chooses the directory)");
  }
  const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  if (need > free_bytes) {
    return FailedPrecondition("shared memory: " +
                              SpaceAdvice(dir, slots, slot_bytes, need, free_bytes));
  }

  std::random_device rd;
  std::string path;
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    path = dir + "/spawnpoint-ring-" + std::to_string(getpid()) + "-" + std::to_string(rd());
    fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    return FailedPrecondition("shared memory: cannot create a file in " + dir + ": " +
                              strerror(errno));
  }
  // The file gets the ring's full size at once (what Attach checks); its pages are reserved
  // for the leading slots now and for the others by ReserveSlot.
  reserve_slots = std::min(reserve_slots, slots);
  if (ftruncate(fd, static_cast<off_t>(need)) != 0) {
    const int e = errno;
    unlink(path.c_str());
    close(fd);
    return FailedPrecondition("shared memory: ftruncate(" + FormatBytes(need) + ") in " + dir +
                              ": " + strerror(e));
  }
  if (Status st =
          Reserve(fd, dir, slots, slot_bytes, 0, static_cast<uint64_t>(reserve_slots) * slot_bytes);
      !st.ok()) {
    unlink(path.c_str());
    close(fd);
    return st;
  }
  unlink(path.c_str());  // mapped below, or closed: the name is no longer needed
  return MapRing(fd, dir, slots, slot_bytes);
}

StatusOr<std::shared_ptr<ShmRing>> ShmRing::Adopt(int fd, const std::string& dir, size_t slots,
                                                  size_t slot_bytes, size_t used_bytes) {
  const uint64_t need = static_cast<uint64_t>(slots) * slot_bytes;
  struct statvfs vfs {};
  if (slots == 0 || slot_bytes < used_bytes || statvfs(dir.c_str(), &vfs) != 0) {
    close(fd);
    return FailedPrecondition("shared memory: cannot make a ring of " + std::to_string(slots) +
                              " x " + FormatBytes(slot_bytes) + " in " + dir);
  }
  const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  if (need - RoundUpToPages(used_bytes) > free_bytes) {
    close(fd);
    return FailedPrecondition("shared memory: " +
                              SpaceAdvice(dir, slots, slot_bytes, need, free_bytes));
  }
  if (ftruncate(fd, static_cast<off_t>(need)) != 0) {
    const int e = errno;
    close(fd);
    return FailedPrecondition("shared memory: ftruncate(" + FormatBytes(need) + ") in " + dir +
                              ": " + strerror(e));
  }
  if (Status st = Reserve(fd, dir, slots, slot_bytes, 0, slot_bytes); !st.ok()) {
    close(fd);
    return st;
  }
  return MapRing(fd, dir, slots, slot_bytes);
}

StatusOr<int> ShmRing::CreateUnlinkedFile(const std::string& dir, size_t bytes) {
  int fd = open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    return FailedPrecondition("shared memory: cannot create a file in " + dir + ": " +
                              strerror(errno));
  }
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int e = errno;
    close(fd);
    return FailedPrecondition("shared memory: ftruncate(" + FormatBytes(bytes) + ") in " + dir +
                              ": " + strerror(e));
  }
  return fd;
}

Status ShmRing::ReserveSlot(size_t i) const {
  if (i >= slots_) return InvalidArgument("shared-memory ring: no slot " + std::to_string(i));
  return Reserve(fd_, dir_, slots_, slot_bytes_, static_cast<uint64_t>(i) * slot_bytes_,
                 slot_bytes_);
}

StatusOr<std::shared_ptr<ShmRing>> ShmRing::Attach(int fd, size_t slots, size_t slot_bytes) {
  const size_t need = slots * slot_bytes;
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < need || need == 0) {
    close(fd);
    return InvalidArgument("shared-memory ring: the descriptor holds " +
                           std::to_string(static_cast<long long>(st.st_size)) +
                           " bytes, fewer than " + std::to_string(need));
  }
  void* base = mmap(nullptr, need, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int e = errno;
    close(fd);
    return Internal(std::string("shared-memory ring: mmap: ") + strerror(e));
  }
  auto ring = std::shared_ptr<ShmRing>(new ShmRing());
  ring->fd_ = fd;
  ring->base_ = static_cast<std::byte*>(base);
  ring->slots_ = slots;
  ring->slot_bytes_ = slot_bytes;
  return ring;
}

ShmRing::~ShmRing() {
  if (base_ != nullptr) munmap(base_, slots_ * slot_bytes_);
  if (fd_ >= 0) close(fd_);
}

}  // namespace spawnpoint::loader
