#include "agent/run/standby_rank.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "agent/loader/protocol.h"
#include "agent/plan/node_plan.h"

namespace spawnpoint::agent {
namespace {

constexpr int kControlFd = 3;  // the standby's end of the socket, in the standby
constexpr size_t kMaxMessage = 1 << 20;
// Device nodes a GPU runtime opens when it creates a context (CUDA, ROCm): a standby holding
// one is never used.
const char* const kGpuDevicePrefixes[] = {"/dev/nvidia", "/dev/kfd", "/dev/dri/renderD"};

std::string EnvValue(const std::vector<std::string>& env, const std::string& name) {
  const std::string prefix = name + "=";
  for (const std::string& kv : env) {
    if (kv.rfind(prefix, 0) == 0) return kv.substr(prefix.size());
  }
  return "";
}

// The variables a Python interpreter reads while it starts, before any script: they must be
// the attempt's already (the standby cannot take them later).
bool FixedAtStart(const std::string& kv) {
  const std::string name = kv.substr(0, kv.find('='));
  return name.rfind("PYTHON", 0) == 0 || name == "LD_LIBRARY_PATH" || name == "LD_PRELOAD" ||
         name == "SPAWNPOINT_SHIM" || name == "PATH";
}

std::vector<std::string> FixedPart(const std::vector<std::string>& env) {
  std::vector<std::string> out;
  for (const std::string& kv : env) {
    if (FixedAtStart(kv)) out.push_back(kv);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string Resolve(const std::string& path, const std::string& dir) {
  if (path.empty() || path[0] == '/') return path;
  return (dir.empty() ? std::filesystem::current_path().string() : dir) + "/" + path;
}

// A descriptor of `pid` that is a GPU device node, or "".
std::string GpuDeviceHeld(pid_t pid) {
  std::error_code ec;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
    if (ec) continue;
    for (const char* prefix : kGpuDevicePrefixes) {
      if (target.rfind(prefix, 0) == 0) return target;
    }
  }
  return "";
}

}  // namespace

std::string FileStamp(const std::string& path) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return "";
  return std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec) + " " +
         std::to_string(st.st_size);
}

bool StandbyApplies(const SpawnOptions& rank) {
  return EnvValue(rank.env, "SPAWNPOINT_SHIM") == "1" && IsPythonCommand(rank.argv) &&
         rank.inherit_fds.empty();
}

StatusOr<std::unique_ptr<StandbyRank>> StandbyRank::Prepare(const SpawnOptions& rank,
                                                            const std::string& modules,
                                                            ProcessSpawner* spawner) {
  // The standby's imports run at idle CPU priority unless the job's environment asks for the
  // process's own (a node whose CPUs are never idle): spawnpoint_rank/_standby.py.
  if (const std::string p = EnvValue(rank.env, "SPAWNPOINT_STANDBY_PRIORITY");
      !p.empty() && p != "idle" && p != "normal") {
    return InvalidArgument("the environment's SPAWNPOINT_STANDBY_PRIORITY is \"" + p +
                           "\"; allowed: idle (the default), normal");
  }
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return Internal(std::string("standby: socketpair: ") + strerror(errno));
  }
  std::unique_ptr<StandbyRank> s(new StandbyRank());
  s->options_ = rank;
  SpawnOptions o = rank;
  o.env.push_back("SPAWNPOINT_STANDBY_FD=" + std::to_string(kControlFd));
  if (!modules.empty() && !FileStamp(modules).empty()) {
    o.env.push_back("SPAWNPOINT_STANDBY_MODULES=" + modules);
  }
  o.inherit_fds.push_back({sv[1], kControlFd});
  o.stdout_fd = o.stderr_fd = -1;  // the agent's, until the standby captures its own
  StatusOr<pid_t> pid = spawner->Spawn(o);
  ::close(sv[1]);
  if (!pid.ok()) {
    ::close(sv[0]);
    return pid.status().WithPrefix("standby");
  }
  ::fcntl(sv[0], F_SETFL, O_NONBLOCK);
  s->control_fd_ = sv[0];
  s->pid_ = *pid;
  StatusOr<std::string> interpreter =
      ResolveExecutable(rank.argv.front(), EnvValue(rank.env, "PATH"));
  if (interpreter.ok()) s->interpreter_ = *interpreter;
  s->script_ = Resolve(PythonScriptOf(rank.argv), rank.working_dir);
  s->interpreter_stamp_ = FileStamp(s->interpreter_);
  s->script_stamp_ = FileStamp(s->script_);
  return s;
}

StandbyRank::~StandbyRank() {
  if (control_fd_ >= 0) ::close(control_fd_);
  if (!released_ && !dead_ && pid_ > 0) {
    ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);
  }
}

