#include "agent/loader/pool_supervisor.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "agent/loader/protocol.h"

namespace spawnpoint::loader {
namespace {

constexpr size_t kStderrTailLines = 20;
// Above 3 so that handing the socket over as the child's fd 3 always goes through a real
// dup2, which clears close-on-exec (dup2 onto itself would leave it set).

void WriteAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = write(fd, s.data() + off, s.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // a closed sink loses output; the pool must keep supervising regardless
    }
    off += static_cast<size_t>(n);
  }
}

bool IsWorkerVariable(const std::string& kv) {
  for (const char* name :
       {kEnvListenFd, kEnvWorkerId, kEnvWorkerRank, kEnvIncarnation, kEnvTurnFd, kEnvStartedFd}) {
    const size_t n = strlen(name);
    if (kv.compare(0, n, name) == 0 && kv.size() > n && kv[n] == '=') return true;
  }
  return false;
}

}  // namespace

PoolSupervisor::PoolSupervisor(agent::ProcessSpawner* spawner, PoolSpec spec)
    : spawner_(spawner), spec_(std::move(spec)) {
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
}

PoolSupervisor::~PoolSupervisor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
    for (Worker& w : workers_) {
      if (w.pid > 0) kill(-w.pid, SIGKILL), kill(w.pid, SIGKILL);
    }
  }
  WakePump();
  if (pump_.joinable()) pump_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (Worker& w : workers_) {
    CloseStreamsLocked(w);
    if (w.listen_fd >= 0) {
      close(w.listen_fd);
      unlink(w.socket_path.c_str());
    }
  }
  if (wake_fd_ >= 0) close(wake_fd_);
  if (spec_.remove_dir && !spec_.dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(spec_.dir, ec);
  }
}

Status PoolSupervisor::Start() {
  std::unique_lock<std::mutex> lock(mu_);
  if (started_) return FailedPrecondition("loader pool: already started");
  if (spec_.workers <= 0) return InvalidArgument("loader pool: workers must be at least 1");
  if (spec_.argv.empty()) return InvalidArgument("loader pool: empty worker command");
  if (wake_fd_ < 0) return Internal(std::string("loader pool: eventfd: ") + strerror(errno));
  std::error_code ec;
  std::filesystem::create_directories(spec_.dir, ec);
  if (ec) return Internal("loader pool: cannot create " + spec_.dir + ": " + ec.message());
  started_ = true;
  workers_.resize(static_cast<size_t>(spec_.workers));
  for (int i = 0; i < spec_.workers; ++i) {
    Worker& w = workers_[static_cast<size_t>(i)];
    w.id = i;
    w.socket_path = WorkerSocketPath(spec_.dir, i);
    StatusOr<int> fd = ListenUnix(w.socket_path);
    if (!fd.ok()) return fd.status().WithPrefix("loader pool");
    w.listen_fd = *fd;
  }
  // Staggered start-up: one pipe per worker w >= c, read by w and written by w - c.
  const int c = spec_.start_concurrency;
  std::vector<std::pair<int, int>> gates(workers_.size(), {-1, -1});
  for (int w = c; c > 0 && w < spec_.workers; ++w) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) break;  // no stagger: every worker starts at once
    gates[static_cast<size_t>(w)].first = p[0];
    gates[static_cast<size_t>(w - c)].second = p[1];
  }
  const auto close_gates = [&] {
    for (auto& [turn, started] : gates) {
      if (turn >= 0) close(turn);
      if (started >= 0) close(started);
      turn = started = -1;
    }
  };
  for (Worker& w : workers_) {
    Status st = SpawnLocked(w, gates[static_cast<size_t>(w.id)]);
    if (!st.ok()) {
      close_gates();
      for (Worker& other : workers_) {
        if (other.pid > 0) kill(-other.pid, SIGKILL), kill(other.pid, SIGKILL);
      }
      stopping_ = true;
      return st.WithPrefix("loader pool of rank " + std::to_string(spec_.rank) + ", worker " +
                           std::to_string(w.id));
    }
  }
  close_gates();  // the workers hold them now
  pump_ = std::thread([this] { PumpLoop(); });
  return Status::Ok();
}

Status PoolSupervisor::Grow(int workers) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!started_ || stopping_) return FailedPrecondition("loader pool: not running");
  while (static_cast<int>(workers_.size()) < workers) {
    Worker w;
    w.id = static_cast<int>(workers_.size());
    w.socket_path = WorkerSocketPath(spec_.dir, w.id);
    StatusOr<int> fd = ListenUnix(w.socket_path);
    if (!fd.ok()) return fd.status().WithPrefix("loader pool");
    w.listen_fd = *fd;
    workers_.push_back(std::move(w));
    // Spawned like a respawn: a failure is retried by Tick(), as for any worker.
    Worker& added = workers_.back();
    if (Status st = SpawnLocked(added); !st.ok()) {
      added.respawn_at = Clock::now() + spec_.crash_loop_delay;
      LogLocked(added, "cannot spawn: " + st.message() + "; retrying in " +
                           std::to_string(spec_.crash_loop_delay.count()) + " ms");
    }
  }
  return Status::Ok();
}

