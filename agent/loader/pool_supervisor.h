// A PoolSupervisor owns one rank's loader workers: it spawns them (never forks), respawns
// each when it exits, and records why it exited. Every method is thread-safe, but the ones
// that spawn (Start, OnChildExited, OnChildVanished, Tick) must run on one long-lived thread
// (REQUIRES below); the owner is the agent's poll loop, or StandalonePool's thread.
//
// The pool never reaps: whoever waits for children calls OnChildExited for every child
// that exited (it returns false for pids that are not this pool's).
//
// What a worker sees and leaves (names in contract.h):
// - For each worker w the pool creates the listening socket <dir>/worker-<w>.sock once and
//   keeps it for its whole life; every incarnation of the worker is spawned with that
//   socket as fd 3 and SPAWNPOINT_LOADER_{LISTEN_FD=3, WORKER_ID, RANK, INCARNATION} added
//   to the rank's environment. Because the socket outlives incarnations, a Loader can
//   connect before a worker has started and reconnect to its respawned successor at the
//   same path.
// - Worker stdout and stderr are read through pipes (by an internal thread) and written to
//   the sink prefixed with "[rank R worker W] "; the last 20 stderr lines of each
//   incarnation are kept.
// - When a worker exits, <dir>/worker-<w>.exit.json is written atomically (pid,
//   incarnation, exit code, signal, classified reason and message, stderr tail) and the
//   worker is respawned: at once, or after crash_loop_delay when it exited more than
//   crash_loop_exits times within crash_loop_window (logged, never silent).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/loader/contract.h"
#include "agent/process/spawner.h"
#include "common/status.h"

