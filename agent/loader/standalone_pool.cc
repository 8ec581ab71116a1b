// StandalonePool: a PoolSupervisor driven by a thread of its own, for a program that runs
// its loader workers itself (no agent): pool_supervisor.h declares it.
#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>

#include "agent/loader/pool_supervisor.h"

namespace spawnpoint::loader {

StatusOr<std::unique_ptr<StandalonePool>> StandalonePool::Start(PoolSpec spec,
                                                                std::chrono::milliseconds grace) {
  std::unique_ptr<StandalonePool> p(new StandalonePool());
  p->stop_grace_ = grace;
  p->spawner_ = agent::MakeVforkSpawner();
  p->pool_ = std::make_unique<PoolSupervisor>(p->spawner_.get(), std::move(spec));
  p->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (p->wake_fd_ < 0) return Internal(std::string("eventfd: ") + strerror(errno));
  Status start_status;
  std::mutex mu;
  std::condition_variable cv;
  bool started = false;
  p->thread_ = std::thread([&, raw = p.get()] { raw->Run(&start_status, &mu, &cv, &started); });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return started; });
  if (!start_status.ok()) {
    lock.unlock();
    return start_status;  // the destructor reaps what was spawned
  }
  return p;
}

StandalonePool::~StandalonePool() {
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  pool_.reset();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void StandalonePool::Run(Status* start_status, std::mutex* mu, std::condition_variable* cv,
                         bool* started) {
  // The workers are spawned from this thread, which lives until they are reaped, so their
  // PR_SET_PDEATHSIG fires only when the whole program dies.
  Status st = pool_->Start();
  {
    std::lock_guard<std::mutex> lock(*mu);
    *start_status = st;
    *started = true;
    cv->notify_all();
  }
  std::map<pid_t, int> pidfds;
  bool quit = !st.ok();
  while (!quit) {
    const std::vector<pid_t> pids = pool_->Pids();
    for (auto it = pidfds.begin(); it != pidfds.end();) {
      if (std::find(pids.begin(), pids.end(), it->first) == pids.end()) {
        close(it->second);
        it = pidfds.erase(it);
      } else {
        ++it;
      }
    }
    for (pid_t pid : pids) {
      if (pidfds.count(pid)) continue;
      int fd = agent::PidfdOpen(pid);
      if (fd >= 0) pidfds[pid] = fd;
    }
    std::vector<pollfd> fds{{wake_fd_, POLLIN, 0}};
    for (auto [pid, fd] : pidfds) fds.push_back({fd, POLLIN, 0});
    int timeout = -1;
    if (auto next = pool_->TimeToNextRespawn()) timeout = static_cast<int>(next->count());
    // A pid whose pidfd could not be opened is checked by polling.
    if (pidfds.size() < pids.size()) timeout = timeout < 0 ? 50 : std::min(timeout, 50);
    poll(fds.data(), fds.size(), timeout);
    if (fds[0].revents & POLLIN) quit = true;
    for (pid_t pid : pids) {
      int status = 0;
      const pid_t r = waitpid(pid, &status, WNOHANG);
      if (r == pid) {
        pool_->OnChildExited(pid, status);
      } else if (r < 0 && errno == ECHILD) {
        pool_->OnChildVanished(pid);  // reaped by someone else: never spin on it
      }
    }
    pool_->Tick();
  }
  for (auto [pid, fd] : pidfds) close(fd);
  pool_->StopAndReap(stop_grace_);
}

}  // namespace spawnpoint::loader