int PoolSupervisor::Size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(workers_.size());
}

Status PoolSupervisor::SpawnLocked(Worker& w, std::pair<int, int> gate) {
  CloseStreamsLocked(w);
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return Internal(std::string("pipe: ") + strerror(errno));
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return Internal(std::string("pipe: ") + strerror(errno));
  }
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);

  const int incarnation = w.incarnation + 1;
  agent::SpawnOptions opts;
  opts.argv = spec_.argv;
  for (const std::string& kv : spec_.env) {
    if (!IsWorkerVariable(kv)) opts.env.push_back(kv);
  }
  opts.env.push_back(std::string(kEnvListenFd) + "=" + std::to_string(kWorkerListenFd));
  opts.env.push_back(std::string(kEnvWorkerId) + "=" + std::to_string(w.id));
  opts.env.push_back(std::string(kEnvWorkerRank) + "=" + std::to_string(spec_.rank));
  opts.env.push_back(std::string(kEnvIncarnation) + "=" + std::to_string(incarnation));
  opts.cpus = spec_.cpus;
  opts.death_signal = spec_.death_signal;
  opts.stdout_fd = out[1];
  opts.stderr_fd = err[1];
  opts.inherit_fds = {{w.listen_fd, kWorkerListenFd}};
  if (gate.first >= 0) {
    opts.inherit_fds.emplace_back(gate.first, kWorkerTurnFd);
    opts.env.push_back(std::string(kEnvTurnFd) + "=" + std::to_string(kWorkerTurnFd));
  }
  if (gate.second >= 0) {
    opts.inherit_fds.emplace_back(gate.second, kWorkerStartedFd);
    opts.env.push_back(std::string(kEnvStartedFd) + "=" + std::to_string(kWorkerStartedFd));
  }
  StatusOr<pid_t> pid = spawner_->Spawn(opts);
  close(out[1]);
  close(err[1]);
  if (!pid.ok()) {
    close(out[0]);
    close(err[0]);
    return pid.status();
  }
  w.pid = *pid;
  w.incarnation = incarnation;
  // Best effort: without it a rank can only wait for a worker that does not answer.
  (void)WriteFileAtomically(WorkerPidPath(spec_.dir, w.id), std::to_string(w.pid) + "\n");
  if (!spec_.memory_events_path.empty()) {
    w.oom_kills_at_spawn = agent::ReadOomKillCount(spec_.memory_events_path);
  }
  w.out.fd = out[0];
  w.err.fd = err[0];
  w.stderr_tail.clear();
  w.respawn_at.reset();
  WakePump();
  return Status::Ok();
}

bool PoolSupervisor::OnChildExited(pid_t pid, int wait_status) {
  std::lock_guard<std::mutex> lock(mu_);
  Worker* w = FindLocked(pid);
  if (w == nullptr) return false;
  agent::ExitStatus status = agent::ExitStatus::FromWaitStatus(wait_status);
  std::optional<int64_t> oom_kills_now;
  if (!spec_.memory_events_path.empty()) {
    oom_kills_now = agent::ReadOomKillCount(spec_.memory_events_path);
  }
  RecordExitLocked(*w, status, agent::ClassifyExit(status, w->oom_kills_at_spawn, oom_kills_now));
  return true;
}

bool PoolSupervisor::OnChildVanished(pid_t pid) {
  std::lock_guard<std::mutex> lock(mu_);
  Worker* w = FindLocked(pid);
  if (w == nullptr) return false;
  agent::ExitStatus status;
  status.exit_code = -1;
  RecordExitLocked(*w, status,
                   {agent::ExitReason::kCrashed,
                    "exited, but its exit status was collected by another waitpid() in this "
                    "process (or SIGCHLD is ignored), so the cause is unknown"});
  return true;
}

PoolSupervisor::Worker* PoolSupervisor::FindLocked(pid_t pid) {
  if (pid <= 0) return nullptr;
  for (Worker& w : workers_) {
    if (w.pid == pid) return &w;
  }
  return nullptr;
}

