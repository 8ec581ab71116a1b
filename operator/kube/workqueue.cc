#include "operator/kube/workqueue.h"

#include <cmath>

#include "operator/kube/timing.h"

namespace spawnpoint::kube {

ItemExponentialRateLimiter::ItemExponentialRateLimiter(Clock::Duration base, Clock::Duration max)
    : base_(base), max_(max) {}

Clock::Duration ItemExponentialRateLimiter::When(const std::string& item) {
  int n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    n = failures_[item]++;
  }
  // In double: 2^n overflows any integer long before the cap stops mattering.
  double d = static_cast<double>(base_.count()) * std::pow(2.0, n);
  if (d >= static_cast<double>(max_.count())) return max_;
  return Clock::Duration(static_cast<Clock::Duration::rep>(d));
}

void ItemExponentialRateLimiter::Forget(const std::string& item) {
  std::lock_guard<std::mutex> lock(mu_);
  failures_.erase(item);
}

int ItemExponentialRateLimiter::NumRequeues(const std::string& item) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = failures_.find(item);
  return it == failures_.end() ? 0 : it->second;
}

WorkQueue::WorkQueue(Clock* clock, WorkQueueOptions options)
    : clock_(clock), options_(std::move(options)), limiter_(options_.rate_limiter) {
  if (!limiter_) limiter_ = std::make_shared<ItemExponentialRateLimiter>();
  delay_thread_ = std::thread([this] { DelayLoop(); });
}

WorkQueue::~WorkQueue() {
  ShutDown();
  if (delay_thread_.joinable()) delay_thread_.join();
}

void WorkQueue::AddLocked(const std::string& item) {
  if (shutting_down_) return;
  if (dirty_.count(item)) return;  // already waiting for a worker (or for Done)
  dirty_.emplace(item, clock_->Now());
  ++adds_;
  if (options_.metrics) options_.metrics->OnAdd(item);
  if (processing_.count(item)) return;  // Done will queue it again
  queue_.push_back(item);
  if (options_.metrics) options_.metrics->OnDepth(queue_.size());
  cv_.notify_one();
}

void WorkQueue::Add(const std::string& item) {
  std::lock_guard<std::mutex> lock(mu_);
  AddLocked(item);
}

void WorkQueue::AddAfter(const std::string& item, Clock::Duration delay) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return;
  if (delay <= Clock::Duration::zero()) {
    AddLocked(item);
    return;
  }
  auto ready = clock_->Now() + delay;
  auto it = waiting_ready_.find(item);
  if (it != waiting_ready_.end() && it->second <= ready) return;
  waiting_ready_[item] = ready;
  // The heap may still hold an older entry for the item; it is skipped when it surfaces
  // because it no longer matches waiting_ready_.
  waiting_.push({ready, seq_++, item});
  delay_cv_.notify_one();
}

void WorkQueue::AddRateLimited(const std::string& item) {
  Clock::Duration d = limiter_->When(item);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return;
    ++retries_;
    if (options_.metrics) options_.metrics->OnRetry(item);
  }
  AddAfter(item, d);
}

void WorkQueue::Forget(const std::string& item) { limiter_->Forget(item); }

int WorkQueue::NumRequeues(const std::string& item) { return limiter_->NumRequeues(item); }

std::optional<std::string> WorkQueue::Get() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !queue_.empty() || shutting_down_; });
  if (queue_.empty()) return std::nullopt;
  std::string item = std::move(queue_.front());
  queue_.pop_front();
  auto now = clock_->Now();
  auto d = dirty_.find(item);
  if (d != dirty_.end()) {
    if (options_.metrics) options_.metrics->OnQueueLatency(now - d->second);
    dirty_.erase(d);
  }
  processing_[item] = now;
  if (options_.metrics) options_.metrics->OnDepth(queue_.size());
  return item;
}

void WorkQueue::Done(const std::string& item) {
  std::lock_guard<std::mutex> lock(mu_);
  auto p = processing_.find(item);
  if (p == processing_.end()) return;
  if (options_.metrics) options_.metrics->OnWorkDuration(clock_->Now() - p->second);
  processing_.erase(p);
  if (dirty_.count(item)) {
    queue_.push_back(item);
    if (options_.metrics) options_.metrics->OnDepth(queue_.size());
    cv_.notify_one();
  }
  if (draining_ && processing_.empty() && queue_.empty()) cv_.notify_all();
}

size_t WorkQueue::Len() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

void WorkQueue::ShutDown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutting_down_ = true;
  cv_.notify_all();
  delay_cv_.notify_all();
}

void WorkQueue::ShutDownWithDrain() {
  std::unique_lock<std::mutex> lock(mu_);
  shutting_down_ = true;
  draining_ = true;
  cv_.notify_all();
  delay_cv_.notify_all();
  cv_.wait(lock, [&] { return processing_.empty() && queue_.empty(); });
}

bool WorkQueue::ShuttingDown() const {
  std::lock_guard<std::mutex> lock(mu_);
  return shutting_down_;
}

WorkQueueStats WorkQueue::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  WorkQueueStats s;
  s.depth = queue_.size();
  s.processing = processing_.size();
  s.delayed = waiting_ready_.size();
  s.adds = adds_;
  s.retries = retries_;
  return s;
}

void WorkQueue::DelayLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!shutting_down_) {
    auto now = clock_->Now();
    while (!waiting_.empty() && waiting_.top().ready <= now) {
      Waiting w = waiting_.top();
      waiting_.pop();
      auto it = waiting_ready_.find(w.item);
      if (it == waiting_ready_.end() || it->second != w.ready) continue;  // superseded
      waiting_ready_.erase(it);
      AddLocked(w.item);
    }
    auto next = waiting_.empty() ? Clock::TimePoint::max() : waiting_.top().ready;
    uint64_t seq = seq_;
    WaitUntil(clock_, delay_cv_, lock, next, [&] { return shutting_down_ || seq_ != seq; });
  }
}

}  // namespace spawnpoint::kube
