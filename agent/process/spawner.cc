#include "agent/process/spawner.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

namespace spawnpoint::agent {
namespace {

// Everything the child needs, prepared by the parent so the child never allocates.
struct ChildArgs {
  const char* path;
  char* const* argv;
  char* const* envp;
  const char* working_dir;  // null: stay
  cpu_set_t* cpus;          // null: inherit
  size_t cpus_size;
  bool new_process_group;
  int death_signal;
  pid_t parent_pid;
  int stdin_fd, stdout_fd, stderr_fd;
  const std::pair<int, int>* inherit;
  size_t inherit_count;
  const int* ignored;  // signals set to SIG_IGN after the reset
  size_t ignored_count;
  int highest_kept_fd;
  // Written by the child (shared memory under CLONE_VM): which step failed and errno.
  volatile int failed_step;
  volatile int child_errno;
};

enum FailedStep {
  kNone = 0,
  kSetpgid,
  kDeathSignal,
  kParentGone,
  kAffinity,
  kStdio,
  kChdir,
  kExec
};

const char* StepName(int step) {
  switch (step) {
    case kSetpgid:
      return "setpgid";
    case kDeathSignal:
      return "prctl(PR_SET_PDEATHSIG)";
    case kParentGone:
      return "parent exited during spawn";
    case kAffinity:
      return "sched_setaffinity";
    case kStdio:
      return "dup2";
    case kChdir:
      return "chdir";
    case kExec:
      return "execve";
  }
  return "unknown step";
}

// The child below runs on the agent's memory (CLONE_VM) while the agent's thread waits, so
// it makes raw system calls only: no libc wrapper that keeps state in the agent's memory
// (sigaction's, and every one a sanitizer intercepts: ThreadSanitizer's sigaction, dup2 and
// _exit update its tables and locks, which the agent's threads then find corrupted), no
// allocation, no locks. The functions are not instrumented for the same reason.
#define SP_CHILD_CODE __attribute__((no_sanitize("thread", "address", "undefined")))

// The kernel's own struct sigaction for rt_sigaction (x86_64 and arm64 layout), and the
// kernel's signal set size: 64 signals.
struct KernelSigaction {
  void (*handler)(int);
  unsigned long flags;
  void (*restorer)();
  unsigned long mask;
};
constexpr unsigned long kKernelSigsetSize = sizeof(unsigned long);
constexpr int kKernelSignals = 64;

SP_CHILD_CODE [[noreturn]] void ChildFail(ChildArgs* a, long result, int step) {
  a->child_errno = static_cast<int>(-result);
  a->failed_step = step;
  for (;;) syscall(SYS_exit_group, 127);
}

// syscall() returns -1 and sets errno; the child reports the errno it got.
SP_CHILD_CODE long Sys(long result) { return result < 0 ? -errno : result; }

// dup2(from, to), and when from == to, the descriptor kept across exec (dup2 would leave its
// close-on-exec flag set; posix_spawn's adddup2 clears it the same way).
SP_CHILD_CODE long KeepAs(int from, int to) {
  if (from == to) return Sys(syscall(SYS_fcntl, from, F_SETFD, 0));
  return Sys(syscall(SYS_dup3, from, to, 0));
}

// Runs in the child on its own stack, sharing memory with the suspended parent thread.
SP_CHILD_CODE int ChildMain(void* raw) {
  auto* a = static_cast<ChildArgs*>(raw);
  // Handlers are the parent's copies: reset them so no agent code runs in the child, and
  // dispositions the agent ignores (SIGPIPE) do not leak into the job's processes.
  KernelSigaction dfl{};
  dfl.handler = SIG_DFL;
  for (int sig = 1; sig <= kKernelSignals; ++sig) {
    KernelSigaction old{};
    if (syscall(SYS_rt_sigaction, sig, nullptr, &old, kKernelSigsetSize) == 0 &&
        old.handler != SIG_DFL) {
      syscall(SYS_rt_sigaction, sig, &dfl, nullptr, kKernelSigsetSize);
    }
  }
  KernelSigaction ign{};
  ign.handler = SIG_IGN;
  for (size_t i = 0; i < a->ignored_count; ++i) {
    syscall(SYS_rt_sigaction, a->ignored[i], &ign, nullptr, kKernelSigsetSize);
  }
  long r = 0;
  if (a->new_process_group && (r = Sys(syscall(SYS_setpgid, 0, 0))) < 0) {
    ChildFail(a, r, kSetpgid);
  }
  if (a->death_signal != 0) {
    if ((r = Sys(syscall(SYS_prctl, PR_SET_PDEATHSIG, a->death_signal, 0, 0, 0))) < 0) {
      ChildFail(a, r, kDeathSignal);
    }
    if (syscall(SYS_getppid) != a->parent_pid) ChildFail(a, -ESRCH, kParentGone);
  }
  if (a->cpus != nullptr &&
      (r = Sys(syscall(SYS_sched_setaffinity, 0, a->cpus_size, a->cpus))) < 0) {
    ChildFail(a, r, kAffinity);
  }
  if (a->stdin_fd >= 0 && (r = KeepAs(a->stdin_fd, 0)) < 0) ChildFail(a, r, kStdio);
  if (a->stdout_fd >= 0 && (r = KeepAs(a->stdout_fd, 1)) < 0) ChildFail(a, r, kStdio);
  if (a->stderr_fd >= 0 && (r = KeepAs(a->stderr_fd, 2)) < 0) ChildFail(a, r, kStdio);
  for (size_t i = 0; i < a->inherit_count; ++i) {
    if ((r = KeepAs(a->inherit[i].first, a->inherit[i].second)) < 0) ChildFail(a, r, kStdio);
  }
  // Close what the agent did not mean to hand over (descriptors opened without
  // O_CLOEXEC by libraries); the fd table is the child's own copy.
  int first = 3;
  for (size_t i = 0; i < a->inherit_count; ++i) {
    int target = a->inherit[i].second;
    if (target >= first) {
      if (target > first) syscall(SYS_close_range, first, target - 1, 0);
      first = target + 1;
    }
  }
  syscall(SYS_close_range, first, ~0U, 0);
  if (a->working_dir != nullptr && (r = Sys(syscall(SYS_chdir, a->working_dir))) < 0) {
    ChildFail(a, r, kChdir);
  }
  unsigned long none = 0;
  syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, nullptr, kKernelSigsetSize);
  r = Sys(syscall(SYS_execve, a->path, a->argv, a->envp));
  ChildFail(a, r, kExec);
}

// glibc's own clone(). ThreadSanitizer interposes clone() and treats every clone as a fork:
// it locks its runtime before, and the child "after fork" resets the runtime's thread and
// lock tables, which under CLONE_VM are the agent's own. The child here runs no
// instrumented code, so it needs none of that; asking libc.so.6 by name skips the
// interposer. Only a TSan build asks: dlopen() of an object loaded at startup gives it a
// search list that glibc allocates and never frees, and where ld.so runs as the program
// (the agent bundle: `ld-linux.so --library-path lib bin/spawnpoint-agent`) LeakSanitizer
// does not know the loader (AT_BASE is 0) and reports that list as a leak at every exit.
// Elsewhere nothing interposes clone(), and the call reaches glibc's directly.
#if defined(__SANITIZE_THREAD__)
#define SP_CLONE_IS_INTERPOSED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SP_CLONE_IS_INTERPOSED 1
#endif
#endif
using CloneFn = int (*)(int (*)(void*), void*, int, void*, ...);
CloneFn LibcClone() {
#if defined(SP_CLONE_IS_INTERPOSED)
  static const CloneFn fn = [] {
    CloneFn found = nullptr;
    if (void* libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD)) {
      found = reinterpret_cast<CloneFn>(dlsym(libc, "clone"));
      dlclose(libc);
    }
    return found != nullptr ? found : &clone;
  }();
  return fn;
#else
  return &clone;
#endif
}

