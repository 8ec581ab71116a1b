#include "agent/loader/contract.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

namespace spawnpoint::loader {

std::string WorkerSocketPath(const std::string& dir, int worker) {
  return dir + "/worker-" + std::to_string(worker) + ".sock";
}

std::string WorkerExitRecordPath(const std::string& dir, int worker) {
  return dir + "/worker-" + std::to_string(worker) + ".exit.json";
}

std::string WorkerPidPath(const std::string& dir, int worker) {
  return dir + "/worker-" + std::to_string(worker) + ".pid";
}

pid_t ReadWorkerPid(const std::string& dir, int worker) {
  std::ifstream in(WorkerPidPath(dir, worker));
  long long pid = 0;
  if (!(in >> pid) || pid <= 0 || pid > std::numeric_limits<pid_t>::max()) return 0;
  return static_cast<pid_t>(pid);
}

std::string StatsPath(const std::string& dir) { return dir + "/stats.json"; }
std::string ServiceSocketPath(const std::string& pool_dir) { return pool_dir + "/service.sock"; }

nlohmann::json WorkerExitRecord::ToJson() const {
  return {{"workerId", worker_id},
          {"pid", pid},
          {"incarnation", incarnation},
          {"exitCode", status.ShellCode()},
          {"signal", status.signal != 0 ? agent::SignalName(status.signal) : ""},
          {"signalNumber", status.signal},
          {"reason", agent::ExitReasonName(cause.reason)},
          {"message", cause.message},
          {"stderrTail", stderr_tail}};
}

StatusOr<WorkerExitRecord> WorkerExitRecord::FromJson(const nlohmann::json& j) {
  if (!j.is_object()) return InvalidArgument("exit record: not a JSON object");
  WorkerExitRecord r;
  try {
    r.worker_id = j.value("workerId", 0);
    r.pid = j.at("pid").get<pid_t>();
    r.incarnation = j.at("incarnation").get<int>();
    const int code = j.at("exitCode").get<int>();
    r.status.signal = j.value("signalNumber", 0);
    r.status.exit_code = r.status.signal != 0 ? 0 : code;
    const std::string reason = j.value("reason", "");
    for (auto reason_enum : {agent::ExitReason::kSucceeded, agent::ExitReason::kUserError,
                             agent::ExitReason::kOomKilled, agent::ExitReason::kShmExhausted,
                             agent::ExitReason::kKilled, agent::ExitReason::kTerminated,
                             agent::ExitReason::kCrashed}) {
      if (reason == agent::ExitReasonName(reason_enum)) r.cause.reason = reason_enum;
    }
    r.cause.message = j.value("message", "");
    if (j.contains("stderrTail"))
      r.stderr_tail = j.at("stderrTail").get<std::vector<std::string>>();
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("exit record: ") + e.what());
  }
  return r;
}

std::string WorkerExitRecord::Describe() const {
  std::string s = "exit code " + std::to_string(status.ShellCode());
  if (status.signal != 0) s += " (" + agent::SignalName(status.signal) + ")";
  s += ", reason " + std::string(agent::ExitReasonName(cause.reason)) + ": " + cause.message;
  return s;
}

Status WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Internal("write " + tmp + ": " + strerror(errno));
  size_t off = 0;
  while (off < text.size()) {
    ssize_t n = write(fd, text.data() + off, text.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      close(fd);
      unlink(tmp.c_str());
      return Internal("write " + tmp + ": " + strerror(e));
    }
    off += static_cast<size_t>(n);
  }
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    unlink(tmp.c_str());
    return Internal("rename " + tmp + " -> " + path + ": " + strerror(e));
  }
  return Status::Ok();
}

StatusOr<WorkerExitRecord> ReadExitRecord(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("no exit record at " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  auto j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded()) return InvalidArgument("exit record " + path + ": malformed JSON");
  return WorkerExitRecord::FromJson(j);
}

StatusOr<CpuSpec> ParseCpuSpec(const std::string& text) {
  CpuSpec spec;
  if (text.empty()) return InvalidArgument("empty CPU list");
  if (text.find_first_of(",-") == std::string::npos) {
    char* end = nullptr;
    long n = strtol(text.c_str(), &end, 10);
    if (*end != '\0' || n <= 0) return InvalidArgument("bad CPU count \"" + text + "\"");
    spec.count = static_cast<int>(n);
    return spec;
  }
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    int a = 0, b = 0;
    char dash = 0;
    std::istringstream p(part);
    if (!(p >> a)) return InvalidArgument("bad CPU list \"" + text + "\"");
    b = a;
    if (p >> dash) {
      if (dash != '-' || !(p >> b) || b < a)
        return InvalidArgument("bad CPU list \"" + text + "\"");
    }
    for (int c = a; c <= b; ++c) spec.ids.push_back(c);
  }
  spec.count = static_cast<int>(spec.ids.size());
  if (spec.count == 0) return InvalidArgument("bad CPU list \"" + text + "\"");
  return spec;
}

int AffinityCpuCount() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

}  // namespace spawnpoint::loader
