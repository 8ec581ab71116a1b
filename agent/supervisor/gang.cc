#include "agent/supervisor/gang.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <tuple>

#include "agent/supervisor/failure_cause.h"
#include "agent/supervisor/log_tail.h"
#include "agent/supervisor/port_holder.h"
#include "agent/supervisor/process_table.h"

namespace spawnpoint::agent {
namespace {

using Ms = std::chrono::milliseconds;

// How often a stopping attempt checks whether its processes are past their user code.
constexpr Ms kExitingPoll{1};

void WriteAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = write(fd, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a closed terminal must not stop supervision
    off += static_cast<size_t>(n);
  }
}

// Splits a child's byte stream into lines and writes each, prefixed, in one write() so
// lines from different ranks never interleave mid-line.
struct OutputStream {
  int fd = -1;  // read end of the pipe; -1 once closed
  int sink = 1;
  std::string prefix;
  std::string partial;
  LogTail* tail = nullptr;                          // the member's last lines of this stream
  size_t member = 0;                                // index into the gang's members
  std::function<void(const std::string&)> on_line;  // GangOptions::on_stderr_line, bound

  static constexpr size_t kMaxLine = 64 * 1024;

  void Emit(const std::string& line) {
    WriteAll(sink, prefix + line + "\n");
    if (tail) tail->Add(line);
    if (on_line) on_line(line);
  }

  // Returns false at end of stream.
  bool ReadAvailable() {
    char buf[65536];
    while (true) {
      ssize_t n = read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return true;
      if (n <= 0) {
        Flush();
        return false;
      }
      partial.append(buf, static_cast<size_t>(n));
      size_t start = 0;
      for (size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1) {
        Emit(partial.substr(start, nl - start));
      }
      partial.erase(0, start);
      if (partial.size() > kMaxLine) Flush();
    }
  }

  void Flush() {
    if (!partial.empty()) Emit(partial);
    partial.clear();
  }

  void Close() {
    if (fd >= 0) close(fd);
    fd = -1;
  }
};

struct Running {
  GangMember* member = nullptr;
  pid_t pid = 0;
  bool exited = false;
  ExitStatus status;
  size_t index = 0;  // into the gang's members
};

// What a member wrote: its stderr's and its stdout's last lines.
struct MemberOutput {
  LogTail err;
  LogTail out;
};

// The member's last words: stderr's tail, or stdout's when stderr said nothing; and the cause
// they name, read from stderr first.
void AddLastWords(const MemberOutput& output, RankFailure& f) {
  const bool use_err = !output.err.empty();
  const LogTail& tail = use_err ? output.err : output.out;
  if (tail.empty()) return;
  f.log_tail = tail.Text(kMaxLogTailLines, kMaxLogTailBytes);
  f.log_stream = use_err ? "stderr" : "stdout";
  std::optional<TailMatch> match = MatchTail(output.err.Lines());
  if (!match) match = MatchTail(output.out.Lines());
  // Now, while the holder of a port the rank could not bind still holds it.
  if (match && match->port > 0) {
    AddPortHolders(&*match, DescribePortHolders(FindPortListeners(match->port)));
  }
  f.cause = RefineWithTail(f.cause, f.status, match);
}

}  // namespace

int GangResult::ExitCode() const {
  switch (outcome) {
    case GangOutcome::kSucceeded:
      return 0;
    case GangOutcome::kFailed:
      return failure ? failure->status.ShellCode() : 1;
    case GangOutcome::kInterrupted:
      return 128 + interrupt_signal;
  }
  return 1;
}

Status BecomeSubreaper() {
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    return Internal(std::string("prctl(PR_SET_CHILD_SUBREAPER): ") + strerror(errno));
  }
  return Status::Ok();
}

std::vector<pid_t> OrphanedChildren(const std::vector<pid_t>& known) {
  std::vector<pid_t> out;
  const pid_t self = getpid();
  for (const ProcEntry& e : ListProcesses()) {
    if (e.ppid == self && std::find(known.begin(), known.end(), e.pid) == known.end()) {
      out.push_back(e.pid);
    }
  }
  return out;
}

