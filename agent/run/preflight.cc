#include "agent/run/preflight.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

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
