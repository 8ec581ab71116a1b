#include "agent/loader/protocol.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

namespace spawnpoint::loader {
namespace {

constexpr size_t kHeaderBytes = 8;
constexpr uint32_t kMaxPayload = 64u << 20;

void PutU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

}  // namespace

const char* MsgTypeName(MsgType type) {
  switch (type) {
    case MsgType::kConfigure:
      return "Configure";
    case MsgType::kHello:
      return "Hello";
    case MsgType::kRing:
      return "Ring";
    case MsgType::kProbe:
      return "Probe";
    case MsgType::kProbeResult:
      return "ProbeResult";
    case MsgType::kTask:
      return "Task";
    case MsgType::kDone:
      return "Done";
    case MsgType::kError:
      return "Error";
    case MsgType::kOpen:
      return "Open";
    case MsgType::kOpened:
      return "Opened";
    case MsgType::kSubmit:
      return "Submit";
    case MsgType::kReady:
      return "Ready";
    case MsgType::kRelease:
      return "Release";
    case MsgType::kDrop:
      return "Drop";
    case MsgType::kBatchError:
      return "BatchError";
    case MsgType::kRewind:
      return "Rewind";
    case MsgType::kAccepted:
      return "Accepted";
  }
  return "?";
}

StatusOr<int> ListenUnix(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return InvalidArgument("socket path " + path + " is longer than " +
                           std::to_string(sizeof(addr.sun_path) - 1) +
                           " bytes; use a shorter pool directory");
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Internal(std::string("socket: ") + strerror(errno));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  unlink(path.c_str());  // a socket file left by an earlier owner of the directory
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 16) != 0) {
    const int e = errno;
    close(fd);
    return Internal("cannot listen on " + path + ": " + strerror(e));
  }
  // Above the descriptors a spawned worker is given (fd 3), so it can be passed as one.
  int high = fcntl(fd, F_DUPFD_CLOEXEC, 10);
  close(fd);
  if (high < 0) return Internal(std::string("fcntl: ") + strerror(errno));
  return high;
}

Status SendWithFds(int sock, std::string_view bytes, const std::vector<int>& fds) {
  size_t sent = 0;
  bool fds_sent = fds.empty();
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  while (sent < bytes.size()) {
    iovec iov{const_cast<char*>(bytes.data()) + sent, bytes.size() - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (!fds_sent) {
      msg.msg_control = control.data();
      msg.msg_controllen = control.size();
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        // A non-blocking socket whose buffer is full: wait until it drains.
        pollfd p{sock, POLLOUT, 0};
        poll(&p, 1, -1);
        continue;
      }
      return Unavailable(strerror(errno));
    }
    fds_sent = true;
    sent += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status SendMessage(int sock, const Message& message) {
  const std::string payload = message.body.dump();
  std::string frame(kHeaderBytes, '\0');
  PutU32(frame.data(), static_cast<uint32_t>(payload.size()));
  frame[4] = static_cast<char>(message.type);
  frame[5] = message.fd >= 0 ? 1 : 0;
  frame += payload;
  std::vector<int> fds;
  if (message.fd >= 0) fds.push_back(message.fd);
  return SendWithFds(sock, frame, fds).WithPrefix(std::string("send ") + MsgTypeName(message.type));
}

MessageReader::~MessageReader() { Reset(-1); }

void MessageReader::Reset(int fd) {
  for (int f : fds_) close(f);
  fds_.clear();
  buffer_.clear();
  start_ = 0;
  fd_ = fd;
}

MessageReader::Result MessageReader::ReadSome(bool block, std::string* error) {
  if (start_ > 0 && start_ == buffer_.size()) {
    buffer_.clear();
    start_ = 0;
  } else if (start_ > (1u << 20)) {
    buffer_.erase(0, start_);
    start_ = 0;
  }
  char data[64 * 1024];
  iovec iov{data, sizeof(data)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC | (block ? 0 : MSG_DONTWAIT));
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Result::kOk;
    if (error) *error = strerror(errno);
    return Result::kError;
  }
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int f;
        std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds_.push_back(f);
      }
    }
  }
  if (n == 0) return Result::kEof;
  buffer_.append(data, static_cast<size_t>(n));
  return Result::kOk;
}

std::optional<Message> MessageReader::Pop(std::string* error) {
  if (buffer_.size() - start_ < kHeaderBytes) return std::nullopt;
  const char* h = buffer_.data() + start_;
  const uint32_t len = GetU32(h);
  if (len > kMaxPayload) {
    if (error) *error = "malformed frame: payload of " + std::to_string(len) + " bytes";
    return std::nullopt;
  }
  if (buffer_.size() - start_ < kHeaderBytes + len) return std::nullopt;
  Message m;
  m.type = static_cast<MsgType>(static_cast<unsigned char>(h[4]));
  const bool has_fd = h[5] != 0;
  m.body = nlohmann::json::parse(h + kHeaderBytes, h + kHeaderBytes + len, nullptr, false);
  start_ += kHeaderBytes + len;
  if (m.body.is_discarded()) {
    if (error) *error = std::string("malformed ") + MsgTypeName(m.type) + " message";
    return std::nullopt;
  }
  if (has_fd) {
    if (fds_.empty()) {
      if (error) *error = std::string(MsgTypeName(m.type)) + " arrived without its descriptor";
      return std::nullopt;
    }
    m.fd = fds_.front();
    fds_.pop_front();
  }
  return m;
}

}  // namespace spawnpoint::loader
