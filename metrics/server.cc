#include "metrics/server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <exception>
#include <system_error>
#include <vector>

namespace spawnpoint::metrics {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr size_t kMaxHeaderBytes = 16 * 1024;

const char* Reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Status";
  }
}

// Sends all of `data`; false when the peer is gone or the send timeout passed.
bool SendAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

void SendResponse(int fd, const HttpResponse& r, bool head) {
  std::string out = "HTTP/1.1 " + std::to_string(r.status) + " " + Reason(r.status) + "\r\n";
  out += "Content-Type: " + r.content_type + "\r\n";
  out += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  if (r.status == 405) out += "Allow: GET, HEAD\r\n";
  out += "Connection: close\r\n\r\n";
  // One send for small answers; a large /metrics body goes out without another copy.
  if (!head && r.body.size() <= 4096) {
    out += r.body;
    SendAll(fd, out.data(), out.size());
    return;
  }
  if (SendAll(fd, out.data(), out.size()) && !head) SendAll(fd, r.body.data(), r.body.size());
}

HttpResponse Text(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

std::string Errno(const char* what) { return std::string(what) + ": " + strerror(errno); }

// A listening socket bound to `addr`; -1 with *error and *err (the errno) set on failure.
int Listen(const sockaddr* addr, socklen_t len, bool dual_stack, std::string* error, int* err) {
  int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    *err = errno;
    *error = Errno("socket");
    return -1;
  }
  int one = 1;
  // A restarted agent must not wait out TIME_WAIT connections of its predecessor.
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (addr->sa_family == AF_INET6) {
    int v6only = dual_stack ? 0 : 1;
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only));
  }
  if (bind(fd, addr, len) != 0) {
    *err = errno;
    *error = Errno("bind");
    close(fd);
    return -1;
  }
  if (listen(fd, 64) != 0) {
    *err = errno;
    *error = Errno("listen");
    close(fd);
    return -1;
  }
  return fd;
}

int BoundPort(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return -1;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
}

std::string HostText(const sockaddr* addr) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (addr->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr, buf, sizeof(buf));
    return buf;
  }
  inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr, buf, sizeof(buf));
  return std::string("[") + buf + "]";
}

// The value of header `name` (lower case) in `head` (the request line and headers), without
// surrounding blanks; "" if absent. Header names are matched without regard to case.
std::string HeaderValue(const std::string& head, const std::string& name) {
  size_t at = head.find('\n');
  while (at != std::string::npos) {
    const size_t start = at + 1;
    at = head.find('\n', start);
    std::string line = head.substr(start, at == std::string::npos ? at : at - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t colon = line.find(':');
    if (colon != name.size()) continue;
    bool same = true;
    for (size_t i = 0; i < colon && same; ++i) {
      same = static_cast<char>(tolower(static_cast<unsigned char>(line[i]))) == name[i];
    }
    if (!same) continue;
    const size_t first = line.find_first_not_of(" \t", colon + 1);
    if (first == std::string::npos) return "";
    return line.substr(first, line.find_last_not_of(" \t") + 1 - first);
  }
  return "";
}

bool PeerIsLoopback(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return false;
  if (ss.ss_family == AF_INET) {
    return (ntohl(reinterpret_cast<sockaddr_in*>(&ss)->sin_addr.s_addr) >> 24) == 127;
  }
  if (ss.ss_family != AF_INET6) return false;
  const in6_addr& a = reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr;
  if (IN6_IS_ADDR_LOOPBACK(&a)) return true;
  return IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127;
}

}  // namespace

