// PoolClient, the caller's side: start and stop, batches submitted, dropped and taken, the
// ring and its slots, and the task bookkeeping the I/O thread issues from. The workers' side
// (connections, messages, deaths, hangs, the I/O loop) is in pool_client_workers.cc.
#include "agent/loader/pool_client.h"

#include <errno.h>
#include <sys/un.h>

#include <algorithm>
#include <cstring>

#include "agent/loader/contract.h"
#include "agent/loader/worker_failures.h"

namespace spawnpoint::loader {

PoolClient::PoolClient(PoolClientOptions options)
    : opts_(std::move(options)),
      slots_count_(static_cast<size_t>(opts_.workers * opts_.prefetch_factor + 4)),
      slots_(std::make_shared<SlotPool>(0)),
      active_workers_(opts_.initial_active) {}

PoolClient::~PoolClient() {
  Stop();
  for (Conn& c : conns_) {
    if (c.fd >= 0) close(c.fd);
  }
}

void PoolClient::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
  }
  slots_->Wake();
  if (io_.joinable()) io_.join();
  stop_reserving_ = true;
  if (reserver_.joinable()) reserver_.join();
}

Status PoolClient::Start() {
  if (slots_->wake_fd() < 0) return Internal(std::string("eventfd: ") + strerror(errno));
  if (opts_.slot_bytes) {
    SP_RETURN_IF_ERROR(CreateRing(*opts_.slot_bytes));
    phase_ = Phase::kRunning;
  }
  for (int w = 0; w < opts_.workers; ++w) {
    Conn c;
    c.id = w;
    c.path = WorkerSocketPath(opts_.dir, w);
    if (c.path.size() >= sizeof(sockaddr_un::sun_path)) {
      return InvalidArgument("loader: the socket path " + c.path + " is longer than " +
                             std::to_string(sizeof(sockaddr_un::sun_path) - 1) +
                             " bytes; use a shorter pool directory (or TMPDIR)");
    }
    // An exit record from before this Loader (a previous rank incarnation) is old news.
    auto old = ReadExitRecord(WorkerExitRecordPath(opts_.dir, w));
    if (old.ok()) c.last_record_incarnation = old->incarnation;
    conns_.push_back(std::move(c));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    times_.start = opts_.clock->Now();
    for (Conn& c : conns_) {
      c.SetDownSince(opts_.clock->Now());
      Connect(c, c.down_since);
      // The CPU wait of a worker already running counts from now, not from the first look.
      if (opts_.timeout.count() > 0) LookAtSilentWorker(c, c.down_since);
    }
  }
  io_ = std::thread([this] { IoLoop(); });

  const auto setup = ServiceTimeout();
  std::unique_lock<std::mutex> lock(mu_);
  auto ready = [&] {
    if (!error_.ok()) return true;
    if (phase_ != Phase::kRunning) return false;
    if (!opts_.start_waits_for_all_workers) return conns_.front().said_hello;
    return std::all_of(conns_.begin(), conns_.end(), [](const Conn& c) { return c.said_hello; });
  };
  // Until `deadline` on the injected clock, or ready(): the I/O thread notifies cv_ after each
  // of its rounds, and the wait's slices bound how late a deadline no round marks is seen.
  auto wait_until = [&](Clock::TimePoint deadline) {
    while (!ready() && opts_.clock->Now() < deadline) {
      cv_.wait_for(lock, std::chrono::milliseconds(50));
    }
    return ready();
  };
  bool settled = wait_until(opts_.clock->Now() + setup);
  // A worker that connected and never said Hello is killed as hung at the timeout (here, or
  // by the I/O thread's CheckHung, whichever looks first): its successor gets the whole time
  // again. Each connection's kills are bounded by max_attempts. One spared because it waited
  // for a CPU is waited for until its next look (the hang clock's ceiling ends that).
  for (int seen = 0; !settled && error_.ok();) {
    const Clock::TimePoint now = opts_.clock->Now();
    std::optional<Clock::TimePoint> starved;  // the earliest next look at a spared worker
    for (Conn& c : conns_) {
      if (c.state == ConnState::kAwaitHello && !c.hung_killed &&
          now - c.down_since >= opts_.timeout && KillSilentWorker(c, now)) {
        const Clock::TimePoint look = c.hang_clock.NextLook(opts_.timeout);
        if (!starved || look < *starved) starved = look;
      }
    }
    if (hello_kills_ == seen && !starved) break;
    seen = hello_kills_;
    settled = wait_until(starved ? std::min(*starved, now + setup) : now + setup);
  }
  if (!error_.ok()) return error_;
  if (!settled) {
    std::string missing;
    for (const Conn& c : conns_) {
      if (c.said_hello) continue;
      missing += (missing.empty() ? "" : ", ") + c.path;
      if (!c.connect_error.empty()) missing += " (" + c.connect_error + ")";
      missing += LastExitNote(c);
    }
    return Status(StatusCode::kDeadlineExceeded,
                  "loader: no answer within " + std::to_string(setup.count() / 1000) +
                      " s from the workers at " +
                      (missing.empty() ? std::string("(probing the first batch)") : missing));
  }
  return Status::Ok();
}

