// PoolClient, the workers' side: connecting and configuring, the messages a worker sends,
// its death (charged to the batch it was building, its tasks reissued), the hung-worker
// kill, and the I/O thread's loop. Every method here runs on the I/O thread with mu_ held,
// but for IoLoop, which takes it (and Connect, also called by Start before the thread runs).
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "agent/loader/contract.h"
#include "agent/loader/pool_client.h"

#include <sys/statvfs.h>
#include "agent/loader/worker_failures.h"

namespace spawnpoint::loader {
namespace {

// How long a closed connection waits for its worker's exit record before it is charged
// without one.
constexpr auto kExitRecordWait = std::chrono::seconds(3);

// The parent of live process `pid` (/proc/PID/stat); 0 when it is gone or a zombie.
pid_t ParentOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream fields(stat.substr(paren + 1));
  std::string state;
  long long ppid = 0;
  if (!(fields >> state >> ppid) || state == "Z" || state == "X") return 0;
  return static_cast<pid_t>(ppid);
}

}  // namespace

// --- connections -------------------------------------------------------------------------

void PoolClient::Connect(Conn& c, Clock::TimePoint now) {
  c.reader->Reset(-1);
  if (c.fd >= 0) close(c.fd);
  c.fd = -1;
  c.hello_this_connection = false;
  c.probing = false;
  c.state = ConnState::kIdle;
  c.retry_at = now + std::chrono::milliseconds(20);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    c.connect_error = std::string("socket: ") + strerror(errno);
    return;
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, c.path.c_str(), sizeof(addr.sun_path) - 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    // Not there yet (the agent is starting the pool) or the backlog is full: retry.
    c.connect_error = std::string("connect: ") + strerror(errno);
    close(fd);
    return;
  }
  c.connect_error.clear();
  nlohmann::json configure = {{"protocol", kProtocolVersion}, {"dataset", opts_.dataset},
                              {"arg", opts_.dataset_arg},     {"seed", opts_.seed},
                              {"rank", opts_.rank},           {"worldSize", opts_.world_size},
                              {"numWorkers", opts_.workers},  {"workerId", c.id}};
  if (!SendMessage(fd, {MsgType::kConfigure, configure}).ok() || (ring_ && !SendRing(fd).ok())) {
    close(fd);
    return;
  }
  c.fd = fd;
  c.reader->Reset(fd);
  c.state = ConnState::kAwaitHello;
}

Status PoolClient::SendRing(int fd) {
  return SendMessage(fd, {MsgType::kRing,
                          {{"slots", ring_->slots()}, {"slotBytes", ring_->slot_bytes()}},
                          ring_->fd()});
}

void PoolClient::ConnDown(Conn& c, Clock::TimePoint now) {
  c.reader->Reset(-1);
  if (c.fd >= 0) close(c.fd);
  c.fd = -1;
  if (c.state == ConnState::kReady) c.SetDownSince(now);
  c.state = ConnState::kAwaitRecord;
  c.record_deadline = now + kExitRecordWait;
}

// The worker's latest exit, if it is newer than what this client has handled: why a worker
// that never answers keeps failing (it may die before it accepts our connection).
std::string PoolClient::LastExitNote(const Conn& c) const {
  auto r = ReadExitRecord(WorkerExitRecordPath(opts_.dir, c.id));
  if (!r.ok() || r->incarnation <= c.last_record_incarnation) return "";
  std::string note = "; its last exit: pid " + std::to_string(r->pid) + " (incarnation " +
                     std::to_string(r->incarnation) + ") " + r->Describe();
  if (!r->stderr_tail.empty()) note += StderrTail(*r);
  return note;
}

std::chrono::milliseconds PoolClient::ServiceTimeout() const {
  return opts_.timeout.count() > 0 ? opts_.timeout : std::chrono::minutes(5);
}

Clock::Duration PoolClient::OutOfService(const Conn& c, Clock::TimePoint now) const {
  // Credit is only ever given with a timeout (CheckHung looks), so 0 means wall time.
  if (c.hang_clock.AtCeiling(now, opts_.timeout)) return now - c.down_since;
  return now - c.down_since - c.hang_clock.Credit();
}