StatusOr<std::pair<std::string, int>> ParseListenAddress(const std::string& address) {
  std::string host, port;
  if (!address.empty() && address[0] == '[') {
    const size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return InvalidArgument("listen address \"" + address + "\" is not [V6ADDR]:PORT");
    }
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
  } else if (const size_t colon = address.rfind(':'); colon != std::string::npos) {
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.find(':') != std::string::npos) {
      return InvalidArgument("listen address \"" + address +
                             "\": write an IPv6 address in brackets, [V6ADDR]:PORT");
    }
  } else {
    port = address;
  }
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) > 65535) {
    return InvalidArgument("listen address \"" + address +
                           "\" needs a port 0-65535 (HOST:PORT, :PORT or PORT)");
  }
  return std::make_pair(host, std::stoi(port));
}

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(ServerOptions options) {
  SP_ASSIGN_OR_RETURN(auto hp, ParseListenAddress(options.address));
  const auto& [host, port] = hp;
  std::string error;
  int err = 0;
  int fd = -1;
  std::string bound_host;
  if (host.empty()) {
    // Every interface: IPv6 dual-stack where the kernel has IPv6, else IPv4 only.
    sockaddr_in6 a6{};
    a6.sin6_family = AF_INET6;
    a6.sin6_addr = in6addr_any;
    a6.sin6_port = htons(static_cast<uint16_t>(port));
    fd = Listen(reinterpret_cast<sockaddr*>(&a6), sizeof(a6), true, &error, &err);
    bound_host = "[::]";
    if (fd < 0 && (err == EAFNOSUPPORT || err == EADDRNOTAVAIL)) {
      sockaddr_in a4{};
      a4.sin_family = AF_INET;
      a4.sin_addr.s_addr = htonl(INADDR_ANY);
      a4.sin_port = htons(static_cast<uint16_t>(port));
      fd = Listen(reinterpret_cast<sockaddr*>(&a4), sizeof(a4), false, &error, &err);
      bound_host = "0.0.0.0";
    }
  } else {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    const std::string port_text = std::to_string(port);
    if (int rc = getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res); rc != 0) {
      return Status(StatusCode::kUnavailable,
                    "cannot listen on " + options.address + ": " + gai_strerror(rc));
    }
    for (addrinfo* ai = res; ai != nullptr && fd < 0; ai = ai->ai_next) {
      fd = Listen(ai->ai_addr, ai->ai_addrlen, false, &error, &err);
      if (fd >= 0) bound_host = HostText(ai->ai_addr);
    }
    freeaddrinfo(res);
  }
  if (fd < 0) {
    return Status(StatusCode::kUnavailable, "cannot listen on " + options.address + ": " + error);
  }
  int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    close(fd);
    return Internal(Errno("eventfd"));
  }
  const int bound_port = BoundPort(fd);
  std::unique_ptr<MetricsServer> server(new MetricsServer(
      std::move(options), fd, wake, bound_port, bound_host + ":" + std::to_string(bound_port)));
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

MetricsServer::MetricsServer(ServerOptions options, int listen_fd, int wake_fd, int port,
                             std::string bound_address)
    : options_(std::move(options)),
      listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      port_(port),
      bound_address_(std::move(bound_address)) {
  if (options_.registry != nullptr) {
    const Registry* registry = options_.registry;
    handlers_["/metrics"] = [registry](const HttpRequest&) {
      HttpResponse r;
      r.content_type = kContentType;
      r.body = registry->Render();
      return r;
    };
  }
  handlers_["/healthz"] = [](const HttpRequest&) { return Text(200, "ok\n"); };
  handlers_["/readyz"] = [this](const HttpRequest&) {
    std::lock_guard<std::mutex> lock(mu_);
    if (ready_) return Text(200, "ok\n");
    return Text(503, "not ready: " + not_ready_reason_ + "\n");
  };
}

MetricsServer::~MetricsServer() { Stop(); }

void MetricsServer::Handle(const std::string& path, HttpHandler handler) {
  std::lock_guard<std::mutex> lock(mu_);
  handlers_[path] = std::move(handler);
}

void MetricsServer::SetReady(bool ready, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ready_ = ready;
  not_ready_reason_ = reason.empty() ? "not ready" : reason;
}

void MetricsServer::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    for (auto& c : connections_) {
      if (c.fd >= 0) shutdown(c.fd, SHUT_RDWR);  // wakes a thread blocked in recv or send
    }
  }
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  if (accept_thread_.joinable()) accept_thread_.join();
  std::list<Connection> conns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    conns.swap(connections_);
  }
  for (auto& c : conns) {
    if (c.thread.joinable()) c.thread.join();
  }
  close(listen_fd_);
  close(wake_fd_);
}

