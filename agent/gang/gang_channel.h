// The gang channel (issue 19): the TCP connections between the agents of one job and the
// coordinator that node 0's agent runs (coordinator.h). Messages are JSON objects, one per
// line. A connection's first line is {"t": "hello", "job", "node", "attempt", "token"}: the
// server closes a connection whose job or token is not its own (after a "refused" line) and
// logs it with the peer's address, never the token.
//
// GangServer: listens, runs the coordinator on one thread of its own, and sends what the
// coordinator returns; Start/Stop from one thread, the rest is internal. GangPeer: one
// agent's connection, with a reader thread; every public method is thread-safe. A peer
// whose connection drops connects again (the coordinator's pod recreated) until Close().
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "agent/gang/coordinator.h"
#include "common/clock.h"
#include "common/status.h"

namespace spawnpoint::agent::gang {

// Compares two tokens in time independent of where they differ.
bool SameToken(const std::string& a, const std::string& b);

class GangServer {
 public:
  struct Options {
    std::string job;
    std::string token;
    std::string bind_host = "0.0.0.0";
    int port = 0;  // 0: any free port (port() tells)
    CoordinatorOptions coordinator;
    Clock* clock = RealClock::Get();
    std::function<void(const std::string&)> say;  // the agent's log
    // Each message the coordinator sends to every node (verdicts: the status document).
    std::function<void(const nlohmann::json&)> on_broadcast;
  };
  static StatusOr<std::unique_ptr<GangServer>> Start(Options options);
  ~GangServer();  // stops the thread, closes every connection
  int port() const { return port_; }

 private:
  explicit GangServer(Options options) : options_(std::move(options)) {}
  void Loop();

  Options options_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // a pipe: Stop wakes the loop
  int port_ = 0;
  std::thread thread_;
};

class GangPeer {
 public:
  struct Options {
    std::string job;
    std::string token;
    std::string host;
    int port = 0;
    int node = 0;
    Clock* clock = RealClock::Get();
    std::function<void(const std::string&)> say;
  };
  // Connects (retrying until `deadline` on the clock) and says hello at `attempt`.
  static StatusOr<std::unique_ptr<GangPeer>> Connect(Options options, int attempt,
                                                     Clock::TimePoint deadline);
  ~GangPeer();

  // Sends one message; false when the connection is down (it is being made again).
  bool Send(const nlohmann::json& message);
  // Whether the connection is up now.
  bool Connected() const;
  // The next message from the coordinator, waiting until `deadline`; nullopt on timeout.
  // A dropped connection is a message {"t": "lost"} (then one {"t": "reconnected"}). A
  // coordinator that refused this peer (wrong job or token) is not dialled again: "refused"
  // is then the last message, and Send returns false from then on.
  std::optional<nlohmann::json> Next(Clock::TimePoint deadline);
  // Whether a "stop" or "verdict" for `attempt` arrived, or the connection dropped during
  // it (the ranks must stop): checked by the gang on its ticks without consuming messages.
  bool StopSeen(int attempt) const;
  // This agent is going away (a termination signal): the connection is shut down now and
  // never dialled again, so the coordinator counts this node lost at once; Send returns
  // false from then on, and Next gives what had arrived, then "lost".
  void Leave();
  // The attempt said in the hello after a reconnection.
  void SetAttempt(int attempt);
  // This agent's ranks run `attempt` (until Ended): a dropped connection stops them.
  void Started(int attempt);
  void Ended();

 private:
  explicit GangPeer(Options options) : options_(std::move(options)) {}
  Status Dial(Clock::TimePoint deadline);
  void ReadLoop();
  void Push(nlohmann::json message);

  Options options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<nlohmann::json> inbox_;  // guarded by mu_
  int fd_ = -1;                       // guarded by mu_ (written), the reader reads it
  int attempt_ = 0;                   // guarded by mu_
  int stop_attempt_ = -1;             // guarded by mu_: the last attempt a stop came for
  int running_ = -1;                  // guarded by mu_: the attempt the ranks run, or -1
  bool lost_ = false;                 // guarded by mu_: the connection is down
  std::atomic<bool> closing_{false};
  std::thread reader_;
};

}  // namespace spawnpoint::agent::gang