// The connection's worker is gone (EOF): learn why, charge the batch it was building,
// reissue its tasks and connect to its successor.
void PoolClient::HandleDeath(Conn& c, Clock::TimePoint now) {
  std::optional<WorkerExitRecord> record;
  auto r = ReadExitRecord(WorkerExitRecordPath(opts_.dir, c.id));
  if (r.ok() && r->incarnation > c.last_record_incarnation &&
      (c.pid == 0 || !c.hello_this_connection || r->pid == c.pid)) {
    record = std::move(r).value();
  }
  if (!record && now < c.record_deadline) return;  // not written yet: look again soon
  if (record) c.last_record_incarnation = record->incarnation;

  const DeathReport death =
      DescribeDeath(c.id, record ? record->pid : c.pid, record, c.hung_killed ? c.hang_note : "",
                    opts_.dir, kExitRecordWait);
  ++restarts_[static_cast<int>(death.kind)];
  if (!c.hello_this_connection) {
    if (++c.start_failures >= opts_.max_attempts) {
      FailLocked(Internal("loader: worker " + std::to_string(c.id) + " of rank " +
                          std::to_string(opts_.rank) + " failed " +
                          std::to_string(c.start_failures) +
                          " times before it could serve; last: " + death.line + death.tail));
      return;
    }
  }
  if (c.probing) {
    if (++probe_failures_ >= opts_.max_attempts) {
      FailLocked(Internal("loader: building the first batch (to size shared memory) failed " +
                          std::to_string(probe_failures_) + " times; last: " + death.line +
                          death.tail));
      return;
    }
  }
  // The worker builds its tasks in order, so the first one is what it died on.
  std::optional<int64_t> given_up;
  if (!c.queue.empty()) {
    Task& head = tasks_.at(c.queue.front());
    head.failures.push_back(death.line);
    head.last_failure_detail = death.tail;
    if (!head.canceled && static_cast<int>(head.failures.size()) >= opts_.max_attempts) {
      given_up = head.id;
      head.worker = -1;
      FailTask(head, Internal(GiveUpMessage(head.batch, head.epoch, head.indices, head.failures) +
                              death.tail));
    }
  }
  for (int64_t id : c.queue) {
    if (given_up && id == *given_up) continue;
    Task& t = tasks_.at(id);
    t.worker = -1;
    if (t.canceled) {
      Remove(t);
    } else {
      reissue_.push_back(id);
    }
  }
  c.queue.clear();
  std::sort(reissue_.begin(), reissue_.end(), [&](int64_t a, int64_t b) {
    const Task& x = tasks_.at(a);
    const Task& y = tasks_.at(b);
    return std::tie(x.epoch, x.batch) < std::tie(y.epoch, y.batch);
  });
  c.hung_killed = false;
  c.hang_note.clear();
  Connect(c, now);
}

// --- messages ------------------------------------------------------------------------------

void PoolClient::HandleMessage(Conn& c, Message& m, Clock::TimePoint now) {
  switch (m.type) {
    case MsgType::kHello:
      return OnHello(c, m.body, now);
    case MsgType::kProbeResult:
      return OnProbeResult(c, m);
    case MsgType::kDone:
      return OnDone(c, m.body, now);
    case MsgType::kError:
      return OnWorkerError(c, m.body, now);
    default:
      FailLocked(Internal(std::string("loader: unexpected ") + MsgTypeName(m.type) +
                          " message from worker " + std::to_string(c.id)));
  }
}

void PoolClient::OnHello(Conn& c, const nlohmann::json& b, Clock::TimePoint now) {
  const int worker = b.value("workerId", -1);
  if (worker != c.id) {
    FailLocked(Internal("loader: " + c.path + " answered as worker " + std::to_string(worker)));
    return;
  }
  const int64_t size = b.value("size", int64_t{-1});
  if (dataset_size_ < 0) {
    dataset_size_ = size;
  } else if (size != dataset_size_) {
    FailLocked(Internal("loader: worker " + std::to_string(c.id) + " sees " + std::to_string(size) +
                        " samples in dataset \"" + opts_.dataset + "\" but another saw " +
                        std::to_string(dataset_size_)));
    return;
  }
  c.pid = b.value("pid", 0);
  c.incarnation = b.value("incarnation", -1);
  if (c.hung_killed) {  // a successor took the connection its silent predecessor left
    ++restarts_[static_cast<int>(RestartKind::kHung)];
    c.hung_killed = false;
    c.hang_note.clear();
  }
  c.said_hello = true;
  c.hello_this_connection = true;
  c.start_failures = 0;
  c.state = ConnState::kReady;
  c.SetHeadSince(now);
  if (c.id == 0 && times_.hello == Clock::TimePoint{}) times_.hello = now;
  if (phase_ == Phase::kProbing && c.id == 0) StartProbe(c);
}