int64_t PoolClient::dataset_size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dataset_size_;
}

std::vector<pid_t> PoolClient::WorkerPids() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<pid_t> pids;
  for (const Conn& c : conns_) pids.push_back(c.pid);
  return pids;
}

void PoolClient::Submit(int64_t epoch, int64_t first_batch,
                        std::vector<std::vector<int64_t>> batches) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& indices : batches) submitted_.push_back({epoch, first_batch++, std::move(indices)});
  }
  slots_->Wake();
}

void PoolClient::DropAllBut(std::optional<int64_t> keep) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<int64_t> drop;
    for (auto& [id, t] : tasks_) {
      if (t.epoch != keep) drop.push_back(id);
    }
    for (int64_t id : drop) CancelTask(id);
    std::erase_if(submitted_, [&](const Submitted& s) { return s.epoch != keep; });
    if (probed_ && keep != 0) {  // the probed batch is epoch 0's
      probed_.reset();
      slots_->Release(0);
    }
    std::erase_if(ready_, [&](const auto& e) { return e.first != keep; });
  }
  slots_->Wake();
}

void PoolClient::Rewind(int64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Conn& c : conns_) {
    // A worker not serving this client now is dead or a new process: it keeps nothing of
    // `epoch`. A failed send is the worker going away, which the I/O thread handles.
    if (c.fd < 0 || c.state != ConnState::kReady) continue;
    (void)SendMessage(c.fd, {MsgType::kRewind, {{"epoch", epoch}}});
  }
}

StatusOr<std::optional<ReadyBatch>> PoolClient::Take(int64_t epoch, std::optional<int64_t> batch,
                                                     Clock::Duration wait) {
  std::unique_lock<std::mutex> lock(mu_);
  std::map<int64_t, int64_t>* ready = nullptr;  // of the epoch
  std::map<int64_t, int64_t>::iterator it;
  cv_.wait_for(lock, wait, [&] {
    ready = nullptr;
    if (!error_.ok()) return true;
    auto eit = ready_.find(epoch);
    if (eit == ready_.end()) return false;
    ready = &eit->second;
    it = batch ? ready->find(*batch) : ready->begin();
    return it != ready->end();
  });
  if (!error_.ok()) return error_;
  if (ready == nullptr || it == ready->end()) return std::optional<ReadyBatch>();
  Task& t = tasks_.at(it->second);
  if (t.error) {
    Status st = *t.error;
    if (error_.ok()) error_detail_ = t.error_body;
    FailLocked(st);
    return st;
  }
  ready->erase(it);
  const int64_t id = t.id;
  ReadyBatch r{t.epoch,          t.batch,       std::move(t.indices),
               t.slot,           t.done_worker, std::move(t.fields),
               std::move(t.tree)};
  tasks_.erase(id);
  lock.unlock();
  slots_->Wake();  // the budget moved: more tasks may be issued
  return std::optional<ReadyBatch>(std::move(r));
}

bool PoolClient::SlotsExhausted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return phase_ == Phase::kRunning && InFlightLocked() == 0 && reissue_.empty() &&
         slots_->FreeCount() == 0 && !reserving_;
}

void PoolClient::SetActiveWorkers(int n) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (n == active_workers_) return;
    active_workers_ = n;
  }
  slots_->Wake();
}

void PoolClient::Fail(Status st) {
  std::lock_guard<std::mutex> lock(mu_);
  FailLocked(std::move(st));
}

Status PoolClient::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

nlohmann::json PoolClient::error_detail() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_detail_;
}

PoolClientStats PoolClient::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  PoolClientStats s;
  for (const auto& [e, ready] : ready_) s.queue_depth += static_cast<int>(ready.size());
  s.in_flight = InFlightLocked();
  s.active_workers = active_workers_;
  s.pool_workers = opts_.workers;
  s.restarts_died = restarts_[static_cast<int>(RestartKind::kDied)];
  s.restarts_hung = restarts_[static_cast<int>(RestartKind::kHung)];
  s.restarts_oom = restarts_[static_cast<int>(RestartKind::kOom)];
  s.restarts_shm = restarts_[static_cast<int>(RestartKind::kShm)];
  s.hung_kills = hung_kills_;
  s.slots = ring_ ? ring_->slots() : 0;
  s.slot_bytes = ring_ ? ring_->slot_bytes() : 0;
  return s;
}

