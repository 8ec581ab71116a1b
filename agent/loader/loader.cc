#include "agent/loader/loader.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "agent/loader/auto_worker_policy.h"
#include "agent/loader/contract.h"
#include "agent/loader/pool_supervisor.h"
#include "agent/loader/protocol.h"
#include "agent/loader/sampler.h"
#include "agent/loader/shm_ring.h"

extern char** environ;

namespace spawnpoint::loader {
namespace {

using SteadyClock = std::chrono::steady_clock;
using TimePoint = SteadyClock::time_point;

constexpr auto kExitRecordWait = std::chrono::seconds(3);
constexpr auto kStatsInterval = std::chrono::seconds(1);
constexpr auto kRateWindow = std::chrono::seconds(5);
// Next() reports a deadlock when it has waited this long with every slot held by batches
// the trainer has not released and nothing left in flight.
constexpr auto kSlotDeadlockAfter = std::chrono::seconds(2);

std::string JoinIndices(const std::vector<int64_t>& v, size_t limit = 16) {
  std::string s = "[";
  for (size_t i = 0; i < v.size() && i < limit; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  if (v.size() > limit) s += ", ... (" + std::to_string(v.size()) + " in all)";
  return s + "]";
}

double Seconds(SteadyClock::duration d) { return std::chrono::duration<double>(d).count(); }

// The free slots of the ring, shared with every batch handed out so that a release after
// the Loader is gone is harmless. Thread-safe.
class SlotPool {
 public:
  explicit SlotPool(size_t slots) {
    wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    for (size_t i = 0; i < slots; ++i) free_.push_back(static_cast<int>(i));
  }
  ~SlotPool() {
    if (wake_fd_ >= 0) close(wake_fd_);
  }
  void Resize(size_t slots) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.clear();
    for (size_t i = 0; i < slots; ++i) free_.push_back(static_cast<int>(i));
  }
  std::optional<int> Acquire() {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) return std::nullopt;
    int s = free_.front();
    free_.pop_front();
    return s;
  }
  void Release(int slot) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(slot);
    }
    Wake();
  }
  size_t FreeCount() const {
    std::lock_guard<std::mutex> lock(mu_);
    return free_.size();
  }
  void Wake() const {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
  }
  int wake_fd() const { return wake_fd_; }

 private:
  mutable std::mutex mu_;
  std::deque<int> free_;
  int wake_fd_ = -1;
};

// Consumption history for rates and the data-stall fraction. Not thread-safe.
struct Throughput {
  int64_t batches = 0;
  int64_t samples = 0;
  double wait_seconds = 0;
  std::optional<TimePoint> started;  // the first StartEpoch
  std::optional<double> first_batch_seconds;
  std::deque<std::pair<TimePoint, int64_t>> recent;  // (when, samples)

  void Consumed(TimePoint now, int64_t n) {
    ++batches;
    samples += n;
    recent.emplace_back(now, n);
    while (!recent.empty() && now - recent.front().first > kRateWindow) recent.pop_front();
  }
  void Fill(LoaderStats& s, TimePoint now) const {
    s.batches = batches;
    s.samples = samples;
    s.wait_seconds = wait_seconds;
    if (started) {
      const double wall = Seconds(now - *started);
      s.stall_fraction = wall > 0 ? std::min(1.0, wait_seconds / wall) : 0;
    }
    s.first_batch_seconds = first_batch_seconds.value_or(-1);
    int64_t n = 0, k = 0;
    std::optional<TimePoint> oldest;
    for (const auto& [t, m] : recent) {
      if (now - t > kRateWindow) continue;
      n += m;
      ++k;
      if (!oldest) oldest = t;
    }
    if (k > 0) {
      // Over the span the window actually covers, so a young loader is not under-reported.
      const double span = std::max(Seconds(now - *oldest), 1e-3);
      s.batches_per_second = k / span;
      s.samples_per_second = n / span;
    }
  }
};

// ---------------------------------------------------------------------------------------
// 0 workers: everything in the calling thread, on the heap.

class InProcessLoader : public Loader {
 public:
  InProcessLoader(LoaderOptions o, std::unique_ptr<Dataset> ds, SamplerOptions sampler)
      : opts_(std::move(o)), dataset_(std::move(ds)), sampler_(sampler) {
    created_ = SteadyClock::now();
  }

  int64_t DatasetSize() const override { return sampler_.dataset_size; }
  int64_t BatchesPerEpoch() const override { return loader::BatchesPerEpoch(sampler_); }
  const LoaderOptions& options() const override { return opts_; }
  std::vector<pid_t> WorkerPids() const override { return {}; }

  Status StartEpoch(int64_t epoch) override {
    if (!error_.ok()) return error_;
    std::lock_guard<std::mutex> lock(mu_);
    batches_ = EpochBatches(sampler_, epoch);
    next_ = 0;
    epoch_ = epoch;
    ctx_ = WorkerContext{};
    ctx_.rank = sampler_.rank;
    ctx_.world_size = sampler_.world_size;
    ctx_.epoch = epoch;
    ctx_.seed = DeriveSeed(sampler_.seed, sampler_.rank, 0, epoch);
    ctx_.rng.seed(ctx_.seed);
    if (!tp_.started) tp_.started = SteadyClock::now();
    return Status::Ok();
  }