void StandbyRank::Poll() {
  if (control_fd_ < 0 || dead_) return;
  char buf[4096];
  while (true) {
    const ssize_t n = ::read(control_fd_, buf, sizeof(buf));
    if (n > 0) {
      inbox_.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) dead_ = true;  // its end is closed: it exited
    break;                     // EAGAIN: nothing more now
  }
  while (inbox_.size() >= 4) {
    uint32_t length = 0;
    std::memcpy(&length, inbox_.data(), 4);  // little-endian, as the standby packs it
    if (length > kMaxMessage) {
      dead_ = true;  // not our standby speaking
      return;
    }
    if (inbox_.size() < 4 + length) return;
    nlohmann::json m = nlohmann::json::parse(inbox_.substr(4, length), nullptr, false);
    inbox_.erase(0, 4 + length);
    if (m.is_object() && m.value("ready", false)) {
      ready_ = true;
      gpu_ = m.value("gpu", false);
      if (m.contains("failed") && m["failed"].is_array()) {
        for (const auto& f : m["failed"]) {
          if (f.is_string()) failed_.push_back(f.get<std::string>());
        }
      }
    }
  }
}

std::string StandbyRank::Unusable(const SpawnOptions& attempt) const {
  if (dead_) return "it exited";
  if (!ready_) return "it was still importing";
  if (gpu_) return "it initialised a GPU (torch.cuda) while importing";
  if (std::string device = GpuDeviceHeld(pid_); !device.empty()) {
    return "it holds a GPU device (" + device + ")";
  }
  if (!failed_.empty()) return "the script's import of " + failed_.front();
  if (FileStamp(script_) != script_stamp_) return "the script " + script_ + " changed";
  if (FileStamp(interpreter_) != interpreter_stamp_) return interpreter_ + " changed";
  if (attempt.argv != options_.argv || attempt.working_dir != options_.working_dir) {
    return "the attempt's command differs";
  }
  if (attempt.cpus != options_.cpus) return "the attempt's CPUs differ";
  if (!attempt.inherit_fds.empty()) return "the attempt passes descriptors";
  if (FixedPart(attempt.env) != FixedPart(options_.env)) {
    return "the attempt's PYTHON*, PATH or LD_* variables differ";
  }
  return "";
}