PoolStartTimes PoolClient::start_times() const {
  std::lock_guard<std::mutex> lock(mu_);
  return times_;
}

std::shared_ptr<ShmRing> PoolClient::ring() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ring_;
}

// --- the ring ------------------------------------------------------------------------------

Status PoolClient::CreateRing(size_t slot_bytes) {
  const std::string dir = opts_.shm_dir;
  auto ring = ShmRing::Create(dir, slots_count_, slot_bytes, /*reserve_slots=*/1);
  if (!ring.ok()) return ring.status().WithPrefix(RingErrorPrefix());
  ring_ = std::move(ring).value();
  slots_->Resize(1);
  StartReserver();
  times_.ring_ready = opts_.clock->Now();
  return Status::Ok();
}

Status PoolClient::AdoptRing(int fd, size_t bytes) {
  auto ring = ShmRing::Adopt(fd, opts_.shm_dir, slots_count_, SlotBytesForBatch(bytes), bytes);
  if (!ring.ok()) return ring.status().WithPrefix(RingErrorPrefix());
  ring_ = std::move(ring).value();
  slots_->Resize(1);
  (void)slots_->Acquire();  // slot 0: the probed batch's
  StartReserver();
  times_.ring_ready = opts_.clock->Now();
  return Status::Ok();
}

void PoolClient::StartReserver() {
  if (slots_count_ > 1) {
    reserving_ = true;
    reserver_ = std::thread([this, ring = ring_] { ReserveRest(ring); });
  }
}

void PoolClient::UseProbed() {
  if (!probed_ || submitted_.empty()) return;
  const Submitted& s = submitted_.front();
  if (s.epoch == 0 && s.batch == 0 && s.indices == probed_->indices) {
    Task t;
    t.id = next_task_id_++;
    t.epoch = 0;
    t.batch = 0;
    t.indices = std::move(submitted_.front().indices);
    t.slot = 0;
    t.done_worker = probed_->worker;
    t.fields = std::move(probed_->fields);
    ready_[0][0] = t.id;
    tasks_[t.id] = std::move(t);
    submitted_.pop_front();
    cv_.notify_all();
  } else {
    slots_->Release(0);
  }
  probed_.reset();
}

std::string PoolClient::RingErrorPrefix() const {
  return "loader of rank " + std::to_string(opts_.rank);
}

void PoolClient::ReserveRest(const std::shared_ptr<ShmRing>& ring) {
  for (size_t i = 1; i < ring->slots() && !stop_reserving_; ++i) {
    Status st = ring->ReserveSlot(i);
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      FailLocked(st.WithPrefix(RingErrorPrefix()));
      break;
    }
    slots_->Release(static_cast<int>(i));
  }
  reserving_ = false;
  slots_->Wake();
}

// --- tasks ---------------------------------------------------------------------------------

// Records a batch's failure as its outcome (delivered in order by Take).
void PoolClient::FailTask(Task& t, Status st) {
  ReleaseTaskSlot(t);
  t.error = std::move(st);
  ready_[t.epoch][t.batch] = t.id;
}

void PoolClient::ReleaseTaskSlot(Task& t) {
  if (t.slot >= 0) slots_->Release(t.slot);
  t.slot = -1;
}

void PoolClient::CancelTask(int64_t id) {
  Task& t = tasks_.at(id);
  if (t.worker >= 0) {
    t.canceled = true;  // still at a worker: its slot is freed when the answer arrives
    return;
  }
  Remove(t);
}

void PoolClient::Remove(Task& t) {
  const int64_t id = t.id;
  auto rit = std::find(reissue_.begin(), reissue_.end(), id);
  if (rit != reissue_.end()) reissue_.erase(rit);
  ReleaseTaskSlot(t);
  tasks_.erase(id);
}

int PoolClient::InFlightLocked() const {
  int n = 0;
  for (const Conn& c : conns_) n += static_cast<int>(c.queue.size());
  return n;
}

// Tasks issued and not yet handed to the trainer (in flight, ready, or to reissue).
int PoolClient::OutstandingLocked() const {
  int n = 0;
  for (const auto& [id, t] : tasks_) n += t.canceled ? 0 : 1;
  return n;
}