  StatusOr<BatchPtr> Next() override {
    if (!error_.ok()) return error_;
    if (epoch_ < 0) return FailedPrecondition("loader: Next() before StartEpoch()");
    if (next_ >= batches_.size()) return BatchPtr(nullptr);
    const auto start = SteadyClock::now();
    const int64_t index = static_cast<int64_t>(next_);
    const std::vector<int64_t>& indices = batches_[next_];
    auto writer = std::make_shared<BatchWriter>(BatchWriter::ForHeap());
    std::vector<Sample> samples;
    samples.reserve(indices.size());
    auto where = [&](int64_t i) {
      return "dataset \"" + opts_.dataset + "\" failed on sample index " + std::to_string(i) +
             " (batch " + std::to_string(index) + " of epoch " + std::to_string(epoch_) + ")";
    };
    for (int64_t i : indices) {
      try {
        StatusOr<Sample> s = dataset_->Get(i, ctx_);
        if (!s.ok()) return error_ = Internal(where(i) + ": " + s.status().message());
        samples.push_back(std::move(s).value());
      } catch (const std::exception& e) {
        return error_ = Internal(where(i) + ": threw an exception: " + e.what());
      } catch (...) {
        return error_ = Internal(where(i) + ": threw a non-standard exception");
      }
    }
    try {
      Status st = dataset_->Collate(samples, *writer, ctx_);
      if (!st.ok()) {
        return error_ = Internal("collating batch " + std::to_string(index) + " of epoch " +
                                 std::to_string(epoch_) + ": " + st.message());
      }
    } catch (const std::exception& e) {
      return error_ = Internal("collating batch " + std::to_string(index) + ": threw: " + e.what());
    }
    auto batch = std::make_unique<Batch>();
    batch->epoch = epoch_;
    batch->index = index;
    batch->sample_indices = indices;
    for (size_t f = 0; f < writer->fields().size(); ++f) {
      const auto& field = writer->fields()[f];
      batch->fields.push_back({field.spec.name, field.spec.dtype, field.spec.shape,
                               writer->FieldData(f), field.nbytes});
    }
    ++next_;
    const auto now = SteadyClock::now();
    std::lock_guard<std::mutex> lock(mu_);
    tp_.wait_seconds += Seconds(now - start);
    tp_.Consumed(now, static_cast<int64_t>(indices.size()));
    if (!tp_.first_batch_seconds) tp_.first_batch_seconds = Seconds(now - created_);
    return MakeBatch(std::move(batch), [writer] {});
  }

  LoaderStats Stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    LoaderStats s;
    tp_.Fill(s, SteadyClock::now());
    s.epoch = epoch_;
    return s;
  }

 private:
  LoaderOptions opts_;
  std::unique_ptr<Dataset> dataset_;
  SamplerOptions sampler_;
  Status error_;
  std::vector<std::vector<int64_t>> batches_;
  size_t next_ = 0;
  int64_t epoch_ = -1;
  WorkerContext ctx_;
  TimePoint created_;
  mutable std::mutex mu_;  // guards tp_ and epoch_ for Stats()
  Throughput tp_;
};

// ---------------------------------------------------------------------------------------
// Workers in a pool: an I/O thread talks to them; Next() waits for what it produces.

struct PoolLoaderConfig {
  LoaderOptions opts;
  int pool_workers = 0;
  int initial_active = 0;
  int auto_cap = 0;  // > 0: tune the number of active workers up to this
  bool agent_mode = false;
  std::string dir;
  std::unique_ptr<StandalonePool> standalone;
  TimePoint created;
};

class PoolLoader : public Loader {
 public:
  explicit PoolLoader(PoolLoaderConfig config)
      : opts_(std::move(config.opts)),
        pool_workers_(config.pool_workers),
        active_workers_(config.initial_active),
        agent_mode_(config.agent_mode),
        dir_(std::move(config.dir)),
        standalone_(std::move(config.standalone)),
        created_(config.created),
        auto_(config.initial_active, config.auto_cap, *opts_.prefetch_factor, opts_.auto_window) {
    slots_count_ = static_cast<size_t>(pool_workers_ * *opts_.prefetch_factor + 4);
    slots_ = std::make_shared<SlotPool>(0);
  }

