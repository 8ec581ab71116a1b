// ProcessSpawner: the seam through which the agent starts every process (ranks, node
// agents, loader workers). The production implementation never forks: it uses a
// vfork-style clone(CLONE_VM | CLONE_VFORK), as glibc's posix_spawn does, whose child
// makes only raw system calls (signal dispositions reset, setpgid, PR_SET_PDEATHSIG,
// sched_setaffinity, dup3, chdir) before execve: no libc wrapper, no sanitizer's
// interposer, touches the agent's memory. A process holding a GPU context or threads is
// therefore never duplicated. Spawn() is thread-safe, but call it from a
// thread that lives as long as the children: PR_SET_PDEATHSIG fires when the spawning
// thread exits.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace spawnpoint::agent {

struct SpawnOptions {
  std::vector<std::string> argv;  // argv[0] is resolved against PATH of `env` if it has no '/'
  std::vector<std::string> env;   // "NAME=value", the child's whole environment
  std::string working_dir;        // empty: the spawner's
  std::vector<int> cpus;          // empty: inherit the affinity
  bool new_process_group = true;  // the child leads its own group, so a kill reaches its children
  int death_signal = 9;           // sent to the child if the agent dies; 0 = none
  int stdin_fd = -1;              // -1: /dev/null
  int stdout_fd = -1;             // -1: inherit
  int stderr_fd = -1;             // -1: inherit
  // Further descriptors the child keeps, as (fd in the agent, fd number in the child);
  // every other descriptor above 2 is closed in the child.
  std::vector<std::pair<int, int>> inherit_fds;
  // Signals the child starts with ignored (every other one at its default): exec keeps them
  // ignored, and a handler the program installs later restores SIG_IGN when it is removed.
  // The stack-request signal of Python ranks (agent/run/stall_monitor.h): one that comes
  // before the rank's handler is installed or after it is gone at exit costs nothing.
  std::vector<int> ignored_signals;
};

class ProcessSpawner {
 public:
  virtual ~ProcessSpawner() = default;
  // Starts the process; returns its pid once it has exec'd. An executable that cannot be
  // run is an error naming it (the child is reaped before returning).
  virtual StatusOr<pid_t> Spawn(const SpawnOptions& options) = 0;
};

std::unique_ptr<ProcessSpawner> MakeVforkSpawner();

// Resolves a command name against a PATH value the way execvp does; names with a '/' are
// returned as given. Errors name the command and the PATH searched.
StatusOr<std::string> ResolveExecutable(const std::string& name, const std::string& path_env);

// A pidfd for `pid` (readable once it exits), or -1 with errno set.
int PidfdOpen(pid_t pid);

}  // namespace spawnpoint::agent