void MetricsServer::ReapFinishedLocked() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (it->done) {
      // The thread set done as its last step under mu_, so it is about to return.
      it->thread.join();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

void MetricsServer::AcceptLoop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    int n = poll(fds, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;  // Stop()
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;  // EAGAIN, ECONNABORTED, EMFILE: try again on the next event
    std::lock_guard<std::mutex> lock(mu_);
    ReapFinishedLocked();
    if (stopping_) {
      close(fd);
      return;
    }
    if (static_cast<int>(connections_.size()) >= options_.max_connections) {
      // Answer at once rather than queueing: the client may retry, a probe fails visibly.
      // The request is read first (briefly), because closing a socket with unread data
      // resets the connection and the client would see ECONNRESET instead of the 503.
      pollfd p{fd, POLLIN, 0};
      poll(&p, 1, 50);
      char sink[4096];
      for (int i = 0; i < 4 && recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
      }
      timeval tv{0, 100'000};
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
      SendResponse(fd, Text(503, "too many connections\n"), false);
      shutdown(fd, SHUT_WR);
      close(fd);
      continue;
    }
    connections_.emplace_back();
    Connection* conn = &connections_.back();
    conn->fd = fd;
    try {
      conn->thread = std::thread([this, conn] { Serve(conn); });
    } catch (const std::system_error&) {
      // Out of threads: drop this connection rather than the whole server.
      connections_.pop_back();
      close(fd);
    }
  }
}

void MetricsServer::Serve(Connection* conn) {
  int fd;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fd = conn->fd;
  }
  const auto timeout = options_.io_timeout;
  timeval tv{static_cast<time_t>(timeout.count() / 1000),
             static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));

  // Read the request line and headers; a body (GET and HEAD have none) is never read.
  std::string data;
  const auto deadline = SteadyClock::now() + timeout;
  size_t header_end = std::string::npos;
  int status = 0;
  while (header_end == std::string::npos) {
    // The per-recv timeout alone would let a client trickle a byte at a time forever.
    if (SteadyClock::now() >= deadline) {
      status = 408;
      break;
    }
    char buf[4096];
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // Closed or shut down: nobody to answer. Timed out part-way through a request: say so.
      status = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && !data.empty() ? 408 : -1;
      break;
    }
    data.append(buf, static_cast<size_t>(n));
    header_end = data.find("\r\n\r\n");
    if (header_end == std::string::npos) header_end = data.find("\n\n");
    if ((header_end == std::string::npos ? data.size() : header_end) > kMaxHeaderBytes) {
      status = 431;
      break;
    }
  }

  if (status > 0) {
    SendResponse(fd, Text(status, std::string(Reason(status)) + "\n"), false);
  } else if (status == 0) {
    HttpRequest req;
    const size_t eol = data.find_first_of("\r\n");
    const std::string line = data.substr(0, eol);
    const size_t sp1 = line.find(' ');
    const size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
    HttpResponse response;
    if (sp1 == std::string::npos || sp2 == std::string::npos ||
        line.compare(sp2 + 1, 5, "HTTP/") != 0) {
      response = Text(400, "bad request line\n");
    } else {
      req.method = line.substr(0, sp1);
      std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
      // An absolute-form target (a proxy's "http://host/path") is reduced to its path.
      if (target.rfind("http://", 0) == 0) {
        const size_t slash = target.find('/', 7);
        target = slash == std::string::npos ? "/" : target.substr(slash);
      }
      const size_t q = target.find('?');
      req.path = target.substr(0, q);
      if (q != std::string::npos) req.query = target.substr(q + 1);
      req.authorization = HeaderValue(data.substr(0, header_end), "authorization");
      req.from_loopback = PeerIsLoopback(fd);
      if (req.method != "GET" && req.method != "HEAD") {
        response = Text(405, "only GET and HEAD\n");
      } else {
        response = Dispatch(req);
      }
    }
    SendResponse(fd, response, req.method == "HEAD");
  }

  std::lock_guard<std::mutex> lock(mu_);
  close(fd);
  conn->fd = -1;
  conn->done = true;
}

HttpResponse MetricsServer::Dispatch(const HttpRequest& request) {
  HttpHandler handler;
  std::vector<std::string> paths;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = handlers_.find(request.path);
    if (it != handlers_.end()) {
      handler = it->second;
    } else {
      for (const auto& [path, h] : handlers_) paths.push_back(path);
    }
  }
  if (!handler) {
    if (request.path == "/") {
      std::string body = "spawnpoint metrics endpoint:\n";
      for (const auto& p : paths) body += "  " + p + "\n";
      return Text(200, body);
    }
    return Text(404, "not found: " + request.path + "\n");
  }
  try {
    return handler(request);
  } catch (const std::exception& e) {
    return Text(500, std::string("internal error: ") + e.what() + "\n");
  } catch (...) {
    return Text(500, "internal error\n");
  }
}

}  // namespace spawnpoint::metrics
