#include "agent/supervisor/signals.h"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace spawnpoint::agent {

bool IsTerminationSignal(int sig) { return sig == SIGTERM || sig == SIGINT || sig == SIGHUP; }

StatusOr<std::unique_ptr<SignalWatcher>> SignalWatcher::Create() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGCHLD, SIGTERM, SIGINT, SIGHUP}) sigaddset(&set, sig);
  if (pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0) {
    return Internal("cannot block signals");
  }
  int fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (fd < 0) return Internal(std::string("signalfd: ") + strerror(errno));
  return std::unique_ptr<SignalWatcher>(new SignalWatcher(fd));
}

SignalWatcher::~SignalWatcher() { close(fd_); }

std::vector<int> SignalWatcher::Drain() {
  std::vector<int> out;
  out.swap(pending_);
  signalfd_siginfo info;
  while (read(fd_, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
    out.push_back(static_cast<int>(info.ssi_signo));
  }
  return out;
}

int SignalWatcher::WaitForTermination(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    for (int sig : Drain()) {
      if (IsTerminationSignal(sig)) return sig;
      if (sig == SIGCHLD) pending_.push_back(sig);
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return 0;
    pollfd p{fd_, POLLIN, 0};
    poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
  }
}

}  // namespace spawnpoint::agent
