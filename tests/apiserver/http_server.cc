#include "tests/apiserver/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "tests/apiserver/util.h"

namespace spawnpoint::kubetest {
namespace {

constexpr size_t kMaxHeaderBytes = 1 << 20;
constexpr size_t kMaxBodyBytes = 256u << 20;

std::string Trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Buffered reads from a connection; returns false on EOF or error.
class Reader {
 public:
  explicit Reader(int fd) : fd_(fd) {}

  bool Fill() {
    char buf[16384];
    while (true) {
      ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n > 0) {
        data_.append(buf, static_cast<size_t>(n));
        return true;
      }
      if (n < 0 && errno == EINTR) continue;
      return false;
    }
  }

  // Reads up to and including `delim`; returns the text before it.
  bool ReadUntil(const std::string& delim, std::string* out, size_t limit) {
    while (true) {
      size_t pos = data_.find(delim);
      if (pos != std::string::npos) {
        *out = data_.substr(0, pos);
        data_.erase(0, pos + delim.size());
        return true;
      }
      if (data_.size() > limit || !Fill()) return false;
    }
  }

  bool ReadExactly(size_t n, std::string* out) {
    while (data_.size() < n) {
      if (!Fill()) return false;
    }
    out->append(data_, 0, n);
    data_.erase(0, n);
    return true;
  }

 private:
  int fd_;
  std::string data_;
};

bool ParseQuery(const std::string& raw, std::map<std::string, std::string>* out) {
  size_t i = 0;
  while (i <= raw.size()) {
    size_t amp = raw.find('&', i);
    if (amp == std::string::npos) amp = raw.size();
    std::string part = raw.substr(i, amp - i);
    if (!part.empty()) {
      size_t eq = part.find('=');
      std::string k = PercentDecode(part.substr(0, eq), true);
      std::string v = eq == std::string::npos ? "" : PercentDecode(part.substr(eq + 1), true);
      (*out)[k] = v;
    }
    i = amp + 1;
  }
  return true;
}

// Reads one request; false when the connection closed or the request is malformed.
bool ReadRequest(int fd, Reader& reader, HttpRequest* req) {
  std::string head;
  if (!reader.ReadUntil("\r\n\r\n", &head, kMaxHeaderBytes)) return false;
  size_t line_end = head.find("\r\n");
  std::string request_line = head.substr(0, line_end);
  size_t sp1 = request_line.find(' ');
  size_t sp2 = request_line.rfind(' ');
  if (sp1 == std::string::npos || sp2 == sp1) return false;
  req->method = request_line.substr(0, sp1);
  req->target = request_line.substr(sp1 + 1, sp2 - sp1 - 1);
  size_t q = req->target.find('?');
  req->path = PercentDecode(req->target.substr(0, q), false);
  req->raw_query = q == std::string::npos ? "" : req->target.substr(q + 1);
  ParseQuery(req->raw_query, &req->query);
  size_t pos = line_end == std::string::npos ? head.size() : line_end + 2;
  while (pos < head.size()) {
    size_t end = head.find("\r\n", pos);
    if (end == std::string::npos) end = head.size();
    std::string line = head.substr(pos, end - pos);
    size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = Lower(line.substr(0, colon));
      std::string value = Trim(std::string_view(line).substr(colon + 1));
      auto it = req->headers.find(name);
      if (it != req->headers.end() && name == "accept") {
        it->second += "," + value;
      } else if (it != req->headers.end() && name == "impersonate-group") {
        it->second += "\n" + value;
      } else {
        req->headers[name] = value;
      }
    }
    pos = end + 2;
  }
  if (Lower(req->Header("expect")) == "100-continue") {
    static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
    if (send(fd, kContinue, sizeof(kContinue) - 1, MSG_NOSIGNAL) < 0) return false;
  }
  if (Lower(req->Header("transfer-encoding")).find("chunked") != std::string::npos) {
    while (true) {
      std::string size_line;
      if (!reader.ReadUntil("\r\n", &size_line, 1024)) return false;
      size_t n = std::strtoul(size_line.c_str(), nullptr, 16);
      if (n == 0) {
        std::string trailer;
        do {
          if (!reader.ReadUntil("\r\n", &trailer, kMaxHeaderBytes)) return false;
        } while (!trailer.empty());
        break;
      }
      if (req->body.size() + n > kMaxBodyBytes) return false;
      if (!reader.ReadExactly(n, &req->body)) return false;
      std::string crlf;
      if (!reader.ReadUntil("\r\n", &crlf, 2)) return false;
    }
  } else if (!req->Header("content-length").empty()) {
    size_t n = std::strtoul(req->Header("content-length").c_str(), nullptr, 10);
    if (n > kMaxBodyBytes) return false;
    if (!reader.ReadExactly(n, &req->body)) return false;
  }
  return true;
}

}  // namespace

std::string HttpRequest::Header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  return it == headers.end() ? "" : it->second;
}

std::string HttpRequest::Query(const std::string& name) const {
  auto it = query.find(name);
  return it == query.end() ? "" : it->second;
}

const char* ReasonPhrase(int code) {
  switch (code) {
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 202:
      return "Accepted";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 406:
      return "Not Acceptable";
    case 409:
      return "Conflict";
    case 410:
      return "Gone";
    case 415:
      return "Unsupported Media Type";
    case 422:
      return "Unprocessable Entity";
    case 429:
      return "Too Many Requests";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "Status";
  }
}