void PoolClient::StartProbe(Conn& c) {
  const std::vector<int64_t> first = opts_.probe_batch(dataset_size_);
  if (first.empty()) {
    // Nothing to load at all: a one-page ring keeps the machinery uniform.
    Status st = CreateRing(PageSize());
    if (!st.ok()) return FailLocked(st);
    EnterRunning();
    return;
  }
  nlohmann::json body = {{"epoch", 0}, {"batch", 0}, {"indices", first}};
  // Built in place: in a file of the shared-memory directory that becomes the ring, as
  // large as a slot could be with the ring fitting in the free space. A worker that cannot
  // (a Python worker ignores it) probes on the heap.
  struct statvfs vfs {};
  if (statvfs(opts_.shm_dir.c_str(), &vfs) == 0) {
    const size_t capacity =
        static_cast<size_t>(vfs.f_bavail) * vfs.f_frsize / slots_count_ / PageSize() * PageSize();
    if (capacity > 0) body["inPlace"] = {{"dir", opts_.shm_dir}, {"capacity", capacity}};
  }
  Status st = SendMessage(c.fd, {MsgType::kProbe, std::move(body)});
  if (st.ok()) {
    c.probing = true;
    probe_indices_ = first;
    times_.probe_sent = opts_.clock->Now();
  }
}

void PoolClient::OnProbeResult(Conn& c, Message& m) {
  c.probing = false;
  if (phase_ != Phase::kProbing) return;
  const nlohmann::json& b = m.body;
  times_.probe_result = opts_.clock->Now();
  times_.probe_build_s = b.value("buildSeconds", -1.0);
  probe_bytes_ = b.value("bytes", size_t{0});
  Status st;
  if (m.fd >= 0 && b.value("inPlace", false)) {
    st = AdoptRing(m.fd, probe_bytes_);
    m.fd = -1;  // the ring's now (closed on failure)
    if (st.ok()) {
      probed_ = Probed{probe_indices_, b.value("fields", nlohmann::json::array()), c.id};
      times_.in_place = true;
    }
  } else {
    st = CreateRing(SlotBytesForBatch(probe_bytes_));
  }
  if (!st.ok()) return FailLocked(st);
  EnterRunning();
}

void PoolClient::EnterRunning() {
  phase_ = Phase::kRunning;
  for (Conn& c : conns_) {
    if (c.fd >= 0 && !SendRing(c.fd).ok()) ConnDown(c, opts_.clock->Now());
  }
}

void PoolClient::OnDone(Conn& c, const nlohmann::json& b, Clock::TimePoint now) {
  const int64_t id = b.value("id", int64_t{-1});
  auto qit = std::find(c.queue.begin(), c.queue.end(), id);
  if (qit == c.queue.end()) return;  // not ours any more
  c.queue.erase(qit);
  c.SetHeadSince(now);
  Task& t = tasks_.at(id);
  t.worker = -1;
  if (t.canceled) return Remove(t);
  t.done_worker = c.id;
  t.fields = b.value("fields", nlohmann::json::array());
  t.tree = b.value("tree", nlohmann::json());
  ready_[t.epoch][t.batch] = id;
}

void PoolClient::OnWorkerError(Conn& c, const nlohmann::json& b, Clock::TimePoint now) {
  const int64_t id = b.value("id", int64_t{-1});
  const std::string who =
      "worker " + std::to_string(c.id) + (c.pid > 0 ? " (pid " + std::to_string(c.pid) + ")" : "");
  Task* t = nullptr;
  if (id >= 0 && tasks_.count(id)) t = &tasks_.at(id);
  std::string batch;
  if (t) {
    batch = "batch " + std::to_string(t->batch) + " of epoch " + std::to_string(t->epoch);
  } else if (c.probing) {
    batch = "batch 0 of epoch 0 (built first to size shared memory)";
  }
  Status st = WorkerErrorStatus(b, who, batch, opts_.dataset,
                                opts_.slot_bytes ? std::nullopt : std::optional(probe_bytes_));
  if (t == nullptr) {  // configuring, probing: nothing can go on
    if (error_.ok()) error_detail_ = b;
    return FailLocked(st);
  }
  // The worker is fine and moves on; the batch's outcome is this error, which Take reports
  // when the caller reaches the batch, so earlier batches are still delivered and the first
  // failing batch in order is the one reported.
  auto qit = std::find(c.queue.begin(), c.queue.end(), id);
  if (qit != c.queue.end()) c.queue.erase(qit);
  c.SetHeadSince(now);
  t->worker = -1;
  if (t->canceled) return Remove(*t);
  t->error_body = b;
  FailTask(*t, st);
}

