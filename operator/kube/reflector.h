// A reflector keeps a sink in step with the API server, as client-go's does: list (paged),
// then watch from the list's resourceVersion. When a watch ends or stalls it resumes from
// the last resourceVersion it saw (events and bookmarks); when the server answers 410
// Gone/Expired (an HTTP 410 or an ERROR event with code 410) it lists again from scratch and
// hands the whole state to the sink, which must reconcile (deletions missed in the gap).
// Failures back off 800 ms → 30 s, jittered, reset after two healthy minutes.
// Run() blocks on its own thread; Stop() and the accessors are thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "operator/kube/client.h"
#include "operator/kube/timing.h"

namespace spawnpoint::kube {

// Receives the reflector's view of the world, in order, from the reflector's thread.
class ReflectorSink {
 public:
  virtual ~ReflectorSink() = default;
  // The complete state as of a (re)list.
  virtual void Replace(std::vector<Json> items, const std::string& resource_version) = 0;
  // An ADDED, MODIFIED or DELETED event (bookmarks are consumed by the reflector).
  virtual void Apply(WatchEventType type, Json object) = 0;
};

struct ReflectorOptions {
  int64_t page_size = 500;
  BackoffPolicy backoff;  // 800 ms → 30 s
  // No line (event or bookmark) for this long: the watch is stalled; resume it.
  std::chrono::milliseconds watch_idle_timeout{std::chrono::minutes(2)};
  // Each watch asks the server to end it after a random time in [min, 2 × min), so
  // connections are renewed and spread out (client-go uses 5 minutes).
  std::chrono::seconds min_watch_timeout{300};
  // A watch that ends with no event sooner than this counts as a failure (backs off).
  Clock::Duration short_watch = std::chrono::seconds(1);
  std::function<double()> uniform01;  // jitter source; default seeded PRNG
};

struct ReflectorStats {
  int64_t lists = 0;            // successful (re)lists
  int64_t relists_on_gone = 0;  // of which caused by 410
  int64_t watches = 0;          // watch connections opened
  int64_t events = 0;           // ADDED/MODIFIED/DELETED applied
  int64_t bookmarks = 0;
  int64_t errors = 0;  // failed lists, watches and broken streams
};

class Reflector {
 public:
  Reflector(Client* client, GroupVersionResource gvr, std::string ns, ListOptions selectors,
            ReflectorSink* sink, ReflectorOptions options = {});
  ~Reflector();

  // Lists and watches until Stop().
  void Run();
  // Ends Run(): cancels the open watch and any backoff wait (a list in flight finishes
  // first, bounded by the client's timeout and retry budget). Idempotent.
  void Stop();

  std::string LastResourceVersion() const;
  ReflectorStats Stats() const;
  const GroupVersionResource& gvr() const { return gvr_; }

 private:
  // Waits `d` on the clock; false if stopped meanwhile.
  bool Sleep(Clock::Duration d);
  bool Stopped() const;
  void Log(LogLevel level, const std::string& message) const;
  // One watch connection; returns true if the next step is a relist.
  bool WatchOnce();

  Client* const client_;
  const GroupVersionResource gvr_;
  const std::string ns_;
  const ListOptions selectors_;
  ReflectorSink* const sink_;
  const ReflectorOptions options_;
  Clock* const clock_;
  std::function<double()> uniform01_;
  Backoff backoff_;
  const std::string what_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
  WatchStream* current_watch_ = nullptr;
  std::string last_rv_;
  ReflectorStats stats_;
};

}  // namespace spawnpoint::kube