std::string PercentDecode(std::string_view s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '%' && i + 2 < s.size() && HexValue(s[i + 1]) >= 0 && HexValue(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(HexValue(s[i + 1]) * 16 + HexValue(s[i + 2])));
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string PercentEncode(std::string_view s) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

bool HttpResponder::WriteAll(std::string_view data) {
  if (aborted_) return false;
  while (!data.empty()) {
    ssize_t n = send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      aborted_ = true;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::string HttpResponder::Head(int code, const std::string& content_type, const HeaderList& extra,
                                const std::string& framing) {
  std::string head = "HTTP/1.1 " + std::to_string(code) + " " + ReasonPhrase(code) + "\r\n";
  if (!content_type.empty()) head += "Content-Type: " + content_type + "\r\n";
  head += "Cache-Control: no-cache, private\r\n";
  for (const auto& [k, v] : extra) head += k + ": " + v + "\r\n";
  head += framing;
  if (!keep_alive_) head += "Connection: close\r\n";
  head += "\r\n";
  return head;
}

bool HttpResponder::Send(int code, const std::string& content_type, const std::string& body,
                         const HeaderList& extra_headers) {
  started_ = true;
  code_ = code;
  std::string msg = Head(code, content_type, extra_headers,
                         "Content-Length: " + std::to_string(body.size()) + "\r\n");
  msg += body;
  bool ok = WriteAll(msg);
  finished_ = true;
  return ok;
}

bool HttpResponder::BeginStream(int code, const std::string& content_type,
                                const HeaderList& extra_headers) {
  started_ = true;
  code_ = code;
  return WriteAll(Head(code, content_type, extra_headers, "Transfer-Encoding: chunked\r\n"));
}

bool HttpResponder::WriteChunk(std::string_view data) {
  if (data.empty()) return !aborted_;
  char size[32];
  snprintf(size, sizeof(size), "%zx\r\n", data.size());
  std::string msg(size);
  msg.append(data);
  msg += "\r\n";
  return WriteAll(msg);
}

void HttpResponder::WritePartialChunkAndAbort(std::string_view data, size_t n) {
  char size[32];
  snprintf(size, sizeof(size), "%zx\r\n", data.size());
  std::string msg(size);
  msg.append(data.substr(0, std::min(n, data.size())));
  WriteAll(msg);
  Abort();
}

bool HttpResponder::EndStream() {
  bool ok = WriteAll("0\r\n\r\n");
  finished_ = true;
  return ok;
}

void HttpResponder::Abort() {
  if (!aborted_) shutdown(fd_, SHUT_RDWR);
  aborted_ = true;
  keep_alive_ = false;
}

bool HttpResponder::PeerGone() {
  if (aborted_) return true;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  int r = poll(&p, 1, 0);
  if (r <= 0) return false;
  // Data from a client in the middle of a streamed response is not expected; only a hang-up
  // or an error counts as gone.
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

HttpServer::~HttpServer() { Stop(); }

StatusOr<int> HttpServer::Start(int port) {
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return Internal(std::string("socket: ") + strerror(errno));
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Unavailable("cannot bind 127.0.0.1:" + std::to_string(port) + ": " + strerror(errno));
  }
  if (listen(listen_fd_, 128) != 0) return Internal(std::string("listen: ") + strerror(errno));
  socklen_t len = sizeof(addr);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  return static_cast<int>(ntohs(addr.sin_port));
}

void HttpServer::AcceptLoop() {
  while (!stopping_) {
    sockaddr_in peer{};
    socklen_t len = sizeof(peer);
    int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (stopping_) break;
      if (errno == EMFILE || errno == ENFILE) {
        // Out of descriptors: wait for a connection to finish rather than spin.
        pollfd p{listen_fd_, POLLIN, 100};
        poll(&p, 1, 100);
        continue;
      }
      break;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char ip[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &peer.sin_addr, ip, sizeof(ip));
    std::string remote = std::string(ip) + ":" + std::to_string(ntohs(peer.sin_port));
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      close(fd);
      break;
    }
    ReapFinished();
    open_fds_.insert(fd);
    auto done = std::make_shared<std::atomic<bool>>(false);
    conns_.push_back(Conn{std::thread([this, fd, remote, done] {
                            ServeConnection(fd, remote);
                            done->store(true);
                          }),
                          done});
  }
}

void HttpServer::ReapFinished() {
  for (auto it = conns_.begin(); it != conns_.end();) {
    if (it->done->load()) {
      it->thread.join();
      it = conns_.erase(it);
    } else {
      ++it;
    }
  }
}

void HttpServer::ServeConnection(int fd, std::string remote) {
  Reader reader(fd);
  while (!stopping_) {
    HttpRequest req;
    if (!ReadRequest(fd, reader, &req)) break;
    req.remote = remote;
    HttpResponder resp(fd);
    if (Lower(req.Header("connection")) == "close") resp.set_keep_alive(false);
    handler_(req, resp);
    if (!resp.started()) resp.Send(500, "text/plain", "no response\n");
    if (resp.started() && !resp.finished() && !resp.aborted()) resp.Abort();
    if (resp.aborted() || !resp.keep_alive()) break;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    open_fds_.erase(fd);
  }
  shutdown(fd, SHUT_RDWR);
  close(fd);
}

void HttpServer::Stop() {
  if (listen_fd_ < 0) return;
  stopping_ = true;
  shutdown(listen_fd_, SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  close(listen_fd_);
  listen_fd_ = -1;
  std::list<Conn> conns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : open_fds_) shutdown(fd, SHUT_RDWR);
    conns.swap(conns_);
  }
  for (auto& c : conns) c.thread.join();
}

}  // namespace spawnpoint::kubetest
