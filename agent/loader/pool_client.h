// The rank's half of the pool protocol (protocol.h): it connects to the workers of a pool
// directory, sizes the shared-memory ring from a probe batch, issues batches given as sample
// indices, reissues a dead worker's tasks to its successor, kills a worker whose task is
// overdue, and hands every batch back exactly once as a ready slot. It knows nothing of
// datasets, samplers or torch: the C++ Loader drives it, and so can a per-rank service for
// a Python rank. Time a worker spent waiting for a CPU does not count toward its timeout
// (hang_clock.h), up to a ceiling of wall time.
//
// Thread-safety: every public method may be called from any thread. Start() starts an I/O
// thread that does all socket work; PoolClientOptions::on_tick runs on it without the
// client's lock held.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/loader/hang_clock.h"
#include "agent/loader/protocol.h"
#include "agent/loader/shm_ring.h"
#include "agent/loader/slot_pool.h"
#include "common/clock.h"
#include "common/status.h"

namespace spawnpoint::loader {

struct PoolClientOptions {
  std::string dir;          // the pool directory (contract.h)
  int workers = 0;          // the pool's size
  int initial_active = 0;   // workers given tasks at first (SetActiveWorkers changes it)
  int prefetch_factor = 2;  // tasks outstanding per active worker; slots: workers x this + 4
  // An overdue task kills its worker, as does a connected worker that says no Hello; time
  // the worker waited for a CPU does not count, up to HangClock::kCeilingTimeouts x this of
  // wall time (hang_clock.h). 0: never.
  std::chrono::milliseconds timeout{120'000};
  int max_attempts = 3;  // failures of one batch (or worker start) allowed
  // Batch b is built by worker b % active workers, as DataLoader's _try_put_index assigns
  // it, so per-worker random streams match PyTorch's exactly; a task waits for its worker's
  // queue to have room rather than going to an idle worker. Batches are issued in order and
  // issuing stops at the first whose worker is full, as DataLoader's does with
  // prefetch_factor; a dead or hung-killed worker's tasks wait for its successor (same id).
  // PyTorch restarts its worker cycle at worker 0 every epoch (_MultiProcessingDataLoaderIter.
  // _reset), so numbering each epoch's batches from 0 gives its mapping. Change active
  // workers only between epochs. For identical streams worker 0's first task must be the
  // probed batch (epoch 0, batch 0, probe_batch's indices) or slot_bytes must be set: a
  // worker builds the probe with its streams (the Python worker rewinds them if the probed
  // batch is not what it is asked for next; C++ workers do not).
  // false: the least-loaded worker, round robin on a tie.
  bool strict_round_robin = false;
  std::optional<size_t> slot_bytes;  // unset: sized from the probe batch
  // false: Start() returns once worker 0 said Hello and the ring exists; the others join as
  // they say Hello (tasks wait for their worker), as long as ServiceTimeout allows. For
  // pools whose workers warm up one after another (PoolSpec::start_concurrency): the first
  // batch need not wait for the last worker's start-up.
  bool start_waits_for_all_workers = true;
  std::string shm_dir = "/dev/shm";
  // What every worker is configured with.
  std::string dataset;
  std::string dataset_arg;
  uint64_t seed = 0;
  int rank = 0;
  int world_size = 1;
  // The sample indices of the batch to probe, given the dataset's size (from worker 0's
  // Hello); empty: there is nothing to load and a one-page ring will do.
  std::function<std::vector<int64_t>(int64_t dataset_size)> probe_batch;
  // Called on the I/O thread every tick_interval (never if it is 0).
  std::function<void()> on_tick;
  Clock::Duration tick_interval{0};
  const Clock* clock = RealClock::Get();
  // How long a worker's process has lived and waited for a CPU (hang_clock.h); tests inject
  // readings, to run on a SimulatedClock.
  ProcessTimesReader process_times = ReadProcessTimes;
};

// A built batch, handed over by Take(): the caller owns `slot` until it calls Release.
struct ReadyBatch {
  int64_t epoch = 0;
  int64_t batch = 0;
  std::vector<int64_t> indices;
  int slot = -1;
  int worker = -1;        // who built it
  nlohmann::json fields;  // [{"name","dtype","shape","offset","nbytes"}] within the slot
  // The batch's structure and its non-array leaves, from a Python worker (null from C++
  // workers): spawnpoint_rank/_batch_codec.py describes it.
  nlohmann::json tree;
};

struct PoolClientStats {
  int queue_depth = 0;  // built and not yet taken
  int in_flight = 0;    // at workers
  int active_workers = 0;
  int pool_workers = 0;
  int64_t restarts_died = 0, restarts_hung = 0, restarts_oom = 0, restarts_shm = 0;
  int64_t hung_kills = 0;  // workers killed as hung (restarts_hung counts them once handled)
  size_t slots = 0;
  size_t slot_bytes = 0;
};

// How Start() and the first batch went, for a breakdown of the first batch's time.
struct PoolStartTimes {
  Clock::TimePoint start;         // Start() called
  Clock::TimePoint hello;         // worker 0's Hello (spawned and connected)
  Clock::TimePoint probe_sent;    // the first batch asked for
  Clock::TimePoint probe_result;  // ... and built (the ring sized from it)
  Clock::TimePoint ring_ready;    // the ring exists (slot 0 usable)
  double probe_build_s = -1;      // the worker's own time building it
  bool in_place = false;          // built in slot 0 (no copy, no task)
};

class PoolClient {
 public:
  explicit PoolClient(PoolClientOptions options);
  // Stop(), then closes the connections.
  ~PoolClient();
  PoolClient(const PoolClient&) = delete;
  PoolClient& operator=(const PoolClient&) = delete;

