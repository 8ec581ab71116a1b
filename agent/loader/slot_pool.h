// The free slots of a rank's shared-memory ring, and an eventfd that wakes the loader's I/O
// thread when one comes back. Thread-safe: a batch handed to the trainer holds a shared_ptr
// to the pool, so a slot may be released from any thread, also after the loader is gone.
#pragma once

#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>

namespace spawnpoint::loader {

class SlotPool {
 public:
  // Slots 0 .. slots-1 start free. Check wake_fd() >= 0 (eventfd can fail).
  explicit SlotPool(size_t slots);
  ~SlotPool();
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;

  // Forgets every slot and makes 0 .. slots-1 free.
  void Resize(size_t slots);
  // The slot free longest, if any.
  std::optional<int> Acquire();
  // Returns `slot` and wakes the I/O thread.
  void Release(int slot);
  size_t FreeCount() const;
  // Makes wake_fd() readable.
  void Wake() const;
  int wake_fd() const { return wake_fd_; }

 private:
  // Constant after construction.
  int wake_fd_ = -1;

  mutable std::mutex mu_;
  std::deque<int> free_;  // Guarded by mu_.
};

}  // namespace spawnpoint::loader