// --- the I/O thread ------------------------------------------------------------------------

void PoolClient::CheckHung(Clock::TimePoint now) {
  if (opts_.timeout.count() <= 0) return;
  for (Conn& c : conns_) {
    if (c.state == ConnState::kAwaitHello && !c.hung_killed &&
        now >= c.hang_clock.NextLook(opts_.timeout)) {
      KillSilentWorker(c, now);
      continue;
    }
    if (c.state != ConnState::kReady || c.queue.empty() || c.hung_killed || c.pid <= 0) {
      continue;
    }
    if (now < c.hang_clock.NextLook(opts_.timeout)) continue;
    // The worker ran before the task was owed: its first reading is the baseline.
    const auto times = opts_.process_times(c.pid);
    c.hang_clock.Look(now, c.pid, times ? times->cpu_wait : std::nullopt, false);
    if (!c.hang_clock.Overdue(now, opts_.timeout)) continue;
    const Task& t = tasks_.at(c.queue.front());
    c.hung_killed = true;
    c.hang_note = HangNote(opts_.timeout, t.batch, t.epoch, c.hang_clock.Note(now, opts_.timeout));
    ++hung_kills_;
    // The whole group, so helper processes the dataset started go too.
    kill(-c.pid, SIGKILL);
    if (kill(c.pid, SIGKILL) != 0 && errno != ESRCH) {
      FailLocked(Internal("loader: worker " + std::to_string(c.id) + " (pid " +
                          std::to_string(c.pid) +
                          ") is hung and cannot be killed: " + strerror(errno)));
    }
  }
}

std::optional<PoolClient::WorkerProcess> PoolClient::LookAtSilentWorker(Conn& c,
                                                                        Clock::TimePoint now) {
  const pid_t pid = ReadWorkerPid(opts_.dir, c.id);
  const pid_t parent = pid > 0 ? ParentOf(pid) : 0;
  const bool ours = parent > 0 && (parent == getpid() || parent == getppid());
  const auto times = ours ? opts_.process_times(pid) : std::nullopt;
  if (!times) {
    c.hang_clock.Look(now, pid, std::nullopt, false);
    return std::nullopt;
  }
  c.hang_clock.Look(now, pid, times->cpu_wait, times->age <= c.hang_clock.Elapsed(now));
  return WorkerProcess{pid, *times};
}

// Connected and configured, and no Hello within the timeout from a worker that has lived at
// least that long: it is stopped or stuck (the socket is the pool's, so a connection is made
// whatever the worker does; a restarted rank meets a worker that hung while no rank used it
// this way). Killed as hung, through the pool's pid file, when the pid is a child of the
// pool's owner (this process, or the agent that started it); its successor takes the
// connection from the socket's backlog, or dies first and is connected to anew. Without a
// pid, or for a worker still starting, the not-served check decides as before. The time
// without an answer leaves out what the worker waited for a CPU (hang_clock.h): a worker
// importing on a loaded machine is starting, not hung.
bool PoolClient::KillSilentWorker(Conn& c, Clock::TimePoint now) {
  const auto worker = LookAtSilentWorker(c, now);
  if (!worker || c.hang_clock.Elapsed(now) < opts_.timeout) return false;
  if (!c.hang_clock.Overdue(now, opts_.timeout)) return true;  // starved, not hung
  // A successor still starting (younger than the timeout) is not hung: left to the check.
  if (worker->times.age < opts_.timeout) return false;
  const pid_t pid = worker->pid;
  c.hung_killed = true;
  c.hang_note = "hung: no answer in " + std::to_string(opts_.timeout.count() / 1000) +
                " s to a new connection" + c.hang_clock.Note(now, opts_.timeout) +
                "; killed with SIGKILL";
  kill(-pid, SIGKILL);
  kill(pid, SIGKILL);
  c.SetDownSince(now);  // its successor gets the whole time
  ++hello_kills_;
  ++hung_kills_;
  if (++c.start_failures >= opts_.max_attempts) {
    FailLocked(Internal("loader: worker " + std::to_string(c.id) + " of rank " +
                        std::to_string(opts_.rank) + " did not answer within " +
                        std::to_string(opts_.timeout.count() / 1000) + " s, " +
                        std::to_string(c.start_failures) + " times (the last pid " +
                        std::to_string(pid) + " was killed)"));
  }
  return false;
}