  // Connects and waits until every worker (or worker 0: start_waits_for_all_workers) said
  // Hello and the ring exists. Errors: what a
  // worker reports, kDeadlineExceeded naming the silent workers (and their last exits).
  // REQUIRES: called once, before the methods below but Stop().
  Status Start();
  // Ends the I/O thread and the slot reservation; no callback runs after it. Idempotent.
  void Stop();

  // From the workers' Hello; -1 before Start() succeeded.
  int64_t dataset_size() const;
  // Per worker id, the pid that last said Hello (0 if none yet).
  std::vector<pid_t> WorkerPids() const;

  // Queues batches first_batch, first_batch + 1, ... of `epoch`, each given by its sample
  // indices. Batches are issued in the order they were submitted (after any being
  // reissued), while fewer than active workers x prefetch_factor are outstanding and a slot
  // is free.
  void Submit(int64_t epoch, int64_t first_batch, std::vector<std::vector<int64_t>> batches);
  // Forgets every batch of an epoch other than `keep` (of every epoch if nullopt), whether
  // queued, built (its slot is freed) or at a worker (freed when the worker answers).
  void DropAllBut(std::optional<int64_t> keep);
  // Tells every connected worker that what it built for `epoch` is void (Rewind in
  // protocol.h): its random streams go back to where that epoch began. Call it after
  // DropAllBut has dropped the epoch, and never submit that epoch again.
  void Rewind(int64_t epoch);
  // Waits up to `wait` for batch `batch` of `epoch` (with nullopt: the lowest of that epoch
  // built so far) and hands it over. nullopt if none came; the batch's own failure if it
  // could not be built (which, like any error, then sticks to the client).
  StatusOr<std::optional<ReadyBatch>> Take(int64_t epoch, std::optional<int64_t> batch,
                                           Clock::Duration wait);
  // Returns a slot handed over by Take.
  void Release(int slot) { slots_->Release(slot); }
  // True when no batch can ever be built: every slot is held by the caller and nothing is at
  // a worker or waiting to be reissued.
  bool SlotsExhausted() const;
  void SetActiveWorkers(int n);
  // The first error sticks: Take fails with it from then on.
  void Fail(Status st);
  Status error() const;
  // The worker's Error message behind error() ({"kind", "message", "index", "excType"...},
  // protocol.h) when a worker's report is what failed the client; null otherwise.
  nlohmann::json error_detail() const;
  PoolClientStats Stats() const;
  PoolStartTimes start_times() const;

