#include "examples/ddp-trainer/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

namespace spawnpoint::trainer {
namespace {

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list != nullptr) freeaddrinfo(list);
  }
};

int Resolve(const std::string& host, int port, int socktype, AddrInfo* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socktype;
  std::string service = std::to_string(port);
  return getaddrinfo(host.c_str(), service.c_str(), &hints, &out->list);
}

// One non-blocking connect attempt bounded by `budget`; a blocking connect to an
// unreachable address could outlive the caller's deadline by minutes.
bool TryConnect(const addrinfo* ai, std::chrono::milliseconds budget) {
  int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0) return false;
  bool ok = false;
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
    ok = true;
  } else if (errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, static_cast<int>(std::max<std::int64_t>(budget.count(), 1))) == 1) {
      int err = 0;
      socklen_t len = sizeof(err);
      ok = getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
  }
  close(fd);
  return ok;
}

}  // namespace

Status WaitForListener(const std::string& host, int port,
                       std::chrono::steady_clock::time_point deadline) {
  using namespace std::chrono;
  std::string last_error = "no attempt made";
  while (true) {
    auto now = steady_clock::now();
    auto budget = std::min(duration_cast<milliseconds>(deadline - now), milliseconds(1000));
    AddrInfo ai;
    // Resolved on every attempt: a Kubernetes service name may only appear in DNS after
    // the pods behind it have started.
    if (int rc = Resolve(host, port, SOCK_STREAM, &ai); rc != 0) {
      last_error = std::string("cannot resolve ") + host + ": " + gai_strerror(rc);
    } else {
      for (const addrinfo* a = ai.list; a != nullptr; a = a->ai_next) {
        if (TryConnect(a, budget)) return Status::Ok();
      }
      last_error = "connection to " + host + ":" + std::to_string(port) + " refused";
    }
    if (steady_clock::now() + milliseconds(5) >= deadline) {
      return Status(StatusCode::kDeadlineExceeded, "no rendezvous store at " + host + ":" +
                                                       std::to_string(port) +
                                                       " before the timeout (" + last_error + ")");
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
}

bool IsLoopback(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr a{};
  return inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

std::string LocalAddressFor(const std::string& host, int port) {
  AddrInfo ai;
  if (Resolve(host, port, SOCK_DGRAM, &ai) != 0) return "";
  for (const addrinfo* a = ai.list; a != nullptr; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    // connect() on a UDP socket only picks a route and a source address.
    bool ok = connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
              getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
    close(fd);
    if (!ok) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    const void* src =
        local.ss_family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
    if (inet_ntop(local.ss_family, src, buf, sizeof(buf)) != nullptr) return buf;
  }
  return "";
}

}  // namespace spawnpoint::trainer
