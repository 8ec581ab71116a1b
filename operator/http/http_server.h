// A minimal HTTP/1.1 server for the operator's probes and metrics (/healthz, /readyz,
// /metrics): GET and HEAD only, one connection at a time on one thread, each answered and
// closed (probes and scrapers send one request per connection). Slow or silent clients are
// cut after a short timeout so a probe can never wedge it. Start/Stop and port() are
// thread-safe; the handler runs on the server's thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/status.h"

namespace spawnpoint::op {

struct HttpReply {
  int code = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

using HttpHandler = std::function<HttpReply(const std::string& path)>;

// "host:port", ":port" (all interfaces) or "port"; port 0 picks a free one.
StatusOr<std::pair<std::string, int>> ParseListenAddress(const std::string& address);

class HttpServer {
 public:
  static StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& address,
                                                     HttpHandler handler);
  ~HttpServer();  // Stop()
  void Stop();
  int port() const { return port_; }

 private:
  HttpServer(int listen_fd, int wake_fd, int port, HttpHandler handler);
  void Loop();
  void Serve(int fd);

  const int listen_fd_;
  const int wake_fd_;
  const int port_;
  const HttpHandler handler_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace spawnpoint::op