bool GangIsExiting(const std::vector<pid_t>& members, const std::vector<pid_t>& known) {
  const std::vector<ProcEntry> table = ListProcesses();
  // The members, their groups and every descendant (a daemon that left the group too).
  std::set<pid_t> gang(members.begin(), members.end());
  const std::set<pid_t> groups(members.begin(), members.end());
  const std::set<pid_t> skip(known.begin(), known.end());  // nor what they started
  gang.insert(getpid());
  for (bool grew = true; grew;) {
    grew = false;
    for (const ProcEntry& e : table) {
      if (!gang.count(e.pid) && !skip.count(e.pid) &&
          (gang.count(e.ppid) || groups.count(e.pgid))) {
        grew = gang.insert(e.pid).second || grew;
      }
    }
  }
  gang.erase(getpid());
  return std::all_of(gang.begin(), gang.end(), [](pid_t p) { return ProcessIsExiting(p); });
}

void AwaitLeftovers(const std::vector<pid_t>& groups, SignalWatcher* signals, Clock* clock,
                    std::chrono::milliseconds grace,
                    const std::function<std::vector<pid_t>()>& keep_pids,
                    const std::function<bool(pid_t, int)>& on_other_exit) {
  auto kept = [&] { return keep_pids ? keep_pids() : std::vector<pid_t>{}; };
  const auto deadline = clock->Now() + grace;
  int sig = SIGTERM;
  while (true) {
    // One /proc scan per round: who is left is also who gets the signal.
    const std::vector<pid_t> left = OrphanedChildren(kept());
    bool any = !left.empty();
    for (pid_t g : groups) any = any || kill(-g, 0) == 0;
    if (!any) break;
    if (clock->Now() >= deadline) sig = SIGKILL;
    for (pid_t g : groups) kill(-g, sig);
    for (pid_t p : left) kill(p, sig);
    pollfd p{signals->fd(), POLLIN, 0};
    poll(&p, 1, 20);
    for (int s : signals->Drain()) {
      if (IsTerminationSignal(s)) signals->Requeue(s);  // for whoever runs next
    }
    int wstatus = 0;
    for (pid_t pid; (pid = waitpid(-1, &wstatus, WNOHANG)) > 0;) {
      if (on_other_exit) on_other_exit(pid, wstatus);
    }
  }
}

Gang::Gang(ProcessSpawner* spawner, SignalWatcher* signals, GangOptions options)
    : spawner_(spawner), signals_(signals), options_(std::move(options)) {}