void PoolSupervisor::RecordExitLocked(Worker& w, const agent::ExitStatus& status,
                                      const agent::ExitCause& cause) {
  // Whatever the worker wrote before it died belongs in its record.
  ReadStreamLocked(w, false, true);
  ReadStreamLocked(w, true, true);

  WorkerExitRecord record;
  record.worker_id = w.id;
  record.pid = w.pid;
  record.incarnation = w.incarnation;
  record.status = status;
  record.cause = cause;
  record.stderr_tail.assign(w.stderr_tail.begin(), w.stderr_tail.end());
  Status st =
      WriteFileAtomically(WorkerExitRecordPath(spec_.dir, w.id), record.ToJson().dump(2) + "\n");
  if (!st.ok()) LogLocked(w, "cannot write the exit record: " + st.message());

  w.pid = 0;
  ++w.exits;
  ++exits_by_reason_[agent::ExitReasonName(record.cause.reason)];
  CloseStreamsLocked(w);
  if (stopping_) return;
  RespawnOrDeferLocked(w, "pid " + std::to_string(record.pid) + " (incarnation " +
                              std::to_string(record.incarnation) +
                              ") exited: " + record.Describe());
}

void PoolSupervisor::RespawnOrDeferLocked(Worker& w, const std::string& why) {
  const auto now = Clock::now();
  w.recent_exits.push_back(now);
  while (!w.recent_exits.empty() && now - w.recent_exits.front() > spec_.crash_loop_window) {
    w.recent_exits.pop_front();
  }
  if (static_cast<int>(w.recent_exits.size()) > spec_.crash_loop_exits) {
    w.respawn_at = now + spec_.crash_loop_delay;
    LogLocked(w, why + "; crash-looping (" + std::to_string(w.recent_exits.size()) +
                     " exits within " + std::to_string(spec_.crash_loop_window.count() / 1000) +
                     " s): respawning in " + std::to_string(spec_.crash_loop_delay.count()) +
                     " ms");
    return;
  }
  Status st = SpawnLocked(w);
  if (!st.ok()) {
    w.respawn_at = now + spec_.crash_loop_delay;
    LogLocked(w, why + "; cannot respawn: " + st.message() + "; retrying in " +
                     std::to_string(spec_.crash_loop_delay.count()) + " ms");
    return;
  }
  LogLocked(w, why + "; respawned as pid " + std::to_string(w.pid) + " (incarnation " +
                   std::to_string(w.incarnation) + ")");
}

void PoolSupervisor::Tick() {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;
  const auto now = Clock::now();
  for (Worker& w : workers_) {
    if (w.pid != 0 || !w.respawn_at || *w.respawn_at > now) continue;
    Status st = SpawnLocked(w);
    if (!st.ok()) {
      w.respawn_at = now + spec_.crash_loop_delay;
      LogLocked(w, "cannot respawn: " + st.message() + "; retrying in " +
                       std::to_string(spec_.crash_loop_delay.count()) + " ms");
    } else {
      LogLocked(w, "respawned as pid " + std::to_string(w.pid) + " (incarnation " +
                       std::to_string(w.incarnation) + ")");
    }
  }
}

std::optional<std::chrono::milliseconds> PoolSupervisor::TimeToNextRespawn() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return std::nullopt;
  std::optional<std::chrono::milliseconds> next;
  const auto now = Clock::now();
  for (const Worker& w : workers_) {
    if (w.pid != 0 || !w.respawn_at) continue;
    auto d = std::chrono::ceil<std::chrono::milliseconds>(*w.respawn_at - now);
    d = std::max(d, std::chrono::milliseconds(0));
    if (!next || d < *next) next = d;
  }
  return next;
}

std::vector<pid_t> PoolSupervisor::Pids() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<pid_t> pids;
  for (const Worker& w : workers_) {
    if (w.pid > 0) pids.push_back(w.pid);
  }
  return pids;
}

pid_t PoolSupervisor::WorkerPid(int worker) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (worker < 0 || worker >= static_cast<int>(workers_.size())) return 0;
  return workers_[static_cast<size_t>(worker)].pid;
}

int64_t PoolSupervisor::Exits() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const Worker& w : workers_) n += w.exits;
  return n;
}

nlohmann::json PoolSupervisor::StatusJson() const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json workers = nlohmann::json::array();
  for (const Worker& w : workers_) {
    workers.push_back({{"worker", w.id},
                       {"pid", w.pid},
                       {"incarnation", w.incarnation},
                       {"exits", w.exits},
                       {"socket", w.socket_path}});
  }
  return {{"rank", spec_.rank},
          {"dir", spec_.dir},
          {"workers", workers},
          {"exitsByReason", exits_by_reason_}};
}

