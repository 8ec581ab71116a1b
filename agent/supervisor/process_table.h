// What /proc says about the agent's processes: its children, the members of process
// groups, and whether a process is past its last line of user code. Used to end a failed
// attempt without waiting for the kernel to tear its processes down (a libtorch rank takes
// ~10 ms to unmap, a CUDA context much longer). Reads /proc only; thread-safe.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace spawnpoint::agent {

struct ProcEntry {
  pid_t pid = 0;
  pid_t ppid = 0;
  pid_t pgid = 0;
};

// Every process visible in `proc_root` (default /proc), as its stat file says.
std::vector<ProcEntry> ListProcesses(const std::string& proc_root = "/proc");

// True when no thread of `pid` can run user code again: every thread has entered the
// kernel's exit (PF_EXITING in its stat flags) or is a zombie, or the process is gone. A
// thread-group leader that called pthread_exit while other threads run is not exiting.
bool ProcessIsExiting(pid_t pid, const std::string& proc_root = "/proc");

// CPU time (user + system, every thread's) `pid` has used, in ns, as /proc/PID/stat says;
// -1 when it is gone or unreadable.
int64_t ProcessCpuNs(pid_t pid, const std::string& proc_root = "/proc");

// The children of `pid` (of every thread), as /proc/PID/task/TID/children lists them.
std::vector<pid_t> ChildrenOf(pid_t pid, const std::string& proc_root = "/proc");

// Parses one /proc/PID/stat line: state and flags (the kernel's task flags word), and the
// parent and group. False for a line that does not parse.
bool ParseStat(const std::string& line, char* state, unsigned long* flags, pid_t* ppid,
               pid_t* pgid);

}  // namespace spawnpoint::agent
