// The agent's per-rank loader service for a Python rank: the one scheduler (PoolClient) run
// in the agent on the rank's behalf, so the rank side stays pure Python and loads in any
// trainer image. The rank connects to <pool dir>/service.sock and, per DataLoader iterator,
// opens a session: the service starts a PoolClient over the first numWorkers workers of the
// pool (strict round robin, so batch b is built by worker b % numWorkers as in PyTorch;
// a DataLoader asking for more workers than the pool has grows it, up to max_workers),
// sends the ring's descriptor, issues the sample indices the rank submits, and sends every
// built batch back in the order submitted as a slot of the ring (protocol.h lists the
// messages). One session at a time: opening another stops the current one (the workers keep
// their state; see spawnpoint_rank/worker.py). One rank connection at a time: a new one (a
// restarted rank) replaces the old. stats.json in the pool directory is rewritten every
// second from what the rank reports it consumed and waited, in the C++ Loader's format.
//
// Thread-safety: Start and the destructor from one thread; Stats() from any. The service
// runs on its own thread plus one sender thread per session.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "agent/loader/loader.h"
#include "agent/loader/pool_client.h"
#include "agent/loader/protocol.h"
#include "agent/loader/throughput_meter.h"
#include "common/clock.h"
#include "common/status.h"

namespace spawnpoint::loader {

struct RankServiceOptions {
  std::string dir;       // the rank's pool directory (contract.h)
  int pool_workers = 0;  // workers the pool runs; a session may use fewer
  // A session asking for more workers than the pool has (up to this many) grows the pool
  // through `grow`, which returns once the pool has that many workers (their sockets exist;
  // the processes may still be starting). 0 or no `grow`: never grows.
  int max_workers = 0;
  std::function<Status(int workers)> grow;
  int rank = 0;
  int world_size = 1;
  std::string shm_dir = "/dev/shm";
  // Where the service's own lines go ("rank R loader: ..."); unset: stderr.
  std::function<void(const std::string&)> log;
  const Clock* clock = RealClock::Get();
};

class RankPoolService {
 public:
  // Listens on ServiceSocketPath(dir) and starts serving.
  static StatusOr<std::unique_ptr<RankPoolService>> Start(RankServiceOptions options);
  // Stops the session and the threads, closes the connection, removes the socket file.
  ~RankPoolService();
  RankPoolService(const RankPoolService&) = delete;
  RankPoolService& operator=(const RankPoolService&) = delete;

  // The rank's loader statistics (what stats.json holds).
  LoaderStats Stats() const;
  // Sessions opened since Start (for tests and the status page).
  int64_t sessions() const;

 private:
  // One DataLoader iterator's PoolClient, and the thread that sends its batches.
  struct Session {
    int64_t id = 0;
    std::unique_ptr<PoolClient> client;
    std::thread sender;
    std::mutex mu;
    std::condition_variable cv;
    // Guarded by mu: the batches submitted and not yet sent, in order.
    std::deque<std::pair<int64_t, int64_t>> expected;
    bool quit = false;
    // Owned by the service thread: the epoch the rank submitted speculatively and has not
    // confirmed yet; its batches are voided (and the workers rewound) unless a Drop keeps it.
    std::optional<int64_t> speculative;
  };

  explicit RankPoolService(RankServiceOptions options);
  void Serve();
  void Accept();
  void CloseConnection();
  // Reads what the rank sent; false when the connection is over.
  bool ReadRank();
  void HandleMessage(const Message& m);
  void Open(const nlohmann::json& body);
  // Hands batches first..first+n-1 of `epoch` to the session's workers; they reach the rank
  // in this order.
  void Submit(Session* s, int64_t epoch, int64_t first, std::vector<std::vector<int64_t>> batches);
  // Drops every batch of the session but those of `keep` (all with nullopt); voids an
  // unconfirmed speculative epoch that is not kept.
  void Drop(Session* s, std::optional<int64_t> keep);
  void EndSession();
  void SendBatches(Session* s);
  void Reply(const Message& m);  // to the rank; a failed send closes nothing (reads find EOF)
  void WriteStats();
  void Log(const std::string& line) const;

  // Constant after construction.
  const RankServiceOptions opts_;

  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: the destructor wakes Serve()
  std::thread thread_;
  std::atomic<bool> quit_{false};

  // Owned by the service thread.
  int conn_fd_ = -1;
  MessageReader reader_;
  std::unique_ptr<Session> session_;
  Clock::TimePoint next_stats_{};

  std::mutex send_mu_;  // one writer at a time on conn_fd_

  mutable std::mutex mu_;
  // Guarded by mu_.
  PoolClient* starting_ = nullptr;  // a client in Start(): the destructor fails it
  std::optional<ThroughputMeter> meter_;
  int64_t epoch_ = -1;
  int64_t sessions_ = 0;
  int pool_workers_ = 0;      // opts_.pool_workers, or more once the pool grew
  PoolClientStats finished_;  // restarts of sessions already over
  PoolClient* current_ = nullptr;
};

}  // namespace spawnpoint::loader