  // The ring (null before Start() sized it) and its free slots, for views that outlive the
  // client (they hold these pointers).
  std::shared_ptr<ShmRing> ring() const;
  const std::shared_ptr<SlotPool>& slot_pool() const { return slots_; }
  size_t slot_count() const { return slots_count_; }

 private:
  enum class Phase { kProbing, kRunning };
  enum class ConnState { kIdle, kAwaitHello, kReady, kAwaitRecord };

  struct Conn {
    int id = 0;
    std::string path;
    int fd = -1;
    std::unique_ptr<MessageReader> reader = std::make_unique<MessageReader>();
    ConnState state = ConnState::kIdle;
    Clock::TimePoint retry_at{};
    Clock::TimePoint down_since{};  // when it stopped serving (or Start began)
    std::string connect_error;
    Clock::TimePoint record_deadline{};
    Clock::TimePoint head_since{};  // since when the first task in `queue` is owed
    // Times the wait for the worker: from head_since while kReady, else from down_since.
    HangClock hang_clock;
    pid_t pid = 0;
    int incarnation = -1;
    int last_record_incarnation = -1;
    bool said_hello = false;  // at least once since Start
    bool hello_this_connection = false;
    bool probing = false;
    bool hung_killed = false;
    std::string hang_note;
    int start_failures = 0;     // deaths before Hello, in a row
    std::deque<int64_t> queue;  // task ids in the order the worker will build them

    // Set head_since (down_since) and restart the hang clock from it.
    void SetHeadSince(Clock::TimePoint t) {
      head_since = t;
      hang_clock.Restart(t);
    }
    void SetDownSince(Clock::TimePoint t) {
      down_since = t;
      hang_clock.Restart(t);
    }
  };

  struct Task {
    int64_t id = 0;
    int64_t epoch = 0;
    int64_t batch = 0;
    std::vector<int64_t> indices;
    int slot = -1;
    int worker = -1;  // the connection it is queued at, -1 if none
    bool canceled = false;
    int done_worker = -1;
    nlohmann::json fields;
    nlohmann::json tree;
    std::vector<std::string> failures;  // one line per failed attempt
    std::string last_failure_detail;    // the last attempt's stderr tail
    std::optional<Status> error;        // the batch's outcome when it cannot be built
    nlohmann::json error_body;          // the worker's Error message behind `error`, if any
  };

  struct Submitted {
    int64_t epoch = 0;
    int64_t batch = 0;
    std::vector<int64_t> indices;
  };

  // Each private method below REQUIRES: mu_ held, unless it says otherwise.

  // The ring: space checked for all slots, slot 0 reserved now, the rest by reserver_.
  Status CreateRing(size_t slot_bytes);
  // The ring out of the file worker 0 built batch 0 in (in-place probe): slot 0 holds it.
  Status AdoptRing(int fd, size_t bytes);
  void StartReserver();
  // The in-place probe's batch becomes the task of the first submitted batch if that is
  // the one probed; otherwise slot 0 is freed.
  void UseProbed();
  // reserver_'s body: reserves slots 1.. and frees each once reserved. Takes mu_ itself.
  void ReserveRest(const std::shared_ptr<ShmRing>& ring);
  std::string RingErrorPrefix() const;

  // Connections: (re)connect and configure, send the ring, go down, the worker's death.
  void Connect(Conn& c, Clock::TimePoint now);
  Status SendRing(int fd);
  void ConnDown(Conn& c, Clock::TimePoint now);
  void HandleDeath(Conn& c, Clock::TimePoint now);
  std::string LastExitNote(const Conn& c) const;
  // How long a worker may be out of service before the client gives up on the pool.
  std::chrono::milliseconds ServiceTimeout() const;
  // How long `c` has been out of service as that limit counts it: not the time its worker
  // waited for a CPU, below the hang clock's ceiling.
  Clock::Duration OutOfService(const Conn& c, Clock::TimePoint now) const;

