// Warm standby ranks (issue 36). A StandbyRank is a spawned process that has done a Python
// rank's imports and waits, holding no GPU context, to become that rank on the next attempt;
// StandbyRanks keeps one per local rank of a node and hands them to the Gang through a
// ProcessSpawner that releases a usable standby instead of spawning. Both are owned by
// NodeAgent and used from its thread only (the one that spawns); not thread-safe.
//
// The standby's side is spawnpoint_rank/_standby.py: it is started with the rank's command
// and environment plus SPAWNPOINT_STANDBY_FD (a Unix socket), says when it is ready, and on
// release takes the attempt's environment and stdout/stderr (sent as descriptors) and runs
// the script as a fresh process would.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/process/spawner.h"
#include "common/clock.h"
#include "common/status.h"

namespace spawnpoint::agent {

class StandbyRank {
 public:
  // Spawns a standby with `rank`'s options (argv, environment, working directory, CPUs,
  // process group, death signal) and its control socket. `modules` is the file of modules
  // to preload ("": torch's usual ones). Returns at once; Poll() learns when it is ready.
  static StatusOr<std::unique_ptr<StandbyRank>> Prepare(const SpawnOptions& rank,
                                                        const std::string& modules,
                                                        ProcessSpawner* spawner);
  // SIGKILLs the process (its group) unless it was released; the caller reaps it.
  ~StandbyRank();
  StandbyRank(const StandbyRank&) = delete;
  StandbyRank& operator=(const StandbyRank&) = delete;

  pid_t pid() const { return pid_; }
  bool ready() const { return ready_; }
  bool released() const { return released_; }
  bool dead() const { return dead_; }
  // Reads what the standby said, without blocking: its ready message, or its end.
  void Poll();
  // The standby's process exited (the caller reaped it).
  void Exited() { dead_ = true; }
  // Why it cannot become the rank `attempt` describes now; "" when it can.
  std::string Unusable(const SpawnOptions& attempt) const;
  // Hands it the attempt: the environment, stdout and stderr (the descriptors are sent; the
  // caller keeps and closes its own). From now on its pid is the rank's.
  StatusOr<pid_t> Release(const SpawnOptions& attempt);
  // Its resident memory, from /proc (0 when gone).
  int64_t MemoryBytes() const;

 private:
  StandbyRank() = default;

  // Constant after Prepare.
  SpawnOptions options_;
  std::string script_, interpreter_;              // resolved paths, "" if none
  std::string script_stamp_, interpreter_stamp_;  // mtime and size at Prepare
  pid_t pid_ = 0;

  int control_fd_ = -1;
  std::string inbox_;  // bytes read, not yet a whole message
  bool ready_ = false;
  bool dead_ = false;
  bool gpu_ = false;
  bool released_ = false;
  std::vector<std::string> failed_;  // the script's imports that raised
};

// Whether a process of these options would get a standby: a Python rank under the shim.
bool StandbyApplies(const SpawnOptions& rank);

// The "mtime size" of a file, "" when it cannot be read.
std::string FileStamp(const std::string& path);

// The memory a pod uses and may use (cgroup v2 memory.current and memory.max in `dir`);
// nullopt without a limit.
struct MemoryUse {
  int64_t current = 0, limit = 0;
};
std::optional<MemoryUse> ReadCgroupMemory(const std::string& dir);

class StandbyRanks {
 public:
  // The share of the pod's memory limit beyond which standbys are given up.
  static constexpr double kMemoryLimitShare = 0.8;

  // `say` gets one line per standby made ready and per one not used (and why). `memory`
  // (may be empty) tells how much of its memory limit the pod uses: standbys that push it
  // past kMemoryLimitShare are stopped, for the rest of the job, said once.
  StandbyRanks(ProcessSpawner* spawner, Clock* clock, std::string modules_dir,
               std::function<void(const std::string&)> say,
               std::function<std::optional<MemoryUse>()> memory = {});
  ~StandbyRanks();  // Stop()

  // How long after Expect() a rank that has not written its modules file (ModulesFile: at
  // its first step once its loader workers have each served a batch) gets its standby all
  // the same.
  static constexpr std::chrono::seconds kPrepareAfter{60};

  // The next attempt's ranks, by rank: a standby is prepared for each that has none yet
  // (Python ranks only), once that rank of the running attempt has made a step with its
  // loader workers started (it writes what it imported, which the standby then preloads;
  // neither the attempt's start nor its workers' are slowed by standbys), or kPrepareAfter
  // has passed.
  void Expect(std::map<int, SpawnOptions> next);
  // Prepares the standbys Expect() asked for when due and polls the others. Call on the
  // spawning thread (PR_SET_PDEATHSIG) while an attempt runs.
  void Tick();
  // The standbys' pids (the Gang keeps them), and the exit of one (true if `pid` was one).
  std::vector<pid_t> Pids() const;
  bool OnChildExited(pid_t pid);
  // A spawner for the next attempt's Gang: a member whose rank has a usable standby gets it,
  // released; the others are spawned by `inner`. Valid while this object lives.
  ProcessSpawner* SpawnerFor(ProcessSpawner* inner);
  // Kills every standby not released; their exits reach OnChildExited (or the caller's
  // reaping of leftovers).
  void Stop();
  // Resident memory of each standby, by rank, and the ranks whose standby is ready (the
  // status page).
  std::map<int, int64_t> Memory() const;
  std::set<int> Ready() const;
  // The file a rank writes its imported modules to, and a standby preloads.
  std::string ModulesFile(int rank) const;

 private:
  class Adopting;

  ProcessSpawner* spawner_;
  Clock* clock_;
  std::string modules_dir_;
  std::function<void(const std::string&)> say_;
  std::function<std::optional<MemoryUse>()> memory_;
  bool off_ = false;  // given up: the pod's memory limit would not hold them
  std::map<int, SpawnOptions> expected_;
  Clock::TimePoint expected_at_{};               // when Expect() was called
  std::map<int, std::string> stamps_at_expect_;  // each modules file's FileStamp then
  std::map<int, std::unique_ptr<StandbyRank>> standbys_;
  std::vector<pid_t> dying_;  // standbys killed and not reaped yet
  std::unique_ptr<Adopting> adopting_;
};

}  // namespace spawnpoint::agent
