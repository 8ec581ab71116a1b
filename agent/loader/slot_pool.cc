#include "agent/loader/slot_pool.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>

namespace spawnpoint::loader {

SlotPool::SlotPool(size_t slots) : wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  Resize(slots);
}

SlotPool::~SlotPool() {
  if (wake_fd_ >= 0) close(wake_fd_);
}

void SlotPool::Resize(size_t slots) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.clear();
  for (size_t i = 0; i < slots; ++i) free_.push_back(static_cast<int>(i));
}

std::optional<int> SlotPool::Acquire() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) return std::nullopt;
  int s = free_.front();
  free_.pop_front();
  return s;
}

void SlotPool::Release(int slot) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(slot);
  }
  Wake();
}

size_t SlotPool::FreeCount() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_.size();
}

void SlotPool::Wake() const {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
}

}  // namespace spawnpoint::loader