  // Messages from a worker.
  void ReadConn(Conn& c, Clock::TimePoint now);
  void HandleMessage(Conn& c, Message& m, Clock::TimePoint now);
  void OnHello(Conn& c, const nlohmann::json& b, Clock::TimePoint now);
  void StartProbe(Conn& c);
  void OnProbeResult(Conn& c, Message& m);
  void EnterRunning();
  void OnDone(Conn& c, const nlohmann::json& b, Clock::TimePoint now);
  void OnWorkerError(Conn& c, const nlohmann::json& b, Clock::TimePoint now);

  // Tasks.
  void FailTask(Task& t, Status st);  // the batch's outcome: this error, delivered in order
  void ReleaseTaskSlot(Task& t);
  void CancelTask(int64_t id);
  void Remove(Task& t);  // forgets a task at no worker: unqueued, its slot freed
  int InFlightLocked() const;
  int OutstandingLocked() const;
  // The worker to give batch `batch` to now, or null if none may take it.
  Conn* PickWorker(int64_t batch);
  void IssueTasks(Clock::TimePoint now);
  // strict_round_robin's issuing: reissued tasks to their own workers, then submitted
  // batches in order up to the first whose worker has no room.
  void IssueStrict(Clock::TimePoint now);
  // A fresh task for the first submitted batch, in a free slot (its id), or nullopt if no
  // slot is free.
  std::optional<int64_t> NewTaskFromSubmitted();
  // Sends task `id` to `c`; false when the connection broke (the task is put back first in
  // reissue_ and the connection goes down).
  bool SendTask(Conn& c, int64_t id, Clock::TimePoint now);
  void FailLocked(Status st);

  // The I/O thread (takes mu_ itself).
  void IoLoop();
  void CheckHung(Clock::TimePoint now);
  // A look at a connected worker that has said no Hello (hang_clock.h): kills it if hung.
  // Returns true when it is spared only because it waited for a CPU (so whoever waits for
  // it should wait until c.hang_clock.NextLook).
  bool KillSilentWorker(Conn& c, Clock::TimePoint now);
  // The process in c's pid file, if it is a child of the pool's owner: its CPU wait goes to
  // c's hang clock (a look).
  struct WorkerProcess {
    pid_t pid = 0;
    ProcessTimes times;
  };
  std::optional<WorkerProcess> LookAtSilentWorker(Conn& c, Clock::TimePoint now);
  std::optional<Clock::TimePoint> NextDeadline(Clock::TimePoint now) const;

  // Constant after construction.
  const PoolClientOptions opts_;
  const size_t slots_count_;
  const std::shared_ptr<SlotPool> slots_;

  // The threads; started by Start(), joined by Stop().
  std::thread io_;
  std::thread reserver_;
  std::atomic<bool> reserving_{false};
  std::atomic<bool> stop_reserving_{false};

  mutable std::mutex mu_;
  std::condition_variable cv_;  // notified when the I/O thread has handled events
  // Guarded by mu_.
  bool quit_ = false;
  Status error_;
  nlohmann::json error_detail_;
  Phase phase_ = Phase::kProbing;
  int64_t dataset_size_ = -1;
  size_t probe_bytes_ = 0;
  std::vector<int64_t> probe_indices_;
  struct Probed {  // batch 0 of epoch 0, built in place in slot 0, not yet a task
    std::vector<int64_t> indices;
    nlohmann::json fields;
    int worker = 0;
  };
  std::optional<Probed> probed_;
  PoolStartTimes times_;
  int probe_failures_ = 0;
  std::shared_ptr<ShmRing> ring_;
  std::vector<Conn> conns_;
  int active_workers_;
  std::map<int64_t, Task> tasks_;
  std::deque<Submitted> submitted_;  // not yet issued
  std::deque<int64_t> reissue_;
  std::map<int64_t, std::map<int64_t, int64_t>> ready_;  // epoch -> batch -> task id
  int64_t next_task_id_ = 0;
  Clock::TimePoint next_tick_{};
  int64_t restarts_[4] = {0, 0, 0, 0};  // by RestartKind
  int hello_kills_ = 0;                 // workers killed for never saying Hello (CheckHung)
  int64_t hung_kills_ = 0;              // workers killed as hung, both ways
};

}  // namespace spawnpoint::loader
