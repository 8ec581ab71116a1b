#include "tests/support/http_call.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

namespace spawnpoint::testing {
namespace {

using Clock = std::chrono::steady_clock;

std::string LowerCase(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

std::string BuildRequest(const std::string& method, const std::string& target,
                         const std::string& body, const Headers& headers, bool close) {
  std::string req = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  for (const auto& [k, v] : headers) req += k + ": " + v + "\r\n";
  if (!body.empty() || method == "POST" || method == "PUT" || method == "PATCH") {
    req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  }
  if (close) req += "Connection: close\r\n";
  req += "\r\n" + body;
  return req;
}

// Parses "HTTP/1.1 200 OK\r\nName: v\r\n..." (without the blank line).
int ParseHead(const std::string& head, std::map<std::string, std::string>* headers) {
  size_t sp = head.find(' ');
  if (sp == std::string::npos) return 0;
  int code = std::atoi(head.c_str() + sp + 1);
  size_t pos = head.find("\r\n");
  while (pos != std::string::npos && pos + 2 < head.size()) {
    size_t end = head.find("\r\n", pos + 2);
    std::string line =
        head.substr(pos + 2, end == std::string::npos ? std::string::npos : end - pos - 2);
    size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = LowerCase(line.substr(0, colon));
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      auto& slot = (*headers)[name];
      slot = slot.empty() ? value : slot + "\n" + value;
    }
    pos = end;
  }
  return code;
}

// Decodes a complete chunked body; false when it is incomplete.
bool Dechunk(const std::string& raw, std::string* out) {
  size_t pos = 0;
  while (true) {
    size_t eol = raw.find("\r\n", pos);
    if (eol == std::string::npos) return false;
    size_t n = std::strtoul(raw.c_str() + pos, nullptr, 16);
    if (n == 0) return true;
    if (eol + 2 + n + 2 > raw.size()) return false;
    out->append(raw, eol + 2, n);
    pos = eol + 2 + n + 2;
  }
}

}  // namespace

nlohmann::json HttpResponse::Json() const {
  auto j = nlohmann::json::parse(body, nullptr, false);
  return j.is_discarded() ? nlohmann::json() : j;
}

HttpResponse HttpCall(int port, const std::string& method, const std::string& target,
                      const std::string& body, const Headers& headers,
                      std::chrono::milliseconds timeout) {
  HttpResponse r;
  int fd = Connect(port);
  if (fd < 0) {
    r.error = "connect to 127.0.0.1:" + std::to_string(port) + " failed: " + strerror(errno);
    return r;
  }
  if (!SendAll(fd, BuildRequest(method, target, body, headers, true))) {
    close(fd);
    r.error = "send failed";
    return r;
  }
  std::string raw;
  auto deadline = Clock::now() + timeout;
  char buf[16384];
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      r.error = "timed out";
      break;
    }
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) {
    if (r.error.empty()) r.error = "no response head";
    return r;
  }
  r.code = ParseHead(raw.substr(0, head_end), &r.headers);
  std::string rest = raw.substr(head_end + 4);
  if (LowerCase(r.headers["transfer-encoding"]).find("chunked") != std::string::npos) {
    if (!Dechunk(rest, &r.body)) r.error = "incomplete chunked body";
  } else {
    r.body = rest;
  }
  return r;
}

}  // namespace spawnpoint::testing