GangResult Gang::Run(std::vector<GangMember> members) {
  GangResult result;
  const auto oom_before = ReadOomKillCount(options_.memory_events_path);
  std::vector<Running> running;
  std::vector<OutputStream> streams;
  std::vector<MemberOutput> outputs(members.size());
  running.reserve(members.size());
  // Failures that may be the attempt's cause: the first, and members that failed by themselves
  // after it (not by the gang's own SIGTERM or SIGKILL); PickRootCause chooses among them.
  std::vector<RankFailure> candidates;
  // When each member last began a Python traceback on its stderr (GangOptions::dying_wait).
  std::vector<std::optional<Clock::TimePoint>> traceback_at(members.size());
  // While set, the first failure is a collective one and a member is dying by itself: the
  // others are stopped at this time at the latest.
  std::optional<Clock::TimePoint> settle_until;

  bool stopping = false;
  bool killed = false;
  bool interrupt_told = false;  // options_.on_interrupt called
  Clock* const clock = options_.clock;
  Clock::TimePoint kill_deadline{};
  // Failure times are wall-clock (they are compared across nodes), read through the clock.
  const auto wall_base = std::chrono::system_clock::now();
  const Clock::TimePoint clock_base = clock->Now();
  auto wall_ms = [&] {
    const auto wall = wall_base + std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                      clock->Now() - clock_base);
    return std::chrono::duration_cast<Ms>(wall.time_since_epoch()).count();
  };

  auto begin_stop = [&](int sig) {
    if (!stopping) {
      stopping = true;
      kill_deadline = clock->Now() + options_.grace_period;
    }
    for (auto& r : running) {
      if (!r.exited) kill(-r.pid, sig);
    }
  };
  bool failure_stop_told = false;
  auto stop_for_failure = [&] {
    if (!failure_stop_told && options_.before_failure_stop) {
      std::vector<pid_t> stopped;
      for (const auto& r : running) {
        if (!r.exited) stopped.push_back(r.pid);
      }
      options_.before_failure_stop(stopped);
    }
    failure_stop_told = true;
    begin_stop(SIGTERM);
  };
  // The member's failure: its exit's cause refined by its last lines (read to the end of
  // what it wrote), then, for a member that is itself an agent, by its report.
  auto make_failure = [&](Running& r, ExitStatus status) {
    RankFailure f;
    f.rank = r.member->rank;
    f.local_rank = r.member->local_rank;
    f.node_rank = r.member->node_rank;
    f.pid = r.pid;
    f.status = status;
    f.failed_at_ms = wall_ms();
    f.cause = ClassifyExit(status, oom_before, ReadOomKillCount(options_.memory_events_path));
    for (auto& s : streams) {
      if (s.member != r.index || s.fd < 0) continue;
      if (!s.ReadAvailable()) s.Close();
      s.Flush();  // it has exited: a line without its newline is its last
    }
    AddLastWords(outputs[r.index], f);
    bool refined = true;
    if (options_.refine_failure) refined = options_.refine_failure(f);
    return std::pair{f, refined};
  };
  auto record_failure = [&](Running& r, ExitStatus status) {
    if (result.failure || result.outcome == GangOutcome::kInterrupted) return;
    RankFailure f = make_failure(r, status).first;
    result.outcome = GangOutcome::kFailed;
    result.failure = f;
    candidates.push_back(f);
    if (options_.on_failure) options_.on_failure(f);
  };
  // A member that failed after the gang began to stop: a candidate unless the gang's own
  // signal ended it (a member that is an agent reports what its ranks did, when they failed).
  auto record_later_failure = [&](Running& r, ExitStatus status) {
    if (!result.failure) return;
    if (options_.refine_failure) {
      auto [f, refined] = make_failure(r, status);
      if (refined) candidates.push_back(f);
      return;
    }
    if (status.signal == SIGTERM || status.signal == SIGKILL) return;
    candidates.push_back(make_failure(r, status).first);
  };

  // Start every member; a member that cannot start fails the gang like one that died.
  for (auto& m : members) {
    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    if (m.prefix_output) {
      if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
        WriteAll(options_.error_fd, std::string("[spawnpoint] pipe: ") + strerror(errno) + "\n");
        break;
      }
      m.spawn.stdout_fd = out_pipe[1];
      m.spawn.stderr_fd = err_pipe[1];
    }
    auto pid = spawner_->Spawn(m.spawn);
    if (m.prefix_output) {
      close(out_pipe[1]);
      close(err_pipe[1]);
    }
    if (!pid.ok()) {
      if (m.prefix_output) {
        close(out_pipe[0]);
        close(err_pipe[0]);
      }
      WriteAll(options_.error_fd, "[spawnpoint] " + m.label + ": " + pid.status().message() + "\n");
      const size_t index = static_cast<size_t>(&m - members.data());
      Running r{&m, 0, true, {}, index};
      record_failure(r, ExitStatus{127, 0});
      result.failure->cause = {ExitReason::kUserError, pid.status().message()};
      candidates.back() = *result.failure;
      break;
    }
    const size_t index = static_cast<size_t>(&m - members.data());
    running.push_back(Running{&m, *pid, false, {}, index});
    if (m.prefix_output) {
      for (auto [fd, sink, tail] :
           {std::tuple{out_pipe[0], options_.output_fd, &outputs[index].out},
            std::tuple{err_pipe[0], options_.error_fd, &outputs[index].err}}) {
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        streams.push_back(OutputStream{fd, sink, "[" + m.label + "] ", "", tail, index});
        if (fd == err_pipe[0]) {
          streams.back().on_line = [&on_line = options_.on_stderr_line, &traceback_at, clock, index,
                                    pid = *pid](const std::string& line) {
            if (StartsPythonTraceback(line)) traceback_at[index] = clock->Now();
            if (on_line) on_line(pid, line);
          };
        }
      }
    }
  }
  if (result.failure) stop_for_failure();
  std::vector<pid_t> groups;  // each member leads its own process group
  for (auto& r : running) groups.push_back(r.pid);
  auto kept = [&] { return options_.keep_pids ? options_.keep_pids() : std::vector<pid_t>{}; };
  // A failed attempt may end once nothing of it can run user code again (overlap_exit).
  auto overlapping = [&] {
    return options_.overlap_exit && stopping && result.outcome == GangOutcome::kFailed;
  };
  // Members are checked every kExitingPoll; the whole table, once they are all exiting,
  // at doubling intervals (a descendant may take a while, and a scan reads all of /proc).
  Ms scan_every = kExitingPoll;
  Clock::TimePoint next_scan{};
  auto past_user_code = [&] {
    for (auto& r : running) {
      if (!r.exited && !ProcessIsExiting(r.pid)) return false;
    }
    const auto now = clock->Now();
    if (now < next_scan) return false;
    next_scan = now + scan_every;
    scan_every = std::min<Ms>(scan_every * 2, Ms(100));
    return GangIsExiting(groups, kept());
  };

  auto up_count = [&] {
    return static_cast<int>(
        std::count_if(running.begin(), running.end(), [](const Running& r) { return !r.exited; }));
  };
  auto next_status = clock->Now() + options_.status_interval;
  auto next_tick = clock->Now() + options_.tick_interval;
  if (options_.on_status) options_.on_status(up_count(), static_cast<int>(members.size()));

  // A member failing by itself: it began a traceback lately, or is past its user code.
  auto any_dying = [&] {
    const Clock::TimePoint now = clock->Now();
    return std::any_of(running.begin(), running.end(), [&](const Running& r) {
      if (r.exited) return false;
      const auto& traceback = traceback_at[r.index];
      return (traceback && now - *traceback <= options_.recent_traceback) ||
             ProcessIsExiting(r.pid);
    });
  };
  auto is_collective = [](const RankFailure& f) {
    return f.cause.reason == ExitReason::kCollectiveError ||
           f.cause.reason == ExitReason::kCollectiveTimeout;
  };

  auto reap = [&] {
    while (true) {
      int wstatus = 0;
      pid_t pid = waitpid(-1, &wstatus, WNOHANG);
      if (pid <= 0) break;
      auto it = std::find_if(running.begin(), running.end(),
                             [&](const Running& r) { return r.pid == pid; });
      if (it == running.end()) {
        // One of the caller's processes, or an orphaned descendant: reaped, nothing to report.
        if (options_.on_other_exit) options_.on_other_exit(pid, wstatus);
        continue;
      }
      it->exited = true;
      it->status = ExitStatus::FromWaitStatus(wstatus);
      if (!it->status.Success() && !stopping && !result.failure) {
        record_failure(*it, it->status);
        WriteAll(options_.error_fd, "[spawnpoint] " + result.failure->Line() + "\n");
        if (is_collective(*result.failure) && any_dying()) {
          settle_until = clock->Now() + options_.dying_wait;
        } else {
          stop_for_failure();
        }
      } else if (!it->status.Success()) {
        record_later_failure(*it, it->status);
      }
    }
  };

  while (up_count() > 0) {
    std::vector<pollfd> fds;
    fds.push_back({signals_->fd(), POLLIN, 0});
    for (auto& s : streams) {
      if (s.fd >= 0) fds.push_back({s.fd, POLLIN, 0});
    }
    auto now = clock->Now();
    auto wake = next_status;
    if (stopping && !killed) wake = std::min(wake, kill_deadline);
    if (settle_until && !stopping) wake = std::min(wake, *settle_until);
    if (options_.on_tick || options_.check_health) wake = std::min(wake, next_tick);
    int timeout = static_cast<int>(
        std::max<int64_t>(0, std::chrono::duration_cast<Ms>(wake - now).count()) + 1);
    if (overlapping()) timeout = std::min<int>(timeout, kExitingPoll.count());
    int n = poll(fds.data(), fds.size(), timeout);
    if (n < 0 && errno != EINTR) break;

    for (auto& s : streams) {
      if (s.fd >= 0) {
        for (auto& p : fds) {
          if (p.fd == s.fd && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
            if (!s.ReadAvailable()) s.Close();
          }
        }
      }
    }
    for (int sig : signals_->Drain()) {
      if (sig == SIGCHLD) continue;
      if (IsTerminationSignal(sig)) {
        if (stopping && result.outcome == GangOutcome::kInterrupted && sig == SIGINT) {
          // A second Ctrl-C: do not wait out the grace period.
          kill_deadline = clock->Now();
        }
        if (result.outcome != GangOutcome::kInterrupted && !result.failure) {
          result.outcome = GangOutcome::kInterrupted;
          result.interrupt_signal = sig;
        }
        WriteAll(options_.error_fd, "[spawnpoint] received " + SignalName(sig) + ", stopping " +
                                        std::to_string(up_count()) + " " + options_.what + "\n");
        if (options_.on_interrupt && !interrupt_told) {
          interrupt_told = true;
          options_.on_interrupt(sig);
        }
        begin_stop(SIGTERM);
      }
    }
    reap();
    if (settle_until && !stopping && (clock->Now() >= *settle_until || !any_dying())) {
      settle_until.reset();
      stop_for_failure();
    }
    if (overlapping() && up_count() > 0 && past_user_code()) {
      // The kernel is still releasing their memory and files; the caller's next waitpid()
      // collects them.
      result.teardown_pending = true;
      break;
    }

    now = clock->Now();
    if (stopping && !killed && now >= kill_deadline) {
      killed = true;
      if (up_count() > 0) {
        WriteAll(options_.error_fd, "[spawnpoint] grace period over: SIGKILL to " +
                                        std::to_string(up_count()) + " " + options_.what + "\n");
      }
      begin_stop(SIGKILL);
    }
    if ((options_.on_tick || options_.check_health) && now >= next_tick) {
      next_tick = now + options_.tick_interval;
      if (options_.on_tick) options_.on_tick();
      if (options_.check_health && !stopping) {
        std::vector<std::pair<int, pid_t>> up;
        for (auto& r : running) {
          if (!r.exited) up.emplace_back(r.member->rank, r.pid);
        }
        if (std::optional<RankFailure> f = options_.check_health(up); f && !result.failure) {
          result.outcome = GangOutcome::kFailed;
          if (f->failed_at_ms == 0) f->failed_at_ms = wall_ms();
          result.failure = std::move(f);
          candidates.push_back(*result.failure);
          // A failure of no rank of ours: the caller stops the ranks (the gang of nodes).
          WriteAll(
              options_.error_fd,
              "[spawnpoint] " +
                  (result.failure->rank < 0 ? "stopping the ranks: " + result.failure->cause.message
                                            : result.failure->Line()) +
                  "\n");
          stop_for_failure();
        }
      }
    }
    if (now >= next_status) {
      next_status = now + options_.status_interval;
      if (options_.on_status) options_.on_status(up_count(), static_cast<int>(members.size()));
    }
  }

  // Every member has exited (or, teardown_pending, is past its user code). Their pipes may
  // still be held by descendants: read what is there now, then stop the descendants and
  // reap them.
  for (auto& s : streams) {
    if (s.fd >= 0) {
      s.ReadAvailable();
      s.Flush();
    }
  }
  if (!result.teardown_pending) {
    AwaitLeftovers(groups, signals_, clock, std::min<Ms>(options_.grace_period, Ms(5000)),
                   options_.keep_pids, options_.on_other_exit);
  }
  for (auto& s : streams) {
    if (s.fd >= 0) {
      s.ReadAvailable();
      s.Flush();
      s.Close();
    }
  }
  if (result.failure && candidates.size() > 1) {
    const int first_rank = result.failure->rank, first_node = result.failure->node_rank;
    result.failure = PickRootCause(std::move(candidates));
    if (result.failure->rank != first_rank || result.failure->node_rank != first_node) {
      WriteAll(options_.error_fd,
               "[spawnpoint] the cause came first: " + result.failure->Line() + "\n");
    }
  }
  return result;
}

}  // namespace spawnpoint::agent