  ~PoolLoader() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    slots_->Wake();
    if (io_.joinable()) io_.join();
    stop_reserving_ = true;
    if (reserver_.joinable()) reserver_.join();
    if (agent_mode_) {
      // The final figures: a short attempt may end before the periodic write comes round.
      std::string text;
      {
        std::lock_guard<std::mutex> lock(mu_);
        text = StatsLocked(std::chrono::steady_clock::now()).ToJson().dump(2) + "\n";
      }
      (void)WriteFileAtomically(StatsPath(dir_), text);
    }
    for (Conn& c : conns_) {
      if (c.fd >= 0) close(c.fd);
    }
    standalone_.reset();
  }

  Status Init() {
    if (slots_->wake_fd() < 0) return Internal(std::string("eventfd: ") + strerror(errno));
    if (opts_.slot_bytes) {
      SP_RETURN_IF_ERROR(CreateRing(*opts_.slot_bytes));
      phase_ = Phase::kRunning;
    }
    for (int w = 0; w < pool_workers_; ++w) {
      Conn c;
      c.id = w;
      c.path = WorkerSocketPath(dir_, w);
      if (c.path.size() >= sizeof(sockaddr_un::sun_path)) {
        return InvalidArgument("loader: the socket path " + c.path + " is longer than " +
                               std::to_string(sizeof(sockaddr_un::sun_path) - 1) +
                               " bytes; use a shorter pool directory (or TMPDIR)");
      }
      // An exit record from before this Loader (a previous rank incarnation) is old news.
      auto old = ReadExitRecord(WorkerExitRecordPath(dir_, w));
      if (old.ok()) c.last_record_incarnation = old->incarnation;
      conns_.push_back(std::move(c));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (Conn& c : conns_) {
        c.down_since = SteadyClock::now();
        Connect(c, c.down_since);
      }
    }
    io_ = std::thread([this] { IoLoop(); });

    const auto setup = ServiceTimeout();
    std::unique_lock<std::mutex> lock(mu_);
    const bool settled = cv_.wait_for(lock, setup, [&] {
      if (!error_.ok()) return true;
      if (phase_ != Phase::kRunning) return false;
      return std::all_of(conns_.begin(), conns_.end(), [](const Conn& c) { return c.said_hello; });
    });
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

  int64_t DatasetSize() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return sampler_.dataset_size;
  }
  int64_t BatchesPerEpoch() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return loader::BatchesPerEpoch(sampler_);
  }
  const LoaderOptions& options() const override { return opts_; }

  std::vector<pid_t> WorkerPids() const override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<pid_t> pids;
    for (const Conn& c : conns_) pids.push_back(c.pid);
    return pids;
  }

  Status StartEpoch(int64_t epoch) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.ok()) return error_;
    // Batches issued ahead for this epoch are kept if none was consumed yet; everything else
    // is dropped: the trainer left an epoch early, restarts one, or did not continue with
    // the epoch issued ahead.
    auto existing = plans_.find(epoch);
    const bool keep = existing != plans_.end() && existing->second.yielded == 0;
    std::vector<int64_t> drop;
    for (auto& [id, t] : tasks_) {
      if (t.epoch != epoch || !keep) drop.push_back(id);
    }
    for (int64_t id : drop) CancelTask(id);
    for (auto it = plans_.begin(); it != plans_.end();) {
      it = (it->first == epoch && keep) ? std::next(it) : plans_.erase(it);
    }
    if (!keep) plans_[epoch] = MakePlan(epoch);
    current_epoch_ = epoch;
    expected_next_ = epoch + 1;
    if (!tp_.started) tp_.started = SteadyClock::now();
    slots_->Wake();
    return Status::Ok();
  }

  StatusOr<BatchPtr> Next() override {
    std::unique_lock<std::mutex> lock(mu_);
    if (current_epoch_ < 0 && error_.ok()) {
      return FailedPrecondition("loader: Next() before StartEpoch()");
    }
    const auto start = SteadyClock::now();
    TimePoint starved_since{};
    bool starving = false;
    while (true) {
      if (!error_.ok()) return error_;
      EpochPlan& plan = plans_.at(current_epoch_);
      if (plan.yielded >= static_cast<int64_t>(plan.batches.size())) {
        tp_.wait_seconds += Seconds(SteadyClock::now() - start);
        return BatchPtr(nullptr);
      }
      std::optional<int64_t> ready_id;
      if (opts_.in_order) {
        auto it = plan.ready.find(plan.next_yield);
        if (it != plan.ready.end()) ready_id = it->second;
      } else if (!plan.ready.empty()) {
        ready_id = plan.ready.begin()->second;
      }
      if (ready_id && tasks_.at(*ready_id).error) {
        Status st = *tasks_.at(*ready_id).error;
        Fail(st);
        return st;
      }
      if (ready_id) {
        BatchPtr batch = Yield(plan, *ready_id);
        const auto now = SteadyClock::now();
        tp_.wait_seconds += Seconds(now - start);
        tp_.Consumed(now, static_cast<int64_t>(batch->size()));
        if (!tp_.first_batch_seconds) tp_.first_batch_seconds = Seconds(now - created_);
        active_workers_ = auto_.OnBatch(now);
        slots_->Wake();  // the budget moved: more tasks may be issued
        return batch;
      }
      // Every slot held by the trainer and nothing in flight: no batch can ever come.
      const bool starved = phase_ == Phase::kRunning && InFlightLocked() == 0 && reissue_.empty() &&
                           slots_->FreeCount() == 0 && !reserving_;
      if (starved) {
        if (!starving) starved_since = SteadyClock::now();
        starving = true;
        if (SteadyClock::now() - starved_since > kSlotDeadlockAfter) {
          error_ = FailedPrecondition(
              "loader: all " + std::to_string(slots_count_) +
              " shared-memory slots are held by batches the trainer has not released, so no "
              "further batch can be built; drop batches (and tensors viewing them) before "
              "asking for more, or raise prefetchFactor to get more slots");
          return error_;
        }
      } else {
        starving = false;
      }
      cv_.wait_for(lock, std::chrono::milliseconds(100));
    }
  }

  LoaderStats Stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return StatsLocked(SteadyClock::now());
  }

 private:
  enum class Phase { kProbing, kRunning };
  enum class ConnState { kIdle, kAwaitHello, kReady, kAwaitRecord };

  struct Conn {
    int id = 0;
    std::string path;
    int fd = -1;
    std::unique_ptr<MessageReader> reader = std::make_unique<MessageReader>();
    ConnState state = ConnState::kIdle;
    TimePoint retry_at{};
    TimePoint down_since{};  // when it stopped serving (or Create began)
    std::string connect_error;
    TimePoint record_deadline{};
    TimePoint head_since{};
    pid_t pid = 0;
    int incarnation = -1;
    int last_record_incarnation = -1;
    bool said_hello = false;  // at least once since Create
    bool hello_this_connection = false;
    bool probing = false;
    bool hung_killed = false;
    std::string hang_note;
    int start_failures = 0;     // deaths before Hello, in a row
    std::deque<int64_t> queue;  // task ids in the order the worker will build them
  };

  struct Task {
    int64_t id = 0;
    int64_t epoch = 0;
    int64_t batch = 0;
    std::vector<int64_t> indices;
    int slot = -1;
    int worker = -1;  // the connection it is queued at, -1 if none
    bool done = false;
    bool canceled = false;
    int done_worker = -1;
    nlohmann::json fields;
    std::vector<std::string> failures;  // one line per failed attempt
    std::string last_failure_detail;    // the last attempt's stderr tail
    std::optional<Status> error;        // the batch's outcome when it cannot be built
  };

  struct EpochPlan {
    std::vector<std::vector<int64_t>> batches;
    int64_t next_issue = 0;
    int64_t next_yield = 0;
    int64_t yielded = 0;
    std::map<int64_t, int64_t> ready;  // batch -> task id
  };

  // The worker's latest exit, if it is newer than what this Loader has handled: why a worker
  // that never answers keeps failing (it may die before it accepts our connection).
  std::string LastExitNote(const Conn& c) const {
    auto r = ReadExitRecord(WorkerExitRecordPath(dir_, c.id));
    if (!r.ok() || r->incarnation <= c.last_record_incarnation) return "";
    std::string note = "; its last exit: pid " + std::to_string(r->pid) + " (incarnation " +
                       std::to_string(r->incarnation) + ") " + r->Describe();
    if (!r->stderr_tail.empty()) {
      note += "; its last stderr lines:";
      for (const std::string& l : r->stderr_tail) note += "\n    " + l;
    }
    return note;
  }

  // How long a worker may be out of service (not connected and said Hello) before the
  // Loader gives up on it: a pool that is gone must not make Next() wait forever.
  std::chrono::milliseconds ServiceTimeout() const {
    return opts_.timeout->count() > 0 ? *opts_.timeout : std::chrono::minutes(5);
  }

  EpochPlan MakePlan(int64_t epoch) {
    EpochPlan p;
    p.batches = EpochBatches(sampler_, epoch);
    return p;
  }

  // Checks the space for the whole ring and reserves slot 0 now: the first batch needs no
  // more, and reserving zeroes every page (~40 ms for 8 slots of 24 MiB here), which would
  // otherwise all come before the first batch. A background thread reserves the other slots
  // in order and hands each to the slot pool once reserved, so no slot is written before its
  // pages are; if the space went elsewhere meanwhile, the Loader fails with the same advice.
  Status CreateRing(size_t slot_bytes) {
    const std::string dir = opts_.shm_dir;
    auto ring = ShmRing::Create(dir, slots_count_, slot_bytes, /*reserve_slots=*/1);
    if (!ring.ok()) return ring.status().WithPrefix(RingErrorPrefix());
    ring_ = std::move(ring).value();
    slots_->Resize(1);
    if (slots_count_ > 1) {
      reserving_ = true;
      reserver_ = std::thread([this, ring = ring_] { ReserveRest(ring); });
    }
    return Status::Ok();
  }

  std::string RingErrorPrefix() const { return "loader of rank " + std::to_string(*opts_.rank); }

  // The background half of CreateRing. Takes mu_ only to report a failure.
  void ReserveRest(const std::shared_ptr<ShmRing>& ring) {
    for (size_t i = 1; i < ring->slots() && !stop_reserving_; ++i) {
      Status st = ring->ReserveSlot(i);
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        Fail(st.WithPrefix(RingErrorPrefix()));
        break;
      }
      slots_->Release(static_cast<int>(i));
    }
    reserving_ = false;
    slots_->Wake();
  }

  // --- connections -----------------------------------------------------------------

  void Connect(Conn& c, TimePoint now) {
    c.reader->Reset(-1);
    if (c.fd >= 0) close(c.fd);
    c.fd = -1;
    c.hello_this_connection = false;
    c.probing = false;
    c.state = ConnState::kIdle;
    c.retry_at = now + std::chrono::milliseconds(20);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      c.connect_error = std::string("socket: ") + strerror(errno);
      return;
    }
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, c.path.c_str(), sizeof(addr.sun_path) - 1);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      // Not there yet (the agent is starting the pool) or the backlog is full: retry.
      c.connect_error = std::string("connect: ") + strerror(errno);
      close(fd);
      return;
    }
    c.connect_error.clear();
    nlohmann::json configure = {{"protocol", kProtocolVersion}, {"dataset", opts_.dataset},
                                {"arg", opts_.dataset_arg},     {"seed", *opts_.seed},
                                {"rank", *opts_.rank},          {"worldSize", *opts_.world_size},
                                {"numWorkers", pool_workers_},  {"workerId", c.id}};
    if (!SendMessage(fd, {MsgType::kConfigure, configure}).ok() || (ring_ && !SendRing(fd).ok())) {
      close(fd);
      return;
    }
    c.fd = fd;
    c.reader->Reset(fd);
    c.state = ConnState::kAwaitHello;
  }

  Status SendRing(int fd) {
    return SendMessage(fd, {MsgType::kRing,
                            {{"slots", ring_->slots()}, {"slotBytes", ring_->slot_bytes()}},
                            ring_->fd()});
  }

  void ConnDown(Conn& c, TimePoint now) {
    c.reader->Reset(-1);
    if (c.fd >= 0) close(c.fd);
    c.fd = -1;
    if (c.state == ConnState::kReady) c.down_since = now;
    c.state = ConnState::kAwaitRecord;
    c.record_deadline = now + kExitRecordWait;
  }

  // The connection's worker is gone (EOF): learn why, charge the batch it was building,
  // reissue its tasks and connect to its successor.
  void HandleDeath(Conn& c, TimePoint now) {
    std::optional<WorkerExitRecord> record;
    auto r = ReadExitRecord(WorkerExitRecordPath(dir_, c.id));
    if (r.ok() && r->incarnation > c.last_record_incarnation &&
        (c.pid == 0 || !c.hello_this_connection || r->pid == c.pid)) {
      record = std::move(r).value();
    }
    if (!record && now < c.record_deadline) return;  // not written yet: look again soon
    if (record) c.last_record_incarnation = record->incarnation;

    const pid_t pid = record ? record->pid : c.pid;
    std::string who = "worker " + std::to_string(c.id) + " (pid " + std::to_string(pid);
    if (record) who += ", incarnation " + std::to_string(record->incarnation);
    who += ")";
    std::string line;
    if (c.hung_killed) {
      line = who + " " + c.hang_note;
      ++restarts_hung_;
    } else if (record) {
      line = who + " died: " + record->Describe();
      switch (record->cause.reason) {
        case agent::ExitReason::kOomKilled:
          ++restarts_oom_;
          break;
        case agent::ExitReason::kShmExhausted:
          ++restarts_shm_;
          break;
        default:
          ++restarts_died_;
      }
    } else {
      line = who + " closed its connection, and no exit record appeared in " + dir_ + " within " +
             std::to_string(kExitRecordWait.count()) + " s";
      ++restarts_died_;
    }
    std::string tail;
    if (record && !record->stderr_tail.empty()) {
      tail = "; its last stderr lines:";
      for (const std::string& l : record->stderr_tail) tail += "\n    " + l;
    } else if (record) {
      tail = "; it wrote nothing to stderr";
    }

    if (!c.hello_this_connection) {
      if (++c.start_failures >= opts_.max_attempts) {
        Fail(Internal("loader: worker " + std::to_string(c.id) + " of rank " +
                      std::to_string(*opts_.rank) + " failed " + std::to_string(c.start_failures) +
                      " times before it could serve; last: " + line + tail));
        return;
      }
    }
    if (c.probing) {
      if (++probe_failures_ >= opts_.max_attempts) {
        Fail(Internal("loader: building the first batch (to size shared memory) failed " +
                      std::to_string(probe_failures_) + " times; last: " + line + tail));
        return;
      }
    }
    // The worker builds its tasks in order, so the first one is what it died on.
    std::optional<int64_t> given_up;
    if (!c.queue.empty()) {
      Task& head = tasks_.at(c.queue.front());
      head.failures.push_back(line);
      head.last_failure_detail = tail;
      if (!head.canceled && static_cast<int>(head.failures.size()) >= opts_.max_attempts) {
        std::string msg = "loader: batch " + std::to_string(head.batch) + " of epoch " +
                          std::to_string(head.epoch) + " (sample indices " +
                          JoinIndices(head.indices) + ") failed " +
                          std::to_string(head.failures.size()) + " times:";
        for (size_t i = 0; i < head.failures.size(); ++i) {
          msg += "\n  attempt " + std::to_string(i + 1) + ": " + head.failures[i];
        }
        given_up = head.id;
        head.worker = -1;
        FailTask(head, Internal(msg + tail));
      }
    }
    for (int64_t id : c.queue) {
      if (given_up && id == *given_up) continue;
      Task& t = tasks_.at(id);
      t.worker = -1;
      if (t.canceled) {
        ReleaseTaskSlot(t);
        tasks_.erase(id);
      } else {
        reissue_.push_back(id);
      }
    }
    c.queue.clear();
    std::sort(reissue_.begin(), reissue_.end(), [&](int64_t a, int64_t b) {
      const Task& x = tasks_.at(a);
      const Task& y = tasks_.at(b);
      return std::tie(x.epoch, x.batch) < std::tie(y.epoch, y.batch);
    });
    c.hung_killed = false;
    c.hang_note.clear();
    Connect(c, now);
  }

  // --- messages ----------------------------------------------------------------------

  void HandleMessage(Conn& c, Message& m, TimePoint now) {
    switch (m.type) {
      case MsgType::kHello:
        return OnHello(c, m.body, now);
      case MsgType::kProbeResult:
        return OnProbeResult(c, m.body, now);
      case MsgType::kDone:
        return OnDone(c, m.body, now);
      case MsgType::kError:
        return OnWorkerError(c, m.body, now);
      default:
        Fail(Internal(std::string("loader: unexpected ") + MsgTypeName(m.type) +
                      " message from worker " + std::to_string(c.id)));
    }
  }

  void OnHello(Conn& c, const nlohmann::json& b, TimePoint now) {
    const int worker = b.value("workerId", -1);
    if (worker != c.id) {
      Fail(Internal("loader: " + c.path + " answered as worker " + std::to_string(worker)));
      return;
    }
    const int64_t size = b.value("size", int64_t{-1});
    if (sampler_.dataset_size < 0) {
      sampler_.dataset_size = size;
    } else if (size != sampler_.dataset_size) {
      Fail(Internal("loader: worker " + std::to_string(c.id) + " sees " + std::to_string(size) +
                    " samples in dataset \"" + opts_.dataset + "\" but another saw " +
                    std::to_string(sampler_.dataset_size)));
      return;
    }
    c.pid = b.value("pid", 0);
    c.incarnation = b.value("incarnation", -1);
    c.said_hello = true;
    c.hello_this_connection = true;
    c.start_failures = 0;
    c.state = ConnState::kReady;
    c.head_since = now;
    if (phase_ == Phase::kProbing && c.id == 0) StartProbe(c);
  }

  void StartProbe(Conn& c) {
    std::vector<std::vector<int64_t>> first = EpochBatches(sampler_, 0);
    if (first.empty()) {
      // Nothing to load at all: a one-page ring keeps the machinery uniform.
      Status st = CreateRing(PageSize());
      if (!st.ok()) return Fail(st);
      EnterRunning();
      return;
    }
    Status st =
        SendMessage(c.fd, {MsgType::kProbe, {{"epoch", 0}, {"batch", 0}, {"indices", first[0]}}});
    if (st.ok()) c.probing = true;
  }

  void OnProbeResult(Conn& c, const nlohmann::json& b, TimePoint now) {
    c.probing = false;
    if (phase_ != Phase::kProbing) return;
    probe_bytes_ = b.value("bytes", size_t{0});
    Status st = CreateRing(SlotBytesForBatch(probe_bytes_));
    if (!st.ok()) return Fail(st);
    EnterRunning();
  }

  void EnterRunning() {
    phase_ = Phase::kRunning;
    for (Conn& c : conns_) {
      if (c.fd >= 0 && !SendRing(c.fd).ok()) ConnDown(c, SteadyClock::now());
    }
  }

  void OnDone(Conn& c, const nlohmann::json& b, TimePoint now) {
    const int64_t id = b.value("id", int64_t{-1});
    auto qit = std::find(c.queue.begin(), c.queue.end(), id);
    if (qit == c.queue.end()) return;  // not ours any more
    c.queue.erase(qit);
    c.head_since = now;
    Task& t = tasks_.at(id);
    t.worker = -1;
    if (t.canceled) {
      ReleaseTaskSlot(t);
      tasks_.erase(id);
      return;
    }
    t.done = true;
    t.done_worker = c.id;
    t.fields = b.value("fields", nlohmann::json::array());
    auto pit = plans_.find(t.epoch);
    if (pit != plans_.end()) pit->second.ready[t.batch] = id;
  }

  void OnWorkerError(Conn& c, const nlohmann::json& b, TimePoint now) {
    const int64_t id = b.value("id", int64_t{-1});
    const std::string kind = b.value("kind", "");
    const std::string message = b.value("message", "");
    const std::string who = "worker " + std::to_string(c.id) +
                            (c.pid > 0 ? " (pid " + std::to_string(c.pid) + ")" : "");
    Task* t = nullptr;
    if (id >= 0 && tasks_.count(id)) t = &tasks_.at(id);
    std::string batch;
    if (t) {
      batch = "batch " + std::to_string(t->batch) + " of epoch " + std::to_string(t->epoch);
    } else if (c.probing) {
      batch = "batch 0 of epoch 0 (built first to size shared memory)";
    }
    Status st;
    if (kind == "dataset") {
      st = Internal("loader: dataset \"" + opts_.dataset + "\" failed on sample index " +
                    std::to_string(b.value("index", int64_t{-1})) + " (" + batch + ", on " + who +
                    "): " + message);
    } else if (kind == "slot") {
      const size_t need = b.value("need", size_t{0});
      const size_t have = b.value("have", size_t{0});
      std::string origin = opts_.slot_bytes ? std::string("set by slot_bytes")
                                            : "sized from the first batch (" +
                                                  FormatBytes(probe_bytes_) + ") + 25 %";
      st = FailedPrecondition("loader: " + batch + " needs " + FormatBytes(need) + " (" +
                              std::to_string(need) + " bytes) but a shared-memory slot holds " +
                              FormatBytes(have) + " (" + origin +
                              "); set LoaderOptions::slot_bytes or SPAWNPOINT_LOADER_SLOT_BYTES "
                              "to at least " +
                              std::to_string(need));
    } else if (kind == "configure") {
      st = FailedPrecondition("loader: " + who + " cannot serve dataset \"" + opts_.dataset +
                              "\": " + message);
    } else {
      st = Internal("loader: " + who + " reported a " + kind + " error" +
                    (batch.empty() ? "" : " on " + batch) + ": " + message);
    }
    if (t == nullptr) return Fail(st);  // configuring, probing: nothing can go on
    // The worker is fine and moves on; the batch's outcome is this error, which Next()
    // reports when the trainer reaches the batch, so earlier batches are still delivered
    // and the first failing batch in sampler order is the one reported.
    auto qit = std::find(c.queue.begin(), c.queue.end(), id);
    if (qit != c.queue.end()) c.queue.erase(qit);
    c.head_since = now;
    t->worker = -1;
    if (t->canceled) {
      ReleaseTaskSlot(*t);
      tasks_.erase(id);
      return;
    }
    FailTask(*t, st);
  }

  // Records a batch's failure as its outcome (delivered in order by Next()).
  void FailTask(Task& t, Status st) {
    ReleaseTaskSlot(t);
    t.done = true;
    t.error = std::move(st);
    auto pit = plans_.find(t.epoch);
    if (pit != plans_.end()) pit->second.ready[t.batch] = t.id;
  }

  // --- tasks -------------------------------------------------------------------------

  void ReleaseTaskSlot(Task& t) {
    if (t.slot >= 0) slots_->Release(t.slot);
    t.slot = -1;
  }

  void CancelTask(int64_t id) {
    Task& t = tasks_.at(id);
    if (t.worker >= 0) {
      t.canceled = true;  // still at a worker: its slot is freed when the answer arrives
      return;
    }
    auto rit = std::find(reissue_.begin(), reissue_.end(), id);
    if (rit != reissue_.end()) reissue_.erase(rit);
    ReleaseTaskSlot(t);
    tasks_.erase(id);
  }

  int InFlightLocked() const {
    int n = 0;
    for (const Conn& c : conns_) n += static_cast<int>(c.queue.size());
    return n;
  }

  // Tasks issued and not yet handed to the trainer (in flight, ready, or to reissue).
  int OutstandingLocked() const {
    int n = 0;
    for (const auto& [id, t] : tasks_) n += t.canceled ? 0 : 1;
    return n;
  }

  // The next batch nobody has been given yet, from the current epoch, else (issuing ahead)
  // from the next one.
  std::optional<std::pair<int64_t, int64_t>> NextFresh() {
    // Nothing can be planned before a worker said how large the dataset is (with slot_bytes
    // given the Loader runs from the start, and any wake-up, e.g. a slot reserved, would
    // otherwise plan the first epoch as empty).
    if (sampler_.dataset_size < 0) return std::nullopt;
    if (current_epoch_ >= 0) {
      EpochPlan& cur = plans_.at(current_epoch_);
      if (cur.next_issue < static_cast<int64_t>(cur.batches.size())) {
        return std::make_pair(current_epoch_, cur.next_issue);
      }
      if (!opts_.prefetch_next_epoch) return std::nullopt;
    } else if (!opts_.prefetch_next_epoch) {
      return std::nullopt;
    }
    if (!plans_.count(expected_next_)) plans_[expected_next_] = MakePlan(expected_next_);
    EpochPlan& ahead = plans_.at(expected_next_);
    if (ahead.next_issue < static_cast<int64_t>(ahead.batches.size())) {
      return std::make_pair(expected_next_, ahead.next_issue);
    }
    return std::nullopt;
  }

  Conn* PickWorker(int64_t batch) {
    Conn* best = nullptr;
    const int active = std::min<int>(active_workers_, static_cast<int>(conns_.size()));
    const int preferred = active > 0 ? static_cast<int>(batch % active) : 0;
    for (int i = 0; i < active; ++i) {
      Conn& c = conns_[static_cast<size_t>(i)];
      if (c.state != ConnState::kReady || c.hung_killed) continue;
      if (static_cast<int>(c.queue.size()) >= *opts_.prefetch_factor) continue;
      // Least loaded; on a tie the worker DataLoader's round robin would pick, which keeps
      // assignments (and so per-worker random streams) reproducible when nothing is late.
      if (best == nullptr || c.queue.size() < best->queue.size() ||
          (c.queue.size() == best->queue.size() && i == preferred)) {
        best = &c;
      }
    }
    return best;
  }

  void IssueTasks(TimePoint now) {
    if (phase_ != Phase::kRunning || !error_.ok()) return;
    const int budget = active_workers_ * *opts_.prefetch_factor;
    while (true) {
      int64_t id = -1;
      bool fresh = false;
      std::pair<int64_t, int64_t> key;
      if (!reissue_.empty()) {
        id = reissue_.front();
        key = {tasks_.at(id).epoch, tasks_.at(id).batch};
      } else {
        if (OutstandingLocked() >= budget) return;
        auto next = NextFresh();
        if (!next) return;
        key = *next;
        fresh = true;
      }
      Conn* c = PickWorker(key.second);
      if (c == nullptr) return;
      int slot = -1;
      if (fresh) {
        auto s = slots_->Acquire();
        if (!s) return;
        slot = *s;
        id = next_task_id_++;
        Task t;
        t.id = id;
        t.epoch = key.first;
        t.batch = key.second;
        t.indices = plans_.at(key.first).batches[static_cast<size_t>(key.second)];
        t.slot = slot;
        tasks_[id] = std::move(t);
        ++plans_.at(key.first).next_issue;
      } else {
        reissue_.pop_front();
      }
      Task& t = tasks_.at(id);
      Status st = SendMessage(c->fd, {MsgType::kTask,
                                      {{"id", t.id},
                                       {"epoch", t.epoch},
                                       {"batch", t.batch},
                                       {"slot", t.slot},
                                       {"indices", t.indices}}});
      if (!st.ok()) {
        // The worker is going away; the EOF path charges and reissues. Keep this task first.
        reissue_.push_front(id);
        ConnDown(*c, now);
        continue;
      }
      if (c->queue.empty()) c->head_since = now;
      c->queue.push_back(id);
      t.worker = c->id;
    }
  }

  BatchPtr Yield(EpochPlan& plan, int64_t id) {
    Task& t = tasks_.at(id);
    plan.ready.erase(t.batch);
    ++plan.yielded;
    if (opts_.in_order) ++plan.next_yield;
    auto batch = std::make_unique<Batch>();
    batch->epoch = t.epoch;
    batch->index = t.batch;
    batch->sample_indices = std::move(t.indices);
    batch->worker_id = t.done_worker;
    std::byte* base = ring_->Slot(static_cast<size_t>(t.slot));
    for (const auto& f : t.fields) {
      BatchField field;
      field.name = f.value("name", "");
      auto dtype = ParseDType(f.value("dtype", "u8"));
      field.dtype = dtype.ok() ? *dtype : DType::kU8;
      field.shape = f.value("shape", std::vector<int64_t>{});
      field.data = base + f.value("offset", size_t{0});
      field.nbytes = f.value("nbytes", size_t{0});
      batch->fields.push_back(std::move(field));
    }
    const int slot = t.slot;
    tasks_.erase(id);
    // The slot returns to the pool when the trainer drops the batch; the ring mapping
    // stays alive until then even if the Loader is destroyed first.
    return MakeBatch(std::move(batch),
                     [pool = slots_, ring = ring_, slot] { pool->Release(slot); });
  }

  // --- the I/O thread ----------------------------------------------------------------

  void Fail(Status st) {
    if (error_.ok()) error_ = std::move(st);
    cv_.notify_all();
  }

  void CheckHung(TimePoint now) {
    if (opts_.timeout->count() <= 0) return;
    for (Conn& c : conns_) {
      if (c.state != ConnState::kReady || c.queue.empty() || c.hung_killed || c.pid <= 0) {
        continue;
      }
      if (now - c.head_since < *opts_.timeout) continue;
      const Task& t = tasks_.at(c.queue.front());
      c.hung_killed = true;
      char secs[32];
      std::snprintf(secs, sizeof(secs), "%g", Seconds(*opts_.timeout));
      c.hang_note = std::string("hung: no batch in ") + secs + " s (building batch " +
                    std::to_string(t.batch) + " of epoch " + std::to_string(t.epoch) +
                    "); killed with SIGKILL";
      // The whole group, so helper processes the dataset started go too.
      kill(-c.pid, SIGKILL);
      if (kill(c.pid, SIGKILL) != 0 && errno != ESRCH) {
        Fail(Internal("loader: worker " + std::to_string(c.id) + " (pid " + std::to_string(c.pid) +
                      ") is hung and cannot be killed: " + strerror(errno)));
      }
    }
  }

  std::optional<TimePoint> NextDeadline() const {
    std::optional<TimePoint> next;
    auto take = [&](TimePoint t) {
      if (!next || t < *next) next = t;
    };
    for (const Conn& c : conns_) {
      if (c.state == ConnState::kIdle || c.state == ConnState::kAwaitRecord) {
        take(SteadyClock::now() + std::chrono::milliseconds(10));
      }
      if (c.state == ConnState::kReady && !c.queue.empty() && !c.hung_killed &&
          opts_.timeout->count() > 0) {
        take(c.head_since + *opts_.timeout);
      }
    }
    if (agent_mode_) take(next_stats_write_);
    return next;
  }

  void IoLoop() {
    std::vector<pollfd> fds;
    std::vector<int> owners;
    while (true) {
      int timeout_ms = -1;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (quit_) return;
        fds.clear();
        owners.clear();
        fds.push_back({slots_->wake_fd(), POLLIN, 0});
        for (const Conn& c : conns_) {
          if (c.fd >= 0) {
            fds.push_back({c.fd, POLLIN, 0});
            owners.push_back(c.id);
          }
        }
        if (auto d = NextDeadline()) {
          auto ms = std::chrono::ceil<std::chrono::milliseconds>(*d - SteadyClock::now());
          timeout_ms = static_cast<int>(std::max<int64_t>(0, ms.count()));
        }
      }
      poll(fds.data(), fds.size(), timeout_ms);
      std::unique_lock<std::mutex> lock(mu_);
      if (quit_) return;
      if (fds[0].revents & POLLIN) {
        uint64_t v;
        [[maybe_unused]] ssize_t n = read(slots_->wake_fd(), &v, sizeof(v));
      }
      const auto now = SteadyClock::now();
      for (size_t k = 1; k < fds.size(); ++k) {
        if (fds[k].revents == 0) continue;
        Conn& c = conns_[static_cast<size_t>(owners[k - 1])];
        if (c.fd != fds[k].fd) continue;
        ReadConn(c, now);
      }
      CheckHung(now);
      for (Conn& c : conns_) {
        if (!error_.ok()) break;
        if (c.state == ConnState::kAwaitRecord) HandleDeath(c, now);
        if (c.state == ConnState::kIdle && now >= c.retry_at) Connect(c, now);
        if (c.state != ConnState::kReady && now - c.down_since > ServiceTimeout()) {
          Fail(Status(StatusCode::kUnavailable,
                      "loader: worker " + std::to_string(c.id) + " at " + c.path +
                          " has not served for " + std::to_string(ServiceTimeout().count() / 1000) +
                          " s" + (c.connect_error.empty() ? "" : " (" + c.connect_error + ")") +
                          "; is its pool's owner (the agent, or this program's pool thread) "
                          "still running?"));
        }
      }
      IssueTasks(now);
      cv_.notify_all();
      if (agent_mode_ && now >= next_stats_write_) {
        next_stats_write_ = now + kStatsInterval;
        const std::string text = StatsLocked(now).ToJson().dump(2) + "\n";
        lock.unlock();
        // Best effort: the agent reads it for display; a failed write must not stop loading.
        (void)WriteFileAtomically(StatsPath(dir_), text);
      }
    }
  }

  void ReadConn(Conn& c, TimePoint now) {
    std::string error;
    MessageReader::Result r = c.reader->ReadSome(/*block=*/false, &error);
    while (error_.ok()) {
      std::optional<Message> m = c.reader->Pop(&error);
      if (!m) break;
      if (m->fd >= 0) close(m->fd);
      HandleMessage(c, *m, now);
      if (c.fd < 0) return;  // the handler dropped the connection
    }
    if (!error.empty() && r == MessageReader::Result::kOk) {
      Fail(Internal("loader: worker " + std::to_string(c.id) + ": " + error));
      return;
    }
    if (r != MessageReader::Result::kOk) ConnDown(c, now);
  }

  LoaderStats StatsLocked(TimePoint now) const {
    LoaderStats s;
    tp_.Fill(s, now);
    s.epoch = current_epoch_;
    int ready = 0;
    for (const auto& [e, p] : plans_) ready += static_cast<int>(p.ready.size());
    s.queue_depth = ready;
    s.in_flight = InFlightLocked();
    s.active_workers = active_workers_;
    s.pool_workers = pool_workers_;
    s.auto_workers = auto_.enabled();
    s.auto_settled = auto_.settled();
    s.restarts_died = restarts_died_;
    s.restarts_hung = restarts_hung_;
    s.restarts_oom = restarts_oom_;
    s.restarts_shm = restarts_shm_;
    s.slots = ring_ ? ring_->slots() : 0;
    s.slot_bytes = ring_ ? ring_->slot_bytes() : 0;
    return s;
  }

  LoaderOptions opts_;
  const int pool_workers_;
  int active_workers_;
  const bool agent_mode_;
  const std::string dir_;
  std::unique_ptr<StandalonePool> standalone_;
  const TimePoint created_;
  size_t slots_count_ = 0;
  std::shared_ptr<SlotPool> slots_;
  std::shared_ptr<ShmRing> ring_;
  std::thread reserver_;  // reserves the ring's slots after the first (CreateRing)
  std::atomic<bool> reserving_{false};
  std::atomic<bool> stop_reserving_{false};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::thread io_;
  bool quit_ = false;
  Status error_;
  Phase phase_ = Phase::kProbing;
  size_t probe_bytes_ = 0;
  int probe_failures_ = 0;
  SamplerOptions sampler_;
  std::vector<Conn> conns_;
  std::map<int64_t, Task> tasks_;
  std::deque<int64_t> reissue_;
  int64_t next_task_id_ = 0;
  std::map<int64_t, EpochPlan> plans_;
  int64_t current_epoch_ = -1;
  int64_t expected_next_ = 0;
  Throughput tp_;
  TimePoint next_stats_write_{};
  int64_t restarts_died_ = 0, restarts_hung_ = 0, restarts_oom_ = 0, restarts_shm_ = 0;
  AutoWorkerPolicy auto_;

 public:
  void SetSampler(SamplerOptions s) { sampler_ = s; }
};