std::optional<Clock::TimePoint> PoolClient::NextDeadline(Clock::TimePoint now) const {
  std::optional<Clock::TimePoint> next;
  auto take = [&](Clock::TimePoint t) {
    if (!next || t < *next) next = t;
  };
  for (const Conn& c : conns_) {
    if (c.state == ConnState::kIdle || c.state == ConnState::kAwaitRecord) {
      take(now + std::chrono::milliseconds(10));
    }
    // CheckHung's looks (never at a worker without a pid: it is not killed).
    if (opts_.timeout.count() > 0 && !c.hung_killed &&
        ((c.state == ConnState::kReady && !c.queue.empty() && c.pid > 0) ||
         c.state == ConnState::kAwaitHello)) {
      take(c.hang_clock.NextLook(opts_.timeout));
    }
  }
  if (opts_.on_tick && opts_.tick_interval.count() > 0) take(next_tick_);
  return next;
}

void PoolClient::IoLoop() {
  std::vector<pollfd> fds;
  std::vector<int> owners;
  while (true) {
    int timeout_ms = -1;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (quit_) return;
      fds.clear();
      owners.clear();
      fds.push_back({slots_->wake_fd(), POLLIN, 0});
      for (const Conn& c : conns_) {
        if (c.fd >= 0) {
          fds.push_back({c.fd, POLLIN, 0});
          owners.push_back(c.id);
        }
      }
      if (auto d = NextDeadline(opts_.clock->Now())) {
        auto ms = std::chrono::ceil<std::chrono::milliseconds>(*d - opts_.clock->Now());
        timeout_ms = static_cast<int>(std::max<int64_t>(0, ms.count()));
      }
    }
    poll(fds.data(), fds.size(), timeout_ms);
    std::unique_lock<std::mutex> lock(mu_);
    if (quit_) return;
    if (fds[0].revents & POLLIN) {
      uint64_t v;
      [[maybe_unused]] ssize_t n = read(slots_->wake_fd(), &v, sizeof(v));
    }
    const auto now = opts_.clock->Now();
    for (size_t k = 1; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      Conn& c = conns_[static_cast<size_t>(owners[k - 1])];
      if (c.fd != fds[k].fd) continue;
      ReadConn(c, now);
    }
    CheckHung(now);
    for (Conn& c : conns_) {
      if (!error_.ok()) break;
      if (c.state == ConnState::kAwaitRecord) HandleDeath(c, now);
      if (c.state == ConnState::kIdle && now >= c.retry_at) Connect(c, now);
      if (c.state != ConnState::kReady && OutOfService(c, now) > ServiceTimeout()) {
        FailLocked(Status(
            StatusCode::kUnavailable,
            "loader: worker " + std::to_string(c.id) + " at " + c.path + " has not served for " +
                std::to_string(ServiceTimeout().count() / 1000) + " s" +
                c.hang_clock.Note(now, opts_.timeout) +
                (c.connect_error.empty() ? "" : " (" + c.connect_error + ")") + LastExitNote(c) +
                "; is its pool's owner (the agent, or this program's pool thread) "
                "still running?"));
      }
    }
    IssueTasks(now);
    cv_.notify_all();
    if (opts_.on_tick && opts_.tick_interval.count() > 0 && now >= next_tick_) {
      next_tick_ = now + opts_.tick_interval;
      lock.unlock();
      opts_.on_tick();
    }
  }
}

void PoolClient::ReadConn(Conn& c, Clock::TimePoint now) {
  std::string error;
  MessageReader::Result r = c.reader->ReadSome(/*block=*/false, &error);
  while (error_.ok()) {
    std::optional<Message> m = c.reader->Pop(&error);
    if (!m) break;
    HandleMessage(c, *m, now);  // may take the descriptor (an in-place probe's file)
    if (m->fd >= 0) close(m->fd);
    if (c.fd < 0) return;  // the handler dropped the connection
  }
  if (!error.empty() && r == MessageReader::Result::kOk) {
    FailLocked(Internal("loader: worker " + std::to_string(c.id) + ": " + error));
    return;
  }
  if (r != MessageReader::Result::kOk) ConnDown(c, now);
}

}  // namespace spawnpoint::loader
