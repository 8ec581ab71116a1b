#include "operator/http/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace spawnpoint::op {
namespace {

constexpr int kClientTimeoutMs = 2000;

const char* ReasonPhrase(int code) {
  switch (code) {
    case 200:
      return "OK";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 400:
      return "Bad Request";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

void WriteAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

}  // namespace

StatusOr<std::pair<std::string, int>> ParseListenAddress(const std::string& address) {
  std::string host, port_text = address;
  size_t colon = address.rfind(':');
  if (colon != std::string::npos) {
    host = address.substr(0, colon);
    port_text = address.substr(colon + 1);
  }
  if (host.empty()) host = "0.0.0.0";
  if (host == "localhost") host = "127.0.0.1";
  int port = -1;
  try {
    size_t used = 0;
    port = std::stoi(port_text, &used);
    if (used != port_text.size()) port = -1;
  } catch (...) {
  }
  if (port < 0 || port > 65535) {
    return InvalidArgument("\"" + address + "\": expected HOST:PORT or :PORT");
  }
  in_addr probe{};
  if (inet_pton(AF_INET, host.c_str(), &probe) != 1) {
    return InvalidArgument("\"" + address + "\": the host must be an IPv4 address");
  }
  return std::make_pair(host, port);
}

StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& address,
                                                        HttpHandler handler) {
  SP_ASSIGN_OR_RETURN(auto host_port, ParseListenAddress(address));
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Internal(std::string("socket: ") + strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(host_port.second));
  inet_pton(AF_INET, host_port.first.c_str(), &sa.sin_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || listen(fd, 64) != 0) {
    std::string error = strerror(errno);
    close(fd);
    return Unavailable("cannot listen on " + address + ": " + error);
  }
  socklen_t len = sizeof sa;
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  return std::unique_ptr<HttpServer>(
      new HttpServer(fd, wake, ntohs(sa.sin_port), std::move(handler)));
}

HttpServer::HttpServer(int listen_fd, int wake_fd, int port, HttpHandler handler)
    : listen_fd_(listen_fd), wake_fd_(wake_fd), port_(port), handler_(std::move(handler)) {
  thread_ = std::thread([this] { Loop(); });
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Stop() {
  if (stopping_.exchange(true)) return;
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
  close(wake_fd_);
}

void HttpServer::Loop() {
  while (!stopping_) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    int n = poll(fds, 2, -1);
    if (n < 0 && errno == EINTR) continue;
    if (stopping_ || (fds[1].revents & POLLIN)) return;
    if (!(fds[0].revents & POLLIN)) continue;
    int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    Serve(client);
    close(client);
  }
}

void HttpServer::Serve(int fd) {
  std::string request;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kClientTimeoutMs);
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < 16384) {
    int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                    deadline - std::chrono::steady_clock::now())
                                    .count());
    if (left <= 0) return;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, left) <= 0) return;
    char buf[4096];
    ssize_t got = recv(fd, buf, sizeof buf, 0);
    if (got <= 0) return;
    request.append(buf, static_cast<size_t>(got));
  }
  size_t sp1 = request.find(' ');
  size_t sp2 = sp1 == std::string::npos ? sp1 : request.find(' ', sp1 + 1);
  HttpReply reply;
  std::string method;
  if (sp2 == std::string::npos) {
    reply = {400, "text/plain; charset=utf-8", "bad request\n"};
  } else {
    method = request.substr(0, sp1);
    std::string target = request.substr(sp1 + 1, sp2 - sp1 - 1);
    std::string path = target.substr(0, target.find('?'));
    if (method != "GET" && method != "HEAD") {
      reply = {405, "text/plain; charset=utf-8", "only GET\n"};
    } else {
      reply = handler_(path);
    }
  }
  std::string head = "HTTP/1.1 " + std::to_string(reply.code) + " " + ReasonPhrase(reply.code) +
                     "\r\nContent-Type: " + reply.content_type +
                     "\r\nContent-Length: " + std::to_string(reply.body.size()) +
                     "\r\nConnection: close\r\n\r\n";
  WriteAll(fd, method == "HEAD" ? head : head + reply.body);
}

}  // namespace spawnpoint::op