namespace spawnpoint::loader {

struct PoolSpec {
  int rank = 0;
  int workers = 1;
  std::string dir;                // created if missing
  std::vector<std::string> argv;  // the worker command: the trainer's own, in worker mode
  std::vector<std::string> env;   // the rank's environment ("NAME=value")
  std::vector<int> cpus;          // the workers' CPU affinity; empty: inherit
  int sink_fd = 2;                // where prefixed output lines go
  int death_signal = SIGKILL;     // PR_SET_PDEATHSIG of every worker
  int crash_loop_exits = 5;
  std::chrono::milliseconds crash_loop_window{10'000};
  std::chrono::milliseconds crash_loop_delay{1'000};
  bool remove_dir = false;  // on destruction remove `dir` and its contents (temporary pools)
  // Workers that do their start-up work at once; 0: all. With c > 0, worker w >= c begins
  // when worker w - c has finished its own (kEnvTurnFd/kEnvStartedFd in contract.h), so
  // that workers do not crowd the rank's CPUs while it starts too, and are warm in the
  // order their batches are asked for (batch b by worker b % n). Only for workers that
  // close the STARTED descriptor when they are ready (the Python worker does, after its
  // preload); a respawned worker starts at once.
  int start_concurrency = 0;
  // The cgroup v2 memory.events file: a SIGKILL while its oom_kill count rose is recorded as
  // OOMKilled. Empty: not checked.
  std::string memory_events_path;
};

class PoolSupervisor {
 public:
  using Clock = std::chrono::steady_clock;

  PoolSupervisor(agent::ProcessSpawner* spawner, PoolSpec spec);
  // Joins the output thread, closes and unlinks the sockets. Workers still running are sent
  // SIGKILL but not reaped: stop (and reap) them first.
  ~PoolSupervisor();
  PoolSupervisor(const PoolSupervisor&) = delete;
  PoolSupervisor& operator=(const PoolSupervisor&) = delete;

  // Creates the directory and the sockets and spawns every worker. On error, workers
  // already spawned have been sent SIGKILL and remain in Pids() for the caller to reap.
  // REQUIRES: the spawning thread (PR_SET_PDEATHSIG kills a worker when the thread that
  // spawned it exits), as for the three methods below.
  Status Start();
  // Adds workers until the pool has `workers` (fewer: nothing changes): their sockets and
  // processes, started at once, as Start() makes them. On error the workers added so far
  // stay (respawned like any other). REQUIRES: the spawning thread, after Start().
  Status Grow(int workers);
  // Workers the pool has now (spec().workers, or more after Grow).
  int Size() const;
  // Records the exit of `pid` (wait_status as from waitpid) and respawns the worker; false
  // if `pid` is not one of this pool's current workers. REQUIRES: the spawning thread.
  bool OnChildExited(pid_t pid, int wait_status);
  // For a worker whose exit status someone else collected (waitpid gave ECHILD): recorded
  // with an unknown cause and respawned. False if `pid` is not a current worker.
  // REQUIRES: the spawning thread.
  bool OnChildVanished(pid_t pid);
  // Respawns that were deferred (crash loop, a failed spawn) and are now due. Call when
  // TimeToNextRespawn() has passed; harmless at any time. REQUIRES: the spawning thread.
  void Tick();
  std::optional<std::chrono::milliseconds> TimeToNextRespawn() const;

  std::vector<pid_t> Pids() const;    // the running workers
  pid_t WorkerPid(int worker) const;  // 0 while not running
  int64_t Exits() const;
  // Worker pids, incarnations, exit counts and the exits by reason, for a status page.
  nlohmann::json StatusJson() const;
  const PoolSpec& spec() const { return spec_; }

  // Stops respawning, sends SIGTERM to every worker's process group, waits up to `grace`
  // for them to exit (without reaping: the caller's reaper does), then sends SIGKILL to what
  // is left. Blocks for at most `grace`.
  void Stop(std::chrono::milliseconds grace);
  // Stop, then waitpid() each worker pid (only those, never -1) and record the exits. For
  // owners that are their workers' only reaper.
  void StopAndReap(std::chrono::milliseconds grace);

 private:
  struct Stream {
    int fd = -1;
    std::string partial;
  };
  struct Worker {
    int id = 0;
    int listen_fd = -1;
    std::string socket_path;
    pid_t pid = 0;
    int incarnation = -1;
    Stream out, err;
    std::deque<std::string> stderr_tail;
    std::deque<Clock::time_point> recent_exits;
    std::optional<Clock::time_point> respawn_at;
    int64_t exits = 0;
    std::optional<int64_t> oom_kills_at_spawn;
  };

  Worker* FindLocked(pid_t pid);
  void RecordExitLocked(Worker& w, const agent::ExitStatus& status, const agent::ExitCause& cause);
  // `gate`: the (turn, started) descriptors of a staggered first start; -1 where none.
  Status SpawnLocked(Worker& w, std::pair<int, int> gate = {-1, -1});
  void RespawnOrDeferLocked(Worker& w, const std::string& why);
  // Reads what is available; `drain` keeps reading until EOF or EAGAIN.
  void ReadStreamLocked(Worker& w, bool is_err, bool drain);
  void EmitLineLocked(Worker& w, bool is_err, const std::string& line);
  void LogLocked(const Worker& w, const std::string& line);
  void CloseStreamsLocked(Worker& w);
  void WakePump();
  void PumpLoop();

  // Constant after construction.
  agent::ProcessSpawner* spawner_;
  PoolSpec spec_;

  mutable std::mutex mu_;
  // Guarded by mu_.
  std::vector<Worker> workers_;
  std::map<std::string, int64_t> exits_by_reason_;
  bool started_ = false;
  bool stopping_ = false;
  bool quit_ = false;
  // The pump thread (started by Start()) reads the workers' output; wake_fd_ (made by the
  // constructor) wakes it. The destructor joins it and closes the descriptor.
  int wake_fd_ = -1;
  std::thread pump_;
};

// A pool together with the thread that spawns and reaps its workers, for a process without
// the agent (a standalone Loader, tests). The thread waits on pidfds of its own workers
// only (never waitpid(-1), which would steal the program's other children).
class StandalonePool {
 public:
  static StatusOr<std::unique_ptr<StandalonePool>> Start(
      PoolSpec spec, std::chrono::milliseconds stop_grace = std::chrono::seconds(2));
  // Stops the workers (SIGTERM, SIGKILL after the grace), reaps them, joins the thread.
  ~StandalonePool();

  PoolSupervisor& pool() { return *pool_; }
  std::vector<pid_t> Pids() const { return pool_->Pids(); }
  const std::string& dir() const { return pool_->spec().dir; }

 private:
  StandalonePool() = default;
  void Run(Status* start_status, std::mutex* mu, std::condition_variable* cv, bool* started);

  std::unique_ptr<agent::ProcessSpawner> spawner_;
  std::unique_ptr<PoolSupervisor> pool_;
  std::chrono::milliseconds stop_grace_{2000};
  int wake_fd_ = -1;
  std::thread thread_;
};

}  // namespace spawnpoint::loader
