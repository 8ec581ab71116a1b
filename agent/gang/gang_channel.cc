#include "agent/gang/gang_channel.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

namespace spawnpoint::agent::gang {
namespace {

using nlohmann::json;

constexpr size_t kMaxLine = 1 << 20;  // a verdict carries a stack: generous, but bounded
constexpr auto kTick = std::chrono::milliseconds(50);

bool WriteAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

bool SendJson(int fd, const json& j) { return WriteAll(fd, j.dump() + "\n"); }

// A connect to a free port of the ephemeral range can meet itself (TCP simultaneous open,
// when the kernel picks that very port as the source): no coordinator is there.
bool SelfConnected(int fd) {
  sockaddr_storage local{}, peer{};
  socklen_t a = sizeof(local), b = sizeof(peer);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &a) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &b) != 0) {
    return false;
  }
  return a == b && std::memcmp(&local, &peer, a) == 0;
}

std::string PeerAddress(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(ss).sin_addr, host, sizeof(host));
  } else if (ss.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(ss).sin6_addr, host, sizeof(host));
  }
  return host;
}

// Splits complete lines off `buffer`; false when a line grows past kMaxLine.
bool TakeLines(std::string& buffer, std::vector<std::string>* lines) {
  size_t start = 0;
  for (size_t nl; (nl = buffer.find('\n', start)) != std::string::npos; start = nl + 1) {
    lines->push_back(buffer.substr(start, nl - start));
  }
  buffer.erase(0, start);
  return buffer.size() <= kMaxLine;
}

}  // namespace