void PoolSupervisor::Stop(std::chrono::milliseconds grace) {
  std::vector<pid_t> pids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (Worker& w : workers_) {
      w.respawn_at.reset();
      if (w.pid > 0) pids.push_back(w.pid);
    }
  }
  std::vector<pollfd> waiting;
  for (pid_t pid : pids) {
    // Opened before the signal, so the pidfd cannot name a recycled pid.
    int pfd = agent::PidfdOpen(pid);
    kill(-pid, SIGTERM);
    kill(pid, SIGTERM);
    if (pfd >= 0) waiting.push_back({pfd, POLLIN, 0});
  }
  const auto deadline = Clock::now() + grace;
  while (true) {
    std::erase_if(waiting, [](const pollfd& p) {
      if (p.revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL)) {
        close(p.fd);
        return true;
      }
      return false;
    });
    if (waiting.empty()) break;
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    for (pollfd& p : waiting) p.revents = 0;
    poll(waiting.data(), waiting.size(), static_cast<int>(left.count()));
  }
  for (pollfd& p : waiting) close(p.fd);
  std::lock_guard<std::mutex> lock(mu_);
  for (Worker& w : workers_) {
    if (w.pid > 0) kill(-w.pid, SIGKILL), kill(w.pid, SIGKILL);
  }
}

void PoolSupervisor::StopAndReap(std::chrono::milliseconds grace) {
  Stop(grace);
  for (pid_t pid : Pids()) {
    int status = 0;
    pid_t r;
    do {
      r = waitpid(pid, &status, 0);
    } while (r < 0 && errno == EINTR);
    if (r == pid) {
      OnChildExited(pid, status);
    } else {
      OnChildVanished(pid);
    }
  }
}

void PoolSupervisor::CloseStreamsLocked(Worker& w) {
  for (Stream* s : {&w.out, &w.err}) {
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
    if (!s->partial.empty()) {
      std::string line;
      line.swap(s->partial);
      EmitLineLocked(w, s == &w.err, line);
    }
  }
}

void PoolSupervisor::ReadStreamLocked(Worker& w, bool is_err, bool drain) {
  Stream& s = is_err ? w.err : w.out;
  char buf[16 * 1024];
  while (s.fd >= 0) {
    ssize_t n = read(s.fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
        close(s.fd);
        s.fd = -1;
        if (!s.partial.empty()) {
          std::string line;
          line.swap(s.partial);
          EmitLineLocked(w, is_err, line);
        }
      }
      return;
    }
    s.partial.append(buf, static_cast<size_t>(n));
    size_t start = 0, nl;
    while ((nl = s.partial.find('\n', start)) != std::string::npos) {
      EmitLineLocked(w, is_err, s.partial.substr(start, nl - start));
      start = nl + 1;
    }
    s.partial.erase(0, start);
    // A line without an end must not grow without bound.
    if (s.partial.size() > 64 * 1024) {
      std::string line;
      line.swap(s.partial);
      EmitLineLocked(w, is_err, line);
    }
    if (!drain) return;
  }
}

void PoolSupervisor::EmitLineLocked(Worker& w, bool is_err, const std::string& line) {
  WriteAll(spec_.sink_fd, "[rank " + std::to_string(spec_.rank) + " worker " +
                              std::to_string(w.id) + "] " + line + "\n");
  if (is_err) {
    w.stderr_tail.push_back(line);
    while (w.stderr_tail.size() > kStderrTailLines) w.stderr_tail.pop_front();
  }
}

void PoolSupervisor::LogLocked(const Worker& w, const std::string& line) {
  WriteAll(spec_.sink_fd, "[rank " + std::to_string(spec_.rank) + " worker " +
                              std::to_string(w.id) + "] spawnpoint: " + line + "\n");
}

void PoolSupervisor::WakePump() {
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
  }
}

void PoolSupervisor::PumpLoop() {
  std::vector<pollfd> fds;
  std::vector<std::pair<size_t, bool>> owners;  // (worker index, is stderr) per entry
  while (true) {
    fds.clear();
    owners.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (quit_) return;
      for (size_t i = 0; i < workers_.size(); ++i) {
        if (workers_[i].out.fd >= 0) {
          fds.push_back({workers_[i].out.fd, POLLIN, 0});
          owners.push_back({i, false});
        }
        if (workers_[i].err.fd >= 0) {
          fds.push_back({workers_[i].err.fd, POLLIN, 0});
          owners.push_back({i, true});
        }
      }
    }
    if (poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return;
    if (fds[0].revents & POLLIN) {
      uint64_t v;
      [[maybe_unused]] ssize_t n = read(wake_fd_, &v, sizeof(v));
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (quit_) return;
    for (size_t k = 1; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      auto [i, is_err] = owners[k - 1];
      Worker& w = workers_[i];
      // The descriptor may have been closed (and its number reused) since the poll set was
      // built; only read it if it still belongs to this stream.
      if ((is_err ? w.err.fd : w.out.fd) == fds[k].fd) ReadStreamLocked(w, is_err, false);
    }
  }
}

}  // namespace spawnpoint::loader