std::vector<char*> CStrings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  out.reserve(v.size() + 1);
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

std::string EnvValue(const std::vector<std::string>& env, const std::string& name) {
  const std::string prefix = name + "=";
  for (const auto& e : env) {
    if (e.compare(0, prefix.size(), prefix) == 0) return e.substr(prefix.size());
  }
  return "";
}

class VforkSpawner : public ProcessSpawner {
 public:
  StatusOr<pid_t> Spawn(const SpawnOptions& options) override {
    if (options.argv.empty() || options.argv[0].empty()) {
      return InvalidArgument("spawn: empty command");
    }
    std::string path_env = EnvValue(options.env, "PATH");
    if (path_env.empty()) {
      const char* own = getenv("PATH");
      path_env = own ? own : "/usr/local/bin:/usr/bin:/bin";
    }
    SP_ASSIGN_OR_RETURN(std::string path, ResolveExecutable(options.argv[0], path_env));

    std::vector<char*> argv = CStrings(options.argv);
    std::vector<char*> envp = CStrings(options.env);

    cpu_set_t* cpus = nullptr;
    size_t cpus_size = 0;
    int max_cpu =
        options.cpus.empty() ? 0 : *std::max_element(options.cpus.begin(), options.cpus.end());
    if (!options.cpus.empty()) {
      cpus = CPU_ALLOC(max_cpu + 1);
      cpus_size = CPU_ALLOC_SIZE(max_cpu + 1);
      CPU_ZERO_S(cpus_size, cpus);
      for (int c : options.cpus) CPU_SET_S(c, cpus_size, cpus);
    }

    int devnull = -1;
    if (options.stdin_fd < 0) devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);