StatusOr<pid_t> StandbyRank::Release(const SpawnOptions& attempt) {
  if (std::string why = Unusable(attempt); !why.empty()) return FailedPrecondition(why);
  nlohmann::json env = nlohmann::json::object();
  for (const std::string& kv : attempt.env) {
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  const std::string payload = nlohmann::json({{"release", {{"env", env}}}}).dump();
  std::string frame(4, '\0');
  const auto length = static_cast<uint32_t>(payload.size());
  std::memcpy(frame.data(), &length, 4);
  frame += payload;
  // The attempt's stdout and stderr go with the message: the standby makes them its 1 and 2.
  const Status sent = loader::SendWithFds(control_fd_, frame,
                                          {attempt.stdout_fd >= 0 ? attempt.stdout_fd : 1,
                                           attempt.stderr_fd >= 0 ? attempt.stderr_fd : 2});
  ::close(control_fd_);
  control_fd_ = -1;
  if (!sent.ok()) return sent.WithPrefix("standby: send");
  released_ = true;
  return pid_;
}

int64_t StandbyRank::MemoryBytes() const {
  std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return 0;
}

// ---- StandbyRanks ----

class StandbyRanks::Adopting : public ProcessSpawner {
 public:
  Adopting(StandbyRanks* owner, ProcessSpawner* inner) : owner_(owner), inner_(inner) {}

  StatusOr<pid_t> Spawn(const SpawnOptions& options) override {
    const std::string rank_text = EnvValue(options.env, "RANK");
    auto it = rank_text.empty() ? owner_->standbys_.end()
                                : owner_->standbys_.find(std::atoi(rank_text.c_str()));
    if (it == owner_->standbys_.end()) return inner_->Spawn(options);
    std::unique_ptr<StandbyRank> standby = std::move(it->second);
    owner_->standbys_.erase(it);
    standby->Poll();
    const std::string why = standby->Unusable(options);
    if (why.empty()) {
      StatusOr<pid_t> pid = standby->Release(options);
      if (pid.ok()) {
        owner_->say_("rank " + rank_text + " starts in its warm standby (pid " +
                     std::to_string(*pid) + ")");
        return pid;
      }
      owner_->say_("rank " + rank_text + "'s standby could not be released (" +
                   pid.status().message() + "): a fresh process starts");
    } else {
      owner_->say_("rank " + rank_text + "'s standby is not used (" + why +
                   "): a fresh process starts");
    }
    if (!standby->released() && !standby->dead()) owner_->dying_.push_back(standby->pid());
    return inner_->Spawn(options);  // `standby` goes: killed, reaped as one of ours
  }

 private:
  StandbyRanks* owner_;
  ProcessSpawner* inner_;
};

std::optional<MemoryUse> ReadCgroupMemory(const std::string& dir) {
  auto read = [&](const char* name) -> std::optional<int64_t> {
    std::ifstream in(dir + "/" + name);
    std::string word;
    if (!(in >> word) || word.empty() || !std::isdigit(static_cast<unsigned char>(word[0]))) {
      return std::nullopt;  // "max": no limit
    }
    return std::atoll(word.c_str());
  };
  std::optional<int64_t> limit = read("memory.max"), current = read("memory.current");
  if (!limit || !current || *limit <= 0) return std::nullopt;
  return MemoryUse{*current, *limit};
}

StandbyRanks::StandbyRanks(ProcessSpawner* spawner, Clock* clock, std::string modules_dir,
                           std::function<void(const std::string&)> say,
                           std::function<std::optional<MemoryUse>()> memory)
    : spawner_(spawner),
      clock_(clock),
      modules_dir_(std::move(modules_dir)),
      say_(std::move(say)),
      memory_(std::move(memory)) {}

StandbyRanks::~StandbyRanks() { Stop(); }

std::string StandbyRanks::ModulesFile(int rank) const {
  return modules_dir_ + "/rank-" + std::to_string(rank) + ".modules";
}

void StandbyRanks::Expect(std::map<int, SpawnOptions> next) {
  expected_.clear();
  stamps_at_expect_.clear();
  expected_at_ = clock_->Now();
  for (auto& [rank, options] : next) {
    if (!StandbyApplies(options)) continue;
    stamps_at_expect_[rank] = FileStamp(ModulesFile(rank));
    expected_[rank] = std::move(options);
  }
}

void StandbyRanks::Tick() {
  if (off_) return;
  const bool late = clock_->Now() - expected_at_ >= kPrepareAfter;
  for (auto it = expected_.begin(); it != expected_.end();) {
    const int rank = it->first;
    // Due once this attempt's rank wrote its modules (its first step), or late.
    const bool stepped = FileStamp(ModulesFile(rank)) != stamps_at_expect_[rank];
    if (standbys_.count(rank) || (!stepped && !late)) {
      it = standbys_.count(rank) ? expected_.erase(it) : std::next(it);
      continue;
    }
    StatusOr<std::unique_ptr<StandbyRank>> s =
        StandbyRank::Prepare(it->second, ModulesFile(rank), spawner_);
    if (!s.ok()) {
      say_("no standby for rank " + std::to_string(rank) + ": " + s.status().message());
    } else {
      standbys_[rank] = std::move(s).value();
    }
    it = expected_.erase(it);  // prepared once per Expect(); one that dies is not replaced
  }
  bool newly_ready = false;
  for (auto& [rank, standby] : standbys_) {
    const bool was_ready = standby->ready();
    standby->Poll();
    if (!was_ready && standby->ready()) {
      newly_ready = true;
      say_("rank " + std::to_string(rank) + "'s standby (pid " + std::to_string(standby->pid()) +
           ") is ready for a restart, " + std::to_string(standby->MemoryBytes() >> 20) + " MiB");
    }
  }
  if (!newly_ready || !memory_) return;
  const std::optional<MemoryUse> use = memory_();
  if (use &&
      static_cast<double>(use->current) > kMemoryLimitShare * static_cast<double>(use->limit)) {
    say_("standby ranks are off for this job: with them the pod uses " +
         std::to_string(use->current >> 20) + " MiB of its " + std::to_string(use->limit >> 20) +
         " MiB memory limit (more than " +
         std::to_string(static_cast<int>(kMemoryLimitShare * 100)) +
         "%); restarts start fresh processes");
    Stop();
    off_ = true;
  }
}

std::vector<pid_t> StandbyRanks::Pids() const {
  std::vector<pid_t> pids;  // the dying ones are not kept: the gang's reaping takes them
  for (const auto& [rank, standby] : standbys_) pids.push_back(standby->pid());
  return pids;
}

bool StandbyRanks::OnChildExited(pid_t pid) {
  auto dying = std::find(dying_.begin(), dying_.end(), pid);
  if (dying != dying_.end()) {
    dying_.erase(dying);
    return true;
  }
  for (auto& [rank, standby] : standbys_) {
    if (standby->pid() == pid) {
      standby->Exited();
      return true;
    }
  }
  return false;
}

ProcessSpawner* StandbyRanks::SpawnerFor(ProcessSpawner* inner) {
  adopting_ = std::make_unique<Adopting>(this, inner);
  return adopting_.get();
}

void StandbyRanks::Stop() {
  for (auto& [rank, standby] : standbys_) {
    if (!standby->released() && !standby->dead()) dying_.push_back(standby->pid());
  }
  standbys_.clear();  // each destructor SIGKILLs its process group
  expected_.clear();
}

std::map<int, int64_t> StandbyRanks::Memory() const {
  std::map<int, int64_t> out;
  for (const auto& [rank, standby] : standbys_) out[rank] = standby->MemoryBytes();
  return out;
}

std::set<int> StandbyRanks::Ready() const {
  std::set<int> out;
  for (const auto& [rank, standby] : standbys_) {
    if (standby->ready()) out.insert(rank);
  }
  return out;
}

}  // namespace spawnpoint::agent