PoolClient::Conn* PoolClient::PickWorker(int64_t batch) {
  const int active = std::min<int>(active_workers_, static_cast<int>(conns_.size()));
  if (active <= 0) return nullptr;
  const int preferred = static_cast<int>(batch % active);
  auto can_take = [&](const Conn& c) {
    return c.state == ConnState::kReady && !c.hung_killed &&
           static_cast<int>(c.queue.size()) < opts_.prefetch_factor;
  };
  if (opts_.strict_round_robin) {
    // Only the worker DataLoader's round robin names; a successor keeps its id.
    Conn& c = conns_[static_cast<size_t>(preferred)];
    return can_take(c) ? &c : nullptr;
  }
  Conn* best = nullptr;
  for (int i = 0; i < active; ++i) {
    Conn& c = conns_[static_cast<size_t>(i)];
    if (!can_take(c)) continue;
    // Least loaded; on a tie the worker DataLoader's round robin would pick, which keeps
    // assignments (and so per-worker random streams) reproducible when nothing is late.
    if (best == nullptr || c.queue.size() < best->queue.size() ||
        (c.queue.size() == best->queue.size() && i == preferred)) {
      best = &c;
    }
  }
  return best;
}

std::optional<int64_t> PoolClient::NewTaskFromSubmitted() {
  auto slot = slots_->Acquire();
  if (!slot) return std::nullopt;
  const int64_t id = next_task_id_++;
  Task t;
  t.id = id;
  t.epoch = submitted_.front().epoch;
  t.batch = submitted_.front().batch;
  t.indices = std::move(submitted_.front().indices);
  t.slot = *slot;
  tasks_[id] = std::move(t);
  submitted_.pop_front();
  return id;
}

bool PoolClient::SendTask(Conn& c, int64_t id, Clock::TimePoint now) {
  Task& t = tasks_.at(id);
  Status st = SendMessage(c.fd, {MsgType::kTask,
                                 {{"id", t.id},
                                  {"epoch", t.epoch},
                                  {"batch", t.batch},
                                  {"slot", t.slot},
                                  {"indices", t.indices}}});
  if (!st.ok()) {
    // The worker is going away; the EOF path charges and reissues. Keep this task first.
    reissue_.push_front(id);
    ConnDown(c, now);
    return false;
  }
  if (c.queue.empty()) c.SetHeadSince(now);
  c.queue.push_back(id);
  t.worker = c.id;
  return true;
}

void PoolClient::IssueTasks(Clock::TimePoint now) {
  if (phase_ != Phase::kRunning || !error_.ok()) return;
  UseProbed();
  if (opts_.strict_round_robin) return IssueStrict(now);
  const int budget = active_workers_ * opts_.prefetch_factor;
  while (true) {
    int64_t id = -1;
    std::pair<int64_t, int64_t> key;
    const bool fresh = reissue_.empty();
    if (!fresh) {
      id = reissue_.front();
      key = {tasks_.at(id).epoch, tasks_.at(id).batch};
    } else {
      if (OutstandingLocked() >= budget || submitted_.empty()) return;
      key = {submitted_.front().epoch, submitted_.front().batch};
    }
    Conn* c = PickWorker(key.second);
    if (c == nullptr) return;
    if (fresh) {
      auto created = NewTaskFromSubmitted();
      if (!created) return;
      id = *created;
    } else {
      reissue_.pop_front();
    }
    SendTask(*c, id, now);
  }
}

void PoolClient::IssueStrict(Clock::TimePoint now) {
  // Reissued tasks (in batch order) each wait for their own worker, here or respawning; the
  // other workers go on meanwhile. A worker that is back gets its reissued tasks before any
  // fresh one: PickWorker only lets a fresh task through once its worker has room, and a
  // worker with room has none left to reissue.
  for (size_t k = 0; k < reissue_.size();) {
    const int64_t id = reissue_[k];
    Conn* c = PickWorker(tasks_.at(id).batch);
    if (c == nullptr) {
      ++k;
      continue;
    }
    reissue_.erase(reissue_.begin() + static_cast<std::ptrdiff_t>(k));
    if (!SendTask(*c, id, now)) k = 0;  // put back first; its worker is now down
  }
  // Fresh batches strictly in order, as _try_put_index issues them: the next one waits for
  // its worker even when another is idle.
  const int budget = active_workers_ * opts_.prefetch_factor;
  while (!submitted_.empty() && OutstandingLocked() < budget) {
    Conn* c = PickWorker(submitted_.front().batch);
    if (c == nullptr) return;
    auto id = NewTaskFromSubmitted();
    if (!id) return;
    SendTask(*c, *id, now);
  }
}

void PoolClient::FailLocked(Status st) {
  if (error_.ok()) error_ = std::move(st);
  cv_.notify_all();
}

}  // namespace spawnpoint::loader
