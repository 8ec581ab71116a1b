#include "operator/http/http_get.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace spawnpoint::op {
namespace {

using Deadline = std::chrono::steady_clock::time_point;

int MillisLeft(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(left.count());
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string DecodeChunked(const std::string& body) {
  std::string out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t eol = body.find("\r\n", pos);
    if (eol == std::string::npos) break;
    size_t size = std::strtoul(body.substr(pos, eol - pos).c_str(), nullptr, 16);
    if (size == 0) break;
    out += body.substr(eol + 2, size);
    pos = eol + 2 + size + 2;
  }
  return out;
}

}  // namespace

StatusOr<HttpGetResponse> HttpGet(const std::string& host, int port, const std::string& path,
                                  std::chrono::milliseconds timeout, const std::string& bearer) {
  const std::string where = "GET http://" + host + ":" + std::to_string(port) + path;
  const Deadline deadline = std::chrono::steady_clock::now() + timeout;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) {
      return Unavailable(where + ": cannot resolve " + host);
    }
    sa.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
    freeaddrinfo(res);
  }
  Fd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (fd.get() < 0) return Internal(where + ": socket: " + strerror(errno));
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    if (errno != EINPROGRESS) return Unavailable(where + ": " + strerror(errno));
    pollfd p{fd.get(), POLLOUT, 0};
    if (poll(&p, 1, MillisLeft(deadline)) <= 0) {
      return Status(StatusCode::kDeadlineExceeded, where + ": connect timed out");
    }
    int error = 0;
    socklen_t len = sizeof error;
    getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &len);
    if (error != 0) return Unavailable(where + ": " + strerror(error));
  }
  const std::string request =
      "GET " + path + " HTTP/1.1\r\nHost: " + host + ":" + std::to_string(port) +
      "\r\nAccept: application/json\r\nConnection: close\r\n" +
      (bearer.empty() ? "" : "Authorization: Bearer " + bearer + "\r\n") + "\r\n";
  size_t sent = 0;
  while (sent < request.size()) {
    pollfd p{fd.get(), POLLOUT, 0};
    if (poll(&p, 1, MillisLeft(deadline)) <= 0) {
      return Status(StatusCode::kDeadlineExceeded, where + ": send timed out");
    }
    ssize_t n = send(fd.get(), request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) return Unavailable(where + ": " + strerror(errno));
    sent += static_cast<size_t>(n);
  }
  std::string raw;
  while (true) {
    size_t head_end = raw.find("\r\n\r\n");
    if (head_end != std::string::npos) {
      // Stop early when Content-Length says the body is complete.
      std::string head = raw.substr(0, head_end);
      for (auto& ch : head) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      size_t cl = head.find("content-length:");
      if (cl != std::string::npos) {
        size_t length = std::strtoul(head.c_str() + cl + 15, nullptr, 10);
        if (raw.size() >= head_end + 4 + length) break;
      }
    }
    pollfd p{fd.get(), POLLIN, 0};
    int ready = poll(&p, 1, MillisLeft(deadline));
    if (ready <= 0) return Status(StatusCode::kDeadlineExceeded, where + ": read timed out");
    char buf[8192];
    ssize_t n = recv(fd.get(), buf, sizeof buf, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n < 0) return Unavailable(where + ": " + strerror(errno));
    if (n == 0) break;
    raw.append(buf, static_cast<size_t>(n));
    if (raw.size() > (8u << 20)) return Internal(where + ": response larger than 8 MiB");
  }
  size_t head_end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.", 0) != 0 || head_end == std::string::npos) {
    return Internal(where + ": not an HTTP response");
  }
  HttpGetResponse response;
  response.code = std::atoi(raw.c_str() + 9);
  std::string head = raw.substr(0, head_end);
  for (auto& ch : head) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  response.body = raw.substr(head_end + 4);
  size_t cl = head.find("content-length:");
  if (cl != std::string::npos) {
    size_t length = std::strtoul(head.c_str() + cl + 15, nullptr, 10);
    if (response.body.size() > length) response.body.resize(length);
  } else if (head.find("transfer-encoding: chunked") != std::string::npos) {
    response.body = DecodeChunked(response.body);
  }
  return response;
}

}  // namespace spawnpoint::op
