// A small HTTP/1.1 server for metrics and probes: GET /metrics renders a Registry in the
// text format 0.0.4, /healthz answers 200 while the server runs, /readyz 200 or 503 by a
// flag the owner sets, and Handle() adds more paths (the agent's /status).
//
// Built on plain sockets, one thread per connection (at most max_connections at once; more
// are answered 503), every response closes its connection. It starts in microseconds and
// costs one idle thread, which is why the agent uses it rather than cpprestsdk's listener.
// GET and HEAD only; a request line and headers over 16 KiB get 431; a client silent for
// io_timeout is cut, so a stuck scraper cannot pin a thread.
//
// Thread-safety: every method is thread-safe. Handlers run on connection threads, possibly
// several at once, so they must be thread-safe too; the registry is rendered concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "common/status.h"
#include "metrics/registry.h"

namespace spawnpoint::metrics {

struct HttpRequest {
  std::string method;  // "GET" or "HEAD"
  std::string path;    // without the query, e.g. "/status"
  std::string query;   // after '?', undecoded; empty if none
  // The Authorization header's value as sent (e.g. "Bearer abc"); empty if none.
  std::string authorization;
  // The client connected from this host's loopback (127.0.0.0/8, ::1, ::ffff:127.0.0.0/104):
  // in a pod, the pod's own containers and `kubectl port-forward`.
  bool from_loopback = false;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

// "HOST:PORT", ":PORT" or "PORT" (every interface), "[V6ADDR]:PORT"; PORT 0 picks a free
// one. Returns {host, port}; host is "" for every interface.
StatusOr<std::pair<std::string, int>> ParseListenAddress(const std::string& address);

struct ServerOptions {
  std::string address = ":9400";
  const Registry* registry = nullptr;  // served at /metrics; nullptr: no /metrics
  int max_connections = 16;
  std::chrono::milliseconds io_timeout{10'000};
};

class MetricsServer {
 public:
  // Binds and listens before returning, so a scraper may connect as soon as this returns.
  // Errors: kInvalidArgument for a bad address, kUnavailable when it cannot be bound
  // (the message names the address and the reason, e.g. "Address already in use").
  static StatusOr<std::unique_ptr<MetricsServer>> Start(ServerOptions options);
  // Stop().
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Serves `path` (exact match, GET and HEAD) with `handler`; replaces an earlier one,
  // including the built-in /metrics, /healthz and /readyz.
  void Handle(const std::string& path, HttpHandler handler);
  // /readyz: 200 "ok" when ready, else 503 "not ready: <reason>". Starts not ready.
  void SetReady(bool ready, const std::string& reason = "");

  // The bound port (the chosen one when the address asked for 0).
  int port() const { return port_; }
  // "HOST:PORT" as bound, with "0.0.0.0" or "::" for every interface.
  const std::string& address() const { return bound_address_; }

  // Stops accepting, cuts open connections and joins every thread. Idempotent.
  void Stop();

 private:
  struct Connection {
    int fd = -1;
    std::thread thread;
    bool done = false;
  };

  MetricsServer(ServerOptions options, int listen_fd, int wake_fd, int port,
                std::string bound_address);
  void AcceptLoop();
  void Serve(Connection* conn);
  HttpResponse Dispatch(const HttpRequest& request);
  void ReapFinishedLocked();

  const ServerOptions options_;
  const int listen_fd_;
  const int wake_fd_;
  const int port_;
  const std::string bound_address_;

  std::mutex mu_;
  std::map<std::string, HttpHandler> handlers_;
  bool ready_ = false;
  std::string not_ready_reason_ = "starting";
  std::list<Connection> connections_;
  bool stopping_ = false;
  std::thread accept_thread_;
};

}  // namespace spawnpoint::metrics