StatusOr<std::vector<std::string>> OwnCommand() {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return Internal(std::string("readlink /proc/self/exe: ") + strerror(errno));
  exe[n] = '\0';
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> argv;
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find('\0', start);
    if (end == std::string::npos) end = all.size();
    argv.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  if (argv.empty()) argv.push_back(exe);
  // /proc/self/exe names the program image even if argv[0] is a bare name or a symlink.
  argv[0] = exe;
  return argv;
}

}  // namespace

nlohmann::json LoaderStats::ToJson() const {
  return {{"epoch", epoch},
          {"batches", batches},
          {"samples", samples},
          {"batchesPerSecond", batches_per_second},
          {"samplesPerSecond", samples_per_second},
          {"waitSeconds", wait_seconds},
          {"dataStall", stall_fraction},
          {"firstBatchSeconds", first_batch_seconds},
          {"queueDepth", queue_depth},
          {"inFlight", in_flight},
          {"activeWorkers", active_workers},
          {"poolWorkers", pool_workers},
          {"autoWorkers", auto_workers},
          {"autoSettled", auto_settled},
          {"restarts",
           {{"died", restarts_died},
            {"hung", restarts_hung},
            {"oom", restarts_oom},
            {"shm", restarts_shm}}},
          {"slots", slots},
          {"slotBytes", slot_bytes}};
}