bool SameToken(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0, y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

// ---- GangServer ----

StatusOr<std::unique_ptr<GangServer>> GangServer::Start(Options options) {
  std::unique_ptr<GangServer> s(new GangServer(std::move(options)));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(s->options_.port);
  if (int rc = ::getaddrinfo(s->options_.bind_host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return InvalidArgument("gang channel: bad address " + s->options_.bind_host + ": " +
                           gai_strerror(rc));
  }
  const int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool bound =
      fd >= 0 && ::bind(fd, res->ai_addr, res->ai_addrlen) == 0 && ::listen(fd, 64) == 0;
  const int err = errno;
  ::freeaddrinfo(res);
  if (!bound) {
    if (fd >= 0) ::close(fd);
    return Unavailable("gang channel: cannot listen on " + s->options_.bind_host + ":" + port +
                       ": " + std::strerror(err));
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  s->port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6&>(ss).sin6_port
                                            : reinterpret_cast<sockaddr_in&>(ss).sin_port);
  s->listen_fd_ = fd;
  if (::pipe2(s->wake_, O_CLOEXEC) != 0) return Internal("gang channel: pipe failed");
  s->thread_ = std::thread([raw = s.get()] { raw->Loop(); });
  return s;
}

GangServer::~GangServer() {
  if (wake_[1] >= 0) {
    const char c = 'x';
    (void)!::write(wake_[1], &c, 1);
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

void GangServer::Loop() {
  struct Conn {
    int node = -1;  // -1 until its hello
    std::string buffer, address;
  };
  std::map<int, Conn> conns;   // by fd
  std::map<int, int> node_fd;  // node -> its current connection
  GangCoordinator coordinator(options_.coordinator, options_.clock);
  auto say = [this](const std::string& line) {
    if (options_.say) options_.say(line);
  };
  auto dispatch = [&](const std::vector<Outgoing>& out) {
    for (const Outgoing& o : out) {
      if (o.node == kEveryNode) {
        if (o.body.value("causeCameFirst", false)) {
          say("the cause came first: " + RankFailure::FromJson(o.body["failure"]).Line());
        }
        if (options_.on_broadcast) options_.on_broadcast(o.body);
        for (const auto& [node, fd] : node_fd) SendJson(fd, o.body);
      } else if (auto it = node_fd.find(o.node); it != node_fd.end()) {
        SendJson(it->second, o.body);
      }
    }
  };
  auto drop = [&](int fd) {
    const int node = conns[fd].node;
    conns.erase(fd);
    ::close(fd);
    if (node >= 0 && node_fd.count(node) && node_fd[node] == fd) {
      node_fd.erase(node);
      dispatch(coordinator.Lost(node));
    }
  };
  auto handle = [&](int fd, const json& m) -> bool {  // false: drop the connection
    Conn& c = conns[fd];
    const std::string t = m.is_object() ? m.value("t", "") : "";
    if (c.node < 0) {
      const bool ok = t == "hello" && m.value("job", "") == options_.job &&
                      SameToken(m.value("token", ""), options_.token) && m.value("node", -1) >= 0 &&
                      m.value("node", -1) < options_.coordinator.nnodes;
      if (!ok) {
        say("gang channel: refused a connection from " + c.address +
            (t == "hello" && m.value("job", "") == options_.job
                 ? ": wrong token or node"
                 : ": not a hello of job " + options_.job));
        SendJson(fd, {{"t", "refused"}, {"reason", "not an agent of job " + options_.job}});
        return false;
      }
      c.node = m["node"].get<int>();
      if (auto old = node_fd.find(c.node); old != node_fd.end() && old->second != fd) {
        const int stale = old->second;  // the node reconnected: its old connection is dead
        node_fd.erase(old);
        conns.erase(stale);
        ::close(stale);
      }
      node_fd[c.node] = fd;
      dispatch(coordinator.Hello(c.node, m.value("attempt", 0)));
      return true;
    }
    const int attempt = m.value("attempt", -1);
    if (t == "ready") {
      dispatch(coordinator.Ready(c.node, attempt));
    } else if (t == "exit") {
      std::optional<RankFailure> failure;
      if (!m.value("ok", false) && !m.value("stopped", false)) {
        failure = RankFailure::FromJson(m.value("failure", json::object()));
      }
      dispatch(coordinator.Exit(c.node, attempt, failure, m.value("stopped", false)));
    }
    return true;
  };

  while (true) {
    std::vector<pollfd> fds = {{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    for (const auto& [fd, c] : conns) fds.push_back({fd, POLLIN, 0});
    const int n = ::poll(fds.data(), fds.size(), static_cast<int>(kTick.count()));
    if (n < 0 && errno != EINTR) break;
    if (fds[0].revents) break;  // stopping
    if (fds[1].revents & POLLIN) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC);
      if (fd >= 0) {
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        conns[fd] = Conn{.address = PeerAddress(ss)};
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      const int fd = fds[i].fd;
      char buf[65536];
      const ssize_t r = ::read(fd, buf, sizeof(buf));
      if (r <= 0) {
        if (r < 0 && errno == EINTR) continue;
        drop(fd);
        continue;
      }
      conns[fd].buffer.append(buf, static_cast<size_t>(r));
      std::vector<std::string> lines;
      bool keep = TakeLines(conns[fd].buffer, &lines);
      for (const std::string& line : lines) {
        if (!keep) break;
        try {
          keep = handle(fd, json::parse(line, nullptr, false));
        } catch (const json::exception&) {
          // A field of the wrong type (anyone can reach this port): the connection goes,
          // the coordinator stays.
          say("gang channel: dropped a connection from " + conns[fd].address +
              ": a message with a field of the wrong type");
          keep = false;
        }
      }
      if (!keep) drop(fd);
    }
    dispatch(coordinator.Tick());
  }
  // The listening socket first: a peer that sees its connection close must not reach a
  // backlog nobody accepts from.
  ::close(listen_fd_);
  listen_fd_ = -1;
  for (const auto& [fd, c] : conns) ::close(fd);
}

// ---- GangPeer ----

StatusOr<std::unique_ptr<GangPeer>> GangPeer::Connect(Options options, int attempt,
                                                      Clock::TimePoint deadline) {
  std::unique_ptr<GangPeer> p(new GangPeer(std::move(options)));
  p->attempt_ = attempt;
  SP_RETURN_IF_ERROR(p->Dial(deadline));
  p->reader_ = std::thread([raw = p.get()] { raw->ReadLoop(); });
  return p;
}

GangPeer::~GangPeer() {
  Leave();
  if (reader_.joinable()) reader_.join();
  if (fd_ >= 0) ::close(fd_);
}

Status GangPeer::Dial(Clock::TimePoint deadline) {
  const std::string where = options_.host + ":" + std::to_string(options_.port);
  std::string last_error = "not tried";
  while (!closing_) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const std::string port = std::to_string(options_.port);
    if (int rc = ::getaddrinfo(options_.host.c_str(), port.c_str(), &hints, &res); rc != 0) {
      last_error = gai_strerror(rc);  // the coordinator's pod may not be in DNS yet
    } else {
      for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 && !SelfConnected(fd)) {
          const int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          int attempt;
          {
            std::lock_guard<std::mutex> lock(mu_);
            attempt = attempt_;
          }
          if (SendJson(fd, {{"t", "hello"},
                            {"job", options_.job},
                            {"node", options_.node},
                            {"attempt", attempt},
                            {"token", options_.token}})) {
            std::lock_guard<std::mutex> lock(mu_);
            fd_ = fd;
            lost_ = false;
            ::freeaddrinfo(res);
            return Status::Ok();
          }
        }
        last_error = errno != 0 ? std::strerror(errno) : "connected to itself";
        ::close(fd);
      }
      ::freeaddrinfo(res);
    }
    if (options_.clock->Now() >= deadline) break;
    options_.clock->SleepFor(std::chrono::milliseconds(100));
  }
  return Unavailable("gang channel: cannot reach the coordinator at " + where + ": " + last_error);
}

void GangPeer::Push(json message) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string t = message.value("t", "");
  if (t == "stop" || t == "verdict") {
    stop_attempt_ = std::max(stop_attempt_, message.value("attempt", -1));
  }
  inbox_.push_back(std::move(message));
  cv_.notify_all();
}

void GangPeer::ReadLoop() {
  std::string buffer;
  while (!closing_) {
    char buf[65536];
    const ssize_t r = ::read(fd_, buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    std::vector<std::string> lines;
    if (r > 0) {
      buffer.append(buf, static_cast<size_t>(r));
      const bool ok = TakeLines(buffer, &lines);
      bool refused = false;
      for (const std::string& line : lines) {
        json m = json::parse(line, nullptr, false);
        if (!m.is_object() || !m.value("t", json()).is_string()) continue;
        if (m.contains("attempt") && !m["attempt"].is_number_integer()) continue;
        if (m["t"] == "refused") {
          // Out before anyone reads it: dialling again would be refused again, and fill
          // the coordinator's log with it.
          std::lock_guard<std::mutex> lock(mu_);
          lost_ = refused = true;
        }
        Push(std::move(m));
      }
      if (refused) break;
      if (ok) continue;
    }
    if (closing_) break;
    // The coordinator went away (its pod deleted or recreated): connect again.
    {
      std::lock_guard<std::mutex> lock(mu_);
      ::close(fd_);
      fd_ = -1;
      lost_ = true;
      // Ranks running when the coordinator went stop, even if it is back at once.
      if (running_ >= 0) stop_attempt_ = std::max(stop_attempt_, running_);
    }
    buffer.clear();
    Push({{"t", "lost"}});
    if (!Dial(Clock::TimePoint::max()).ok()) break;
    Push({{"t", "reconnected"}});
  }
}

void GangPeer::Leave() {
  closing_ = true;  // the reader ends at the shutdown, without dialling again
  std::lock_guard<std::mutex> lock(mu_);
  lost_ = true;
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

bool GangPeer::Send(const json& message) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0 || lost_) return false;
  return SendJson(fd_, message);
}

bool GangPeer::Connected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fd_ >= 0 && !lost_;
}

std::optional<json> GangPeer::Next(Clock::TimePoint deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  while (inbox_.empty()) {
    const auto now = options_.clock->Now();
    if (now >= deadline) return std::nullopt;
    // Real waits in slices: the clock may be simulated.
    cv_.wait_for(lock, std::min<Clock::Duration>(deadline - now, kTick));
  }
  json m = std::move(inbox_.front());
  inbox_.pop_front();
  return m;
}

bool GangPeer::StopSeen(int attempt) const {
  std::lock_guard<std::mutex> lock(mu_);
  return stop_attempt_ >= attempt;
}

void GangPeer::Started(int attempt) {
  std::lock_guard<std::mutex> lock(mu_);
  running_ = attempt;
  attempt_ = attempt;
}

void GangPeer::Ended() {
  std::lock_guard<std::mutex> lock(mu_);
  running_ = -1;
}

void GangPeer::SetAttempt(int attempt) {
  std::lock_guard<std::mutex> lock(mu_);
  attempt_ = attempt;
}

}  // namespace spawnpoint::agent::gang
