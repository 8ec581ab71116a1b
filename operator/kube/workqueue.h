// A controller work queue with client-go's semantics. Keys ("namespace/name") are the
// unit of work:
//  - a key is never handed to two workers at once: Add while it is being processed marks
//    it dirty, and Done puts it back in the queue;
//  - repeated Adds while a key waits collapse into one;
//  - AddAfter delays on the injected Clock; AddRateLimited delays by the key's own
//    exponential backoff (5 ms doubling to 1000 s) until Forget;
//  - after ShutDown, Adds are ignored and Get drains what is queued, then returns nullopt;
//    ShutDownWithDrain also waits until every handed-out key is Done.
// Thread-safe: any number of producers and workers.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "common/clock.h"

namespace spawnpoint::kube {

// Decides how long a failed key waits. Thread-safe.
class ItemRateLimiter {
 public:
  virtual ~ItemRateLimiter() = default;
  // The delay for this failure of `item` (and counts the failure).
  virtual Clock::Duration When(const std::string& item) = 0;
  // Clears the failure history of `item`.
  virtual void Forget(const std::string& item) = 0;
  virtual int NumRequeues(const std::string& item) = 0;
};

// base × 2^failures, capped at max (client-go's ItemExponentialFailureRateLimiter).
class ItemExponentialRateLimiter : public ItemRateLimiter {
 public:
  explicit ItemExponentialRateLimiter(Clock::Duration base = std::chrono::milliseconds(5),
                                      Clock::Duration max = std::chrono::seconds(1000));
  Clock::Duration When(const std::string& item) override;
  void Forget(const std::string& item) override;
  int NumRequeues(const std::string& item) override;

 private:
  const Clock::Duration base_;
  const Clock::Duration max_;
  std::mutex mu_;
  std::unordered_map<std::string, int> failures_;
};

// Observability hooks; counters are also available from WorkQueue::Stats(). Called with
// the queue's lock held: keep them cheap and never call back into the queue.
class WorkQueueMetrics {
 public:
  virtual ~WorkQueueMetrics() = default;
  virtual void OnAdd(const std::string& item) {}
  virtual void OnDepth(size_t depth) {}
  virtual void OnRetry(const std::string& item) {}
  // Time a key waited in the queue before a worker took it.
  virtual void OnQueueLatency(Clock::Duration waited) {}
  // Time between Get and Done.
  virtual void OnWorkDuration(Clock::Duration worked) {}
};

struct WorkQueueStats {
  size_t depth = 0;       // keys waiting for a worker
  size_t processing = 0;  // keys handed out and not Done
  size_t delayed = 0;     // keys waiting for AddAfter/AddRateLimited
  int64_t adds = 0;       // Adds that queued a key (collapsed ones excluded)
  int64_t retries = 0;    // AddRateLimited calls
};

struct WorkQueueOptions {
  std::string name;
  std::shared_ptr<ItemRateLimiter> rate_limiter;  // default ItemExponentialRateLimiter()
  std::shared_ptr<WorkQueueMetrics> metrics;
};

class WorkQueue {
 public:
  explicit WorkQueue(Clock* clock, WorkQueueOptions options = {});
  ~WorkQueue();  // ShutDown() and join the delay thread

  void Add(const std::string& item);
  // delay <= 0 is Add. A key already waiting keeps the earlier of the two times.
  void AddAfter(const std::string& item, Clock::Duration delay);
  void AddRateLimited(const std::string& item);
  void Forget(const std::string& item);
  int NumRequeues(const std::string& item);

  // Blocks until a key is available. nullopt means shut down with nothing left: exit.
  std::optional<std::string> Get();
  // Must be called once for every key Get returned.
  void Done(const std::string& item);

  size_t Len() const;
  void ShutDown();
  void ShutDownWithDrain();
  bool ShuttingDown() const;
  WorkQueueStats Stats() const;
  const std::string& name() const { return options_.name; }

 private:
  struct Waiting {
    Clock::TimePoint ready;
    uint64_t seq;
    std::string item;
    bool operator>(const Waiting& o) const {
      return ready != o.ready ? ready > o.ready : seq > o.seq;
    }
  };

  void AddLocked(const std::string& item);
  void DelayLoop();

  Clock* const clock_;
  const WorkQueueOptions options_;
  std::shared_ptr<ItemRateLimiter> limiter_;

  mutable std::mutex mu_;
  std::condition_variable cv_;        // workers waiting in Get, drainers
  std::condition_variable delay_cv_;  // the delay thread
  std::deque<std::string> queue_;
  std::unordered_map<std::string, Clock::TimePoint> dirty_;  // queued or re-queue on Done
  std::unordered_map<std::string, Clock::TimePoint> processing_;
  std::priority_queue<Waiting, std::vector<Waiting>, std::greater<Waiting>> waiting_;
  std::unordered_map<std::string, Clock::TimePoint> waiting_ready_;
  uint64_t seq_ = 0;
  bool shutting_down_ = false;
  bool draining_ = false;
  int64_t adds_ = 0;
  int64_t retries_ = 0;
  std::thread delay_thread_;
};

}  // namespace spawnpoint::kube