StatusOr<std::unique_ptr<Loader>> Loader::Create(LoaderOptions options) {
  if (getenv(kEnvListenFd) != nullptr) {
    return FailedPrecondition(
        "loader: this process was started as a loader worker but is running the trainer's "
        "code: call spawnpoint::loader::RunWorkerIfRequested(argc, argv) first thing in main");
  }
  const TimePoint created = SteadyClock::now();
  SP_ASSIGN_OR_RETURN(LoaderOptions o, ResolveLoaderOptions(std::move(options)));
  SamplerOptions sampler;
  sampler.batch_size = o.batch_size;
  sampler.shuffle = o.shuffle;
  sampler.drop_last = o.drop_last;
  sampler.seed = *o.seed;
  sampler.rank = *o.rank;
  sampler.world_size = *o.world_size;

  if (o.workers == 0) {
    SP_ASSIGN_OR_RETURN(std::unique_ptr<Dataset> ds, CreateDataset(o.dataset, o.dataset_arg));
    try {
      sampler.dataset_size = ds->Size();
    } catch (const std::exception& e) {
      return Internal("dataset \"" + o.dataset + "\": Size() threw: " + e.what());
    }
    return std::unique_ptr<Loader>(new InProcessLoader(std::move(o), std::move(ds), sampler));
  }

  PoolLoaderConfig config;
  config.created = created;
  const int cap = std::min(8, *o.cpus);
  if (!o.pool_dir.empty()) {
    SP_ASSIGN_OR_RETURN(const int pool_size, AgentPoolSize(ProcessEnv));
    config.agent_mode = true;
    config.dir = o.pool_dir;
    config.pool_workers = pool_size;
    if (o.workers == kAutoWorkers) {
      config.auto_cap = std::min(config.pool_workers, std::max(1, *o.cpus));
      config.initial_active = 1;
    } else {
      config.initial_active = std::min(o.workers, config.pool_workers);
    }
  } else {
    std::vector<std::string> argv = o.worker_command;
    if (argv.empty()) {
      if (!WorkerEntryPointCalled()) {
        return FailedPrecondition(
            "loader: workers re-run this program, which must call "
            "spawnpoint::loader::RunWorkerIfRequested(argc, argv) first thing in main (or set "
            "LoaderOptions::worker_command)");
      }
      SP_ASSIGN_OR_RETURN(argv, OwnCommand());
    }
    PoolSpec spec;
    spec.rank = *o.rank;
    spec.workers = o.workers == kAutoWorkers ? cap : o.workers;
    spec.argv = argv;
    for (char** e = environ; *e != nullptr; ++e) spec.env.push_back(*e);
    spec.sink_fd = o.output_fd;
    spec.remove_dir = true;
    std::string tmpl =
        (std::filesystem::temp_directory_path() /
         ("spawnpoint-" + std::to_string(getpid()) + "-rank" + std::to_string(*o.rank) + "-XXXXXX"))
            .string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      return Internal("loader: cannot create a pool directory like " + tmpl + ": " +
                      strerror(errno));
    }
    spec.dir = tmpl;
    config.dir = tmpl;
    config.pool_workers = spec.workers;
    config.initial_active = o.workers == kAutoWorkers ? 1 : o.workers;
    config.auto_cap = o.workers == kAutoWorkers ? cap : 0;
    auto pool = StandalonePool::Start(std::move(spec));
    if (!pool.ok()) {
      std::error_code ec;
      std::filesystem::remove_all(tmpl, ec);
      return pool.status();
    }
    config.standalone = std::move(pool).value();
  }
  config.opts = std::move(o);
  auto loader = std::make_unique<PoolLoader>(std::move(config));
  sampler.dataset_size = -1;  // learnt from the workers' Hello
  loader->SetSampler(sampler);
  SP_RETURN_IF_ERROR(loader->Init());
  return std::unique_ptr<Loader>(std::move(loader));
}

}  // namespace spawnpoint::loader