    std::vector<std::pair<int, int>> inherit = options.inherit_fds;
    std::sort(inherit.begin(), inherit.end(),
              [](const auto& x, const auto& y) { return x.second < y.second; });

    ChildArgs args{};
    args.path = path.c_str();
    args.argv = argv.data();
    args.envp = envp.data();
    args.working_dir = options.working_dir.empty() ? nullptr : options.working_dir.c_str();
    args.cpus = cpus;
    args.cpus_size = cpus_size;
    args.new_process_group = options.new_process_group;
    args.death_signal = options.death_signal;
    args.parent_pid = getpid();
    args.stdin_fd = options.stdin_fd >= 0 ? options.stdin_fd : devnull;
    args.stdout_fd = options.stdout_fd;
    args.stderr_fd = options.stderr_fd;
    args.inherit = inherit.data();
    args.inherit_count = inherit.size();
    args.ignored = options.ignored_signals.data();
    args.ignored_count = options.ignored_signals.size();
    args.failed_step = kNone;
    args.child_errno = 0;

    constexpr size_t kStackSize = 256 * 1024;
    void* stack = mmap(nullptr, kStackSize, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack == MAP_FAILED) {
      if (cpus) CPU_FREE(cpus);
      if (devnull >= 0) close(devnull);
      return Internal(std::string("spawn: cannot allocate a stack: ") + strerror(errno));
    }
    // Block every signal so no handler runs on the child's stack before it resets them.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    const int saved_errno = errno;
    pid_t pid = LibcClone()(ChildMain, static_cast<char*>(stack) + kStackSize,
                            CLONE_VM | CLONE_VFORK | SIGCHLD, &args);
    const int clone_errno = errno;
    errno = saved_errno;
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    munmap(stack, kStackSize);
    if (cpus) CPU_FREE(cpus);
    if (devnull >= 0) close(devnull);

    if (pid < 0) {
      return Unavailable(std::string("spawn ") + path + ": clone: " + strerror(clone_errno));
    }
    if (args.failed_step != kNone) {
      int status = 0;
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      std::ostringstream msg;
      msg << "cannot start " << path << ": " << StepName(args.failed_step) << ": "
          << strerror(args.child_errno);
      return FailedPrecondition(msg.str());
    }
    return pid;
  }
};

}  // namespace

std::unique_ptr<ProcessSpawner> MakeVforkSpawner() { return std::make_unique<VforkSpawner>(); }

StatusOr<std::string> ResolveExecutable(const std::string& name, const std::string& path_env) {
  auto executable = [](const std::string& p) {
    struct stat st {};
    return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0;
  };
  if (name.find('/') != std::string::npos) {
    if (!executable(name)) {
      return NotFound(
          "command " + name + ": " +
          (access(name.c_str(), F_OK) == 0 ? "not an executable file" : "no such file"));
    }
    return name;
  }
  std::stringstream dirs(path_env);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (executable(candidate)) return candidate;
  }
  return NotFound("command " + name + " not found in PATH=" + path_env);
}

// Through syscall(): glibc 2.36's <sys/pidfd.h> lacks C linkage, so C++ cannot link it.
int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

}  // namespace spawnpoint::agent
