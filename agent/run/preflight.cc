#include "agent/run/preflight.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "agent/supervisor/port_holder.h"

namespace spawnpoint::agent {

uint64_t SharedMemoryNeeded(const api::TrainingJobSpec& spec, int ranks, int cpus_per_rank) {
  const int workers = spec.loader.workers_per_rank ? *spec.loader.workers_per_rank
                                                   : std::min(8, std::max(1, cpus_per_rank));
  const uint64_t estimate = static_cast<uint64_t>(ranks) * std::max(1, workers) *
                            static_cast<uint64_t>(spec.loader.prefetch_factor) *
                            kAssumedBatchSlotBytes;
  return std::min<uint64_t>(estimate, static_cast<uint64_t>(spec.shm_size_bytes));
}

Status CheckSharedMemory(const api::TrainingJobSpec& spec, int ranks, int cpus_per_rank,
                         const std::string& shm_path) {
  struct statvfs st {};
  if (statvfs(shm_path.c_str(), &st) != 0) {
    return FailedPrecondition("shared memory " + shm_path + " is not usable: " + strerror(errno) +
                              "; the data loader passes batches through it");
  }
  const uint64_t free_bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  const uint64_t total = static_cast<uint64_t>(st.f_blocks) * st.f_frsize;
  const uint64_t need = SharedMemoryNeeded(spec, ranks, cpus_per_rank);
  if (free_bytes >= need) return Status::Ok();
  const int workers = spec.loader.workers_per_rank.value_or(-1);
  return FailedPrecondition(
      shm_path + " has " + FormatBytes(free_bytes) + " free (" + FormatBytes(total) +
      " in all) but " + std::to_string(ranks) + " ranks x " +
      (workers >= 0 ? std::to_string(std::max(1, workers)) : std::string("auto")) +
      " loader workers x prefetchFactor " + std::to_string(spec.loader.prefetch_factor) +
      " need about " + FormatBytes(need) +
      ": batches would die with SIGBUS (\"Bus error\"). Fix: set spec.shmSize (the operator "
      "mounts that much memory at /dev/shm), or run the container with --shm-size, or lower "
      "loader.workersPerRank/prefetchFactor");
}

namespace {

// Whether bind() and listen() on the wildcard address of `family` at `port` work: 0, else the
// errno of the first that failed (EAFNOSUPPORT where the family is not there).
int TryListen(int family, int port) {
  const int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  const int on = 1, off = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  int rc = 0;
  if (family == AF_INET6) {
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_any;
    addr.sin6_port = htons(static_cast<uint16_t>(port));
    rc = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } else {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    rc = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  }
  if (rc == 0) rc = listen(fd, 1);
  const int error = rc == 0 ? 0 : errno;
  close(fd);
  return error;
}

}  // namespace

std::optional<std::string> RendezvousPortInUse(int port, pid_t self, const std::string& proc_root) {
  if (port <= 0 || port > 65535) return std::nullopt;
  const int v6 = TryListen(AF_INET6, port);
  if (v6 == 0) return std::nullopt;
  if (v6 != EADDRINUSE && v6 != EAFNOSUPPORT && v6 != EADDRNOTAVAIL) return std::nullopt;
  const int v4 = TryListen(AF_INET, port);
  if (v4 != EADDRINUSE) return std::nullopt;
  PortListeners listeners = FindPortListeners(port, proc_root);
  if (!listeners.holders.empty() &&
      std::all_of(listeners.holders.begin(), listeners.holders.end(),
                  [&](const PortHolder& h) { return h.pid == self; })) {
    return std::nullopt;
  }
  const std::string holders = DescribePortHolders(listeners);
  return "port " + std::to_string(port) +
         ", the job's rendezvous port (MASTER_PORT), is already in use on this node" +
         (holders.empty() ? "" : ", " + holders) +
         ": rank 0 could not listen there, so nothing was started. Stop that process, or give "
         "this job another port: spec.rendezvous.port, or --master-port (0 picks a free one)";
}

namespace {

// The script the trainer's command runs and the element of command + args (as written) that
// names it; nullopt when it runs none that is certainly a file.
std::optional<std::pair<std::string, size_t>> ScriptOf(const api::TrainerContainer& t) {
  if (t.torchrun) {
    const api::TorchrunLaunch& l = *t.torchrun;
    if (l.module || l.no_python || l.original.size() < l.program_args.size() + 1) {
      return std::nullopt;
    }
    // The script's own arguments end the command; before them the script, or the `--` after
    // it that torchrun drops.
    size_t i = l.original.size() - l.program_args.size() - 1;
    if (l.original[i] == "--" && i > 0 && l.original[i - 1] == l.program) --i;
    if (l.original[i] != l.program) return std::nullopt;
    return std::make_pair(l.program, i);
  }
  std::vector<std::string> argv = t.command;
  argv.insert(argv.end(), t.args.begin(), t.args.end());
  size_t skip = 0;  // `env NAME=value ... python3 train.py`
  if (!argv.empty() && std::filesystem::path(argv[0]).filename() == "env") {
    for (skip = 1; skip < argv.size() && argv[skip].find('=') != std::string::npos; ++skip) {
    }
  }
  const std::vector<std::string> rest(argv.begin() + static_cast<std::ptrdiff_t>(skip), argv.end());
  const std::optional<size_t> at = PythonScriptIndex(rest);
  if (!at || rest[*at].empty()) return std::nullopt;
  return std::make_pair(rest[*at], *at + skip);
}

// "; Python files there: a.py, b.py" (five at most), or "".
std::string PythonFilesIn(const std::filesystem::path& dir) {
  std::error_code ec;
  std::vector<std::string> names;
  for (auto it = std::filesystem::directory_iterator(dir, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    if (it->path().extension() == ".py") names.push_back(it->path().filename().string());
  }
  if (names.empty()) return "";
  std::sort(names.begin(), names.end());
  std::string out = "; Python files there: ";
  for (size_t i = 0; i < names.size() && i < 5; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 5) out += ", ...";
  return out;
}

}  // namespace

Status CheckScript(const api::TrainerContainer& trainer, const std::string& cwd) {
  const auto script = ScriptOf(trainer);
  if (!script) return Status::Ok();
  const auto& [name, element] = *script;
  namespace fs = std::filesystem;
  // An absolute workingDir replaces cwd; a relative one goes under it.
  const fs::path dir =
      trainer.working_dir.empty() ? fs::path(cwd) : cwd / fs::path(trainer.working_dir);
  const fs::path path = fs::path(name).is_absolute() ? fs::path(name) : dir / name;
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 || (errno != ENOENT && errno != ENOTDIR)) return Status::Ok();
  // Located where a manifest wrote it; a command line's job has no origins.
  const bool located = element < trainer.argv_origins.size();
  std::string what = (located ? trainer.argv_origins[element] + ": " : std::string()) +
                     "the script \"" + name + "\" does not exist";
  if (!fs::path(name).is_absolute()) {
    what += " in " + dir.lexically_normal().string() +
            (!trainer.working_dir.empty() ? " (the container's workingDir)"
             : located ? " (the agent's working directory: the container sets no workingDir)"
                       : " (the agent's working directory)");
  }
  return InvalidArgument(what +
                         ": every rank would exit 2 (\"can't open file\"), so nothing was "
                         "started" +
                         PythonFilesIn(path.parent_path()));
}

StatusOr<std::string> ResolveRankExecutable(const RankPlan& rank) {
  if (rank.argv.empty()) return InvalidArgument("command is empty");
  std::string name = rank.argv.front();
  if (!rank.working_dir.empty() && name.find('/') != std::string::npos && name[0] != '/') {
    name = rank.working_dir + "/" + name;  // ./train: where the rank starts, not the agent
  }
  const std::string path = rank.env.count("PATH") ? rank.env.at("PATH") : "/usr/bin:/bin";
  SP_ASSIGN_OR_RETURN(std::string resolved, ResolveExecutable(name, path));
  std::filesystem::path p(resolved);
  if (p.is_relative()) {
    // A relative name with a '/', or a relative PATH entry: from where the rank starts.
    std::error_code ec;
    p = (rank.working_dir.empty() ? std::filesystem::current_path(ec)
                                  : std::filesystem::path(rank.working_dir)) /
        p;
  }
  return p.lexically_normal().string();
}

namespace {

std::string LastLine(const std::string& text) {
  size_t end = text.find_last_not_of(" \n\r\t");
  if (end == std::string::npos) return "";
  size_t start = text.rfind('\n', end);
  return text.substr(start == std::string::npos ? 0 : start + 1, end + 1 - (start + 1));
}

}  // namespace

TorchProbe ProbeTorch(ProcessSpawner* spawner, const std::string& interpreter, const RankPlan& rank,
                      std::chrono::milliseconds timeout) {
  TorchProbe probe;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    probe.error = std::string("cannot make a pipe: ") + strerror(errno);
    return probe;
  }
  SpawnOptions so;
  so.argv = {interpreter, "-c", "import sys, torch; sys.stdout.write(torch.__version__)"};
  for (const auto& [k, v] : rank.env) {
    if (k.rfind("SPAWNPOINT_", 0) != 0) so.env.push_back(k + "=" + v);
  }
  so.working_dir = rank.working_dir;
  so.stdout_fd = fds[1];
  // Its errors on stderr, apart: the version alone on stdout.
  int errs[2];
  if (pipe2(errs, O_CLOEXEC) != 0) {
    probe.error = std::string("cannot make a pipe: ") + strerror(errno);
    close(fds[0]);
    close(fds[1]);
    return probe;
  }
  so.stderr_fd = errs[1];
  auto pid = spawner->Spawn(so);
  close(fds[1]);
  close(errs[1]);
  if (!pid.ok()) {
    close(fds[0]);
    close(errs[0]);
    probe.error = pid.status().message();
    return probe;
  }
  std::string out, err;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool timed_out = false;
  std::vector<pollfd> open = {{fds[0], POLLIN, 0}, {errs[0], POLLIN, 0}};
  while (open[0].fd >= 0 || open[1].fd >= 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    int n = poll(open.data(), open.size(), static_cast<int>(left.count()) + 1);
    if (n < 0 && errno != EINTR) break;
    for (size_t i = 0; i < open.size(); ++i) {
      if (open[i].fd < 0 || !(open[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      ssize_t got = read(open[i].fd, buf, sizeof(buf));
      if (got > 0) {
        (i == 0 ? out : err).append(buf, got);
      } else if (got == 0 || errno != EINTR) {
        close(open[i].fd);
        open[i].fd = -1;
      }
    }
  }
  for (auto& p : open) {
    if (p.fd >= 0) close(p.fd);
  }
  if (timed_out) kill(-*pid, SIGKILL);  // its own process group
  int status = 0;
  while (waitpid(*pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    probe.error = "no answer in " + std::to_string(timeout.count() / 1000) + " s";
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && !out.empty()) {
    probe.version = out;
  } else {
    probe.error = LastLine(err);
    if (probe.error.empty()) {
      probe.error = WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                                        : "exit code " + std::to_string(WEXITSTATUS(status));
    }
  }
  return probe;
}

}  // namespace spawnpoint::agent
