// The stacks of a stalled rank, and what they say: which function it is in and whether it
// waits in a collective (then it is a victim of another rank, not the culprit). Python
// ranks dump every thread with faulthandler on a signal the shim registered (the file must
// exist: the shim creates it when it registers, so an unregistered rank is never sent a
// signal whose default action would kill it); any rank gets its main thread's native frames
// from eu-stack (elfutils) or gdb when one is installed, and always the kernel's view of its
// threads. The parsers
// are pure; CaptureStack blocks up to its timeouts. Thread-compatible.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>

#include "agent/process/spawner.h"

namespace spawnpoint::agent {

struct RankStack {
  std::string source;          // "python", "gdb" or "kernel"
  std::string text;            // the main thread's frames, innermost first (then other threads)
  std::string top_frame;       // the innermost frame of the program's own, e.g. "blocked_here
                               // (train.py:12)"; "" when unknown
  bool in_collective = false;  // the main thread waits in a collective (or DDP's backward)
};

// faulthandler's dump (all threads): the main thread is the one whose outermost frame is
// a module's top level.
RankStack ParsePythonStacks(const std::string& dump);
// One thread's frames as eu-stack or gdb's `bt` print them; `source` names the tool.
RankStack ParseNativeBacktrace(const std::string& backtrace, const std::string& source);
// One line per thread of `pid`: "tid state wchan" (state from stat, wchan's kernel
// function), main thread first; "" when the process is gone.
std::string KernelView(pid_t pid, const std::string& proc_root = "/proc");

struct StackRequest {
  pid_t pid = 0;
  std::string python_stack_file;  // "" for a rank without the shim's faulthandler
  int python_signal = 0;
  std::string scratch_dir;  // where the native tool's output goes
  std::chrono::milliseconds python_timeout{3000};
  std::chrono::milliseconds native_timeout{20000};
};

// Python stacks when the rank registered for them, else eu-stack's or gdb's when one is on
// PATH, else the kernel's view; the kernel's view is appended to the text in every case.
RankStack CaptureStack(const StackRequest& request, ProcessSpawner* spawner);

}  // namespace spawnpoint::agent
