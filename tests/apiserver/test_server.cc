#include "tests/apiserver/test_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "tests/apiserver/util.h"

namespace spawnpoint::kubetest::testing {
namespace {

using Clock = std::chrono::steady_clock;

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
      std::string name = Lower(line.substr(0, colon));
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
  if (Lower(r.headers["transfer-encoding"]).find("chunked") != std::string::npos) {
    if (!Dechunk(rest, &r.body)) r.error = "incomplete chunked body";
  } else {
    r.body = rest;
  }
  return r;
}

HttpStream::HttpStream(int port, const std::string& target, const Headers& headers) {
  fd_ = Connect(port);
  if (fd_ >= 0 && !SendAll(fd_, BuildRequest("GET", target, "", headers, true))) Close();
}

HttpStream::~HttpStream() { Close(); }

void HttpStream::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

bool HttpStream::Pump(Clock::time_point deadline) {
  if (fd_ < 0) return false;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  pollfd p{fd_, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count()))) <= 0) return false;
  char buf[16384];
  ssize_t n = recv(fd_, buf, sizeof(buf), 0);
  if (n <= 0) {
    if (!ended_cleanly_) cut_ = true;
    Close();
    return false;
  }
  raw_.append(buf, static_cast<size_t>(n));
  Decode();
  return true;
}

void HttpStream::Decode() {
  if (!head_done_) {
    size_t head_end = raw_.find("\r\n\r\n");
    if (head_end == std::string::npos) return;
    std::map<std::string, std::string> headers;
    code_ = ParseHead(raw_.substr(0, head_end), &headers);
    raw_.erase(0, head_end + 4);
    head_done_ = true;
  }
  while (!ended_cleanly_) {
    size_t eol = raw_.find("\r\n");
    if (eol == std::string::npos) break;
    size_t n = std::strtoul(raw_.c_str(), nullptr, 16);
    if (n == 0) {
      ended_cleanly_ = true;
      break;
    }
    if (raw_.size() < eol + 2 + n + 2) {
      // Hand out what has arrived of the chunk so a cut mid-chunk leaves a partial line.
      break;
    }
    line_buf_.append(raw_, eol + 2, n);
    raw_.erase(0, eol + 2 + n + 2);
  }
  size_t nl;
  while ((nl = line_buf_.find('\n')) != std::string::npos) {
    lines_.push_back(line_buf_.substr(0, nl));
    line_buf_.erase(0, nl + 1);
  }
  if (cut_ && !raw_.empty()) {
    // A cut inside a chunk: keep the bytes that did arrive as an unfinished line.
    size_t eol = raw_.find("\r\n");
    if (eol != std::string::npos) line_buf_ += raw_.substr(eol + 2);
    raw_.clear();
  }
}

int HttpStream::WaitHead(std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (!head_done_ && Clock::now() < deadline && fd_ >= 0) Pump(deadline);
  return code_;
}

std::optional<std::string> HttpStream::NextLine(std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (lines_.empty()) {
    if (fd_ < 0 || ended_cleanly_ || Clock::now() >= deadline) {
      if (cut_) Decode();
      break;
    }
    Pump(deadline);
  }
  if (lines_.empty()) return std::nullopt;
  std::string line = lines_.front();
  lines_.erase(lines_.begin());
  return line;
}

KubeTestServer::KubeTestServer(std::vector<std::string> extra_args, std::string binary) {
  kubeconfig_ = dir_.File("kubeconfig");
  std::vector<std::string> argv = {binary, "--port", "0", "--kubeconfig-out", kubeconfig_};
  for (auto& a : extra_args) argv.push_back(a);
  process_ = std::make_unique<spawnpoint::testing::TestProcess>(argv);
  std::string first;
  bool got = spawnpoint::testing::WaitUntil(
      [&] {
        std::string out = process_->Stdout();
        size_t nl = out.find('\n');
        if (nl == std::string::npos) return !process_->Running();
        first = out.substr(0, nl);
        return true;
      },
      std::chrono::seconds(10));
  const std::string prefix = "listening on http://127.0.0.1:";
  if (got && first.rfind(prefix, 0) == 0) {
    port_ = std::atoi(first.c_str() + prefix.size());
  } else {
    error_ = "kube-test-server did not start: first line \"" + first +
             "\", stderr: " + process_->Stderr();
  }
}

KubeTestServer::~KubeTestServer() {
  if (process_ && exit_code_ == -2) Stop(std::chrono::seconds(5));
}

HttpResponse KubeTestServer::Call(const std::string& method, const std::string& target,
                                  const std::string& body, const std::string& content_type,
                                  const std::string& token) {
  Headers h;
  if (!body.empty()) h.push_back({"Content-Type", content_type});
  h.push_back({"Accept", "application/json"});
  if (!token.empty()) h.push_back({"Authorization", "Bearer " + token});
  return HttpCall(port_, method, target, body, h);
}

namespace {

StatusOr<nlohmann::json> TokenResponse(KubeTestServer& server, const std::string& ns,
                                       const std::string& name) {
  HttpResponse r = server.Call("POST", "/testing/serviceaccount-token",
                               nlohmann::json{{"namespace", ns}, {"name", name}}.dump());
  nlohmann::json j = r.Json();
  if (r.code == 404) return NotFound("no ServiceAccount " + ns + "/" + name);
  if (r.code != 200 || !j.is_object() || !j.contains("token")) {
    return Internal("POST /testing/serviceaccount-token: HTTP " + std::to_string(r.code) + " " +
                    r.error + " " + r.body);
  }
  return j;
}

}  // namespace

StatusOr<std::string> KubeTestServer::ServiceAccountToken(const std::string& ns,
                                                          const std::string& name) {
  SP_ASSIGN_OR_RETURN(nlohmann::json j, TokenResponse(*this, ns, name));
  return j["token"].get<std::string>();
}

Status KubeTestServer::WriteServiceAccountKubeconfig(const std::string& ns, const std::string& name,
                                                     const std::string& path) {
  SP_ASSIGN_OR_RETURN(nlohmann::json j, TokenResponse(*this, ns, name));
  spawnpoint::testing::WriteFile(path, j["kubeconfig"].get<std::string>());
  return Status::Ok();
}

HttpResponse KubeTestServer::AddFaults(const std::string& spec) {
  return Call("POST", "/testing/faults", spec);
}

void KubeTestServer::ClearFaults() { Call("DELETE", "/testing/faults"); }

nlohmann::json KubeTestServer::Requests(uint64_t since) {
  return Call("GET", "/testing/requests?since=" + std::to_string(since)).Json();
}

void KubeTestServer::Compact() { Call("POST", "/testing/compact"); }

int KubeTestServer::Stop(std::chrono::milliseconds timeout) {
  if (!process_ || exit_code_ != -2) return exit_code_;
  kill(process_->pid(), SIGTERM);
  exit_code_ = process_->Wait(timeout);
  return exit_code_;
}

}  // namespace spawnpoint::kubetest::testing
