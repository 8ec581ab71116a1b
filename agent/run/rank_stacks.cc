#include "agent/run/rank_stacks.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>
#include <vector>

#include "agent/supervisor/process_table.h"
#include "common/clock.h"

namespace spawnpoint::agent {
namespace {

using Ms = std::chrono::milliseconds;

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::string ReadAll(const std::string& path, off_t from = 0) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(from);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

off_t FileSize(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

// A Python frame in torch.distributed, or autograd's backward (where DDP waits for its
// allreduce), is a wait on the other ranks.
bool PythonFrameWaits(const std::string& file, const std::string& function) {
  return file.find("/torch/distributed/") != std::string::npos ||
         (function == "backward" && file.find("/torch/") != std::string::npos);
}

// A native frame of a collective or of waiting for one (c10d's Work::wait, gloo, NCCL).
bool NativeFrameWaits(const std::string& function) {
  static const std::regex kCollective(
      "allreduce|all_reduce|allgather|all_gather|broadcast|barrier|reduce_scatter|alltoall|"
      "gloo::|nccl|c10d::.*Work.*::wait|c10d::ProcessGroup[A-Za-z]*::[A-Za-z:]*[Ww]ait",
      std::regex::icase);
  return std::regex_search(function, kCollective);
}

}  // namespace

RankStack ParsePythonStacks(const std::string& dump) {
  // Blocks: "Thread 0x... (most recent call first):" / "Current thread 0x...", then frames
  // '  File "f.py", line 12 in name', innermost first.
  static const std::regex kFrame(R"re(^\s+File "(.*)", line (\d+) in (.*)$)re");
  std::vector<std::vector<std::string>> blocks;
  for (const std::string& line : Lines(dump)) {
    if (line.find("hread 0x") != std::string::npos) {
      blocks.emplace_back();
      blocks.back().push_back(line);
    } else if (!blocks.empty() && std::regex_search(line, kFrame)) {
      blocks.back().push_back(line);
    }
  }
  RankStack out;
  out.source = "python";
  if (blocks.empty()) return out;
  auto main = std::find_if(blocks.begin(), blocks.end(), [](const auto& b) {
    return b.size() > 1 && b.back().find(" in <module>") != std::string::npos;
  });
  if (main == blocks.end()) main = blocks.begin();
  std::ostringstream text;
  for (const std::string& line : *main) text << line << "\n";
  for (auto it = blocks.begin(); it != blocks.end(); ++it) {
    if (it == main) continue;
    for (const std::string& line : *it) text << line << "\n";
  }
  out.text = text.str();
  for (size_t i = 1; i < main->size(); ++i) {
    std::smatch m;
    if (!std::regex_search((*main)[i], m, kFrame)) continue;
    const std::string file = m[1], line = m[2], function = m[3];
    if (out.top_frame.empty()) {
      const size_t slash = file.rfind('/');
      out.top_frame = function + " (" +
                      (slash == std::string::npos ? file : file.substr(slash + 1)) + ":" + line +
                      ")";
    }
    out.in_collective = out.in_collective || PythonFrameWaits(file, function);
  }
  return out;
}

namespace {

// "#2  0x... in ns::(anonymous namespace)::f (a=1) at x.cc:3" (gdb) or
// "#2  0x... ns::(anonymous namespace)::f(int) [clone .isra.0]" (eu-stack): the function's
// name without its parameters, and where it is ("x.cc:3", a library, or "").
bool ParseNativeFrame(const std::string& line, std::string* function, std::string* where) {
  static const std::regex kFrame(R"(^#\d+\s+(?:0x[0-9a-fA-F]+\s+)?(?:in\s+)?(.+)$)");
  std::smatch m;
  if (!std::regex_search(line, m, kFrame)) return false;
  std::string rest = m[1];
  const std::string kAnon = "(anonymous namespace)";
  std::string name;
  for (size_t i = 0; i < rest.size();) {
    if (rest.compare(i, kAnon.size(), kAnon) == 0) {
      name += kAnon;
      i += kAnon.size();
    } else if (rest[i] == '(' || (rest[i] == ' ' && i + 1 < rest.size() && rest[i + 1] == '(')) {
      break;
    } else {
      name += rest[i++];
    }
  }
  *function = name;
  where->clear();
  if (size_t at = rest.rfind(") at "); at != std::string::npos) {
    const std::string file = rest.substr(at + 5);
    const size_t slash = file.rfind('/');
    *where = slash == std::string::npos ? file : file.substr(slash + 1);
  } else if (size_t from = rest.rfind(" from "); from != std::string::npos) {
    *where = rest.substr(from + 6);
  }
  return !name.empty();
}

// Where a program waits rather than what it does: the C library, the loader, the kernel's
// entry points.
bool SystemFunction(const std::string& function, const std::string& where) {
  static const std::regex kSystem(
      "^(__.*|_start|main_thread|start_thread|clone3?|.*@GLIBC.*|(clock_)?nanosleep|poll|"
      "ppoll|epoll_wait|select|pselect6?|read|recv|recvmsg|write|sendmsg|syscall|pause|"
      "sigsuspend|sigtimedwait|pthread_cond_(timed)?wait.*|pthread_join|futex.*|\\?\\?)$");
  return std::regex_match(function, kSystem) || where.rfind("./", 0) == 0 ||
         where.rfind("../sysdeps/", 0) == 0 || where.find("/libc.so") != std::string::npos;
}

}  // namespace

RankStack ParseNativeBacktrace(const std::string& backtrace, const std::string& source) {
  RankStack out;
  out.source = source;
  std::ostringstream text;
  for (const std::string& line : Lines(backtrace)) {
    std::string function, where;
    if (line.rfind('#', 0) != 0 || !ParseNativeFrame(line, &function, &where)) continue;
    text << line.substr(0, line.find(' ')) << " " << function
         << (where.empty() ? "" : " (" + where + ")") << "\n";
    if (out.top_frame.empty() && !SystemFunction(function, where)) out.top_frame = function;
    out.in_collective = out.in_collective || NativeFrameWaits(function);
  }
  out.text = text.str();
  return out;
}

std::string KernelView(pid_t pid, const std::string& proc_root) {
  const std::string task_dir = proc_root + "/" + std::to_string(pid) + "/task";
  std::vector<std::string> tids;
  for (const ProcEntry& e : ListProcesses(task_dir)) tids.push_back(std::to_string(e.pid));
  std::sort(tids.begin(), tids.end(), [&](const std::string& a, const std::string& b) {
    const bool a_main = a == std::to_string(pid), b_main = b == std::to_string(pid);
    return a_main != b_main ? a_main : std::stol(a) < std::stol(b);
  });
  std::ostringstream out;
  for (const std::string& tid : tids) {
    std::string stat_line, wchan;
    std::getline(std::ifstream(task_dir + "/" + tid + "/stat"), stat_line);
    std::getline(std::ifstream(task_dir + "/" + tid + "/wchan"), wchan);
    char state = '?';
    unsigned long flags = 0;
    pid_t ppid = 0, pgid = 0;
    ParseStat(stat_line, &state, &flags, &ppid, &pgid);
    out << "thread " << tid << " state " << state << " wchan " << (wchan.empty() ? "-" : wchan)
        << "\n";
  }
  return out.str();
}

namespace {

// Python: the shim's faulthandler appends every thread's stack to the file on the signal.
std::string PythonDump(const StackRequest& r) {
  const off_t before = FileSize(r.python_stack_file);
  if (before < 0 || r.python_signal <= 0 || kill(r.pid, r.python_signal) != 0) return "";
  const auto deadline = std::chrono::steady_clock::now() + r.python_timeout;
  off_t seen = before;
  int quiet = 0;  // polls without growth after it grew: the dump is complete
  while (std::chrono::steady_clock::now() < deadline && quiet < 3) {
    std::this_thread::sleep_for(Ms(20));  // a poll interval, not a synchronisation
    const off_t now = FileSize(r.python_stack_file);
    quiet = (now == seen && now > before) ? quiet + 1 : 0;
    seen = now;
  }
  return seen > before ? ReadAll(r.python_stack_file, before) : "";
}

// The tool's path on the agent's PATH (ResolveExecutable, as a rank's command is found).
bool OnPath(const std::string& name, std::string* path) {
  const char* env = getenv("PATH");
  StatusOr<std::string> found = ResolveExecutable(name, env ? env : "/usr/bin:/bin");
  if (found.ok()) *path = *found;
  return found.ok();
}

// eu-stack (elfutils: ~20 ms) or gdb (seconds with libtorch's symbols) prints the main
// thread's frames; bounded by the timeout. Returns the tool's name and its output.
std::pair<std::string, std::string> NativeBacktrace(const StackRequest& r,
                                                    ProcessSpawner* spawner) {
  if (spawner == nullptr) return {};
  std::string tool;
  std::vector<std::string> argv;
  if (OnPath("eu-stack", &tool)) {
    argv = {tool, "-1", "-p", std::to_string(r.pid)};
  } else if (OnPath("gdb", &tool)) {
    argv = {tool,  "-p",   std::to_string(r.pid), "-batch", "-nx", "-ex", "set pagination off",
            "-ex", "bt 24"};
  } else {
    return {};
  }
  const std::string out_path = r.scratch_dir + "/stack-" + std::to_string(r.pid) + ".txt";
  const int fd = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return {};
  SpawnOptions o;
  o.argv = argv;
  o.stdout_fd = fd;
  o.stderr_fd = fd;
  o.new_process_group = true;
  for (char** e = environ; *e != nullptr; ++e) o.env.emplace_back(*e);
  StatusOr<pid_t> pid = spawner->Spawn(o);
  close(fd);
  if (!pid.ok()) return {};
  const auto deadline = std::chrono::steady_clock::now() + r.native_timeout;
  int status = 0;
  while (waitpid(*pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      kill(-*pid, SIGKILL);
      waitpid(*pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(Ms(5));  // a poll interval, not a synchronisation
  }
  std::string text = ReadAll(out_path);
  unlink(out_path.c_str());
  const size_t slash = tool.rfind('/');
  return {tool.substr(slash + 1), text};
}

}  // namespace

RankStack CaptureStack(const StackRequest& request, ProcessSpawner* spawner) {
  RankStack stack;
  if (!request.python_stack_file.empty()) {
    if (std::string dump = PythonDump(request); !dump.empty()) stack = ParsePythonStacks(dump);
  }
  if (stack.text.empty()) {
    auto [tool, bt] = NativeBacktrace(request, spawner);
    if (!bt.empty()) stack = ParseNativeBacktrace(bt, tool);
    if (stack.text.empty()) stack = RankStack{};
  }
  const std::string kernel = KernelView(request.pid);
  if (stack.text.empty()) {
    stack.source = "kernel";
    stack.top_frame.clear();
  }
  stack.text += (stack.text.empty() ? "" : "\n") + std::string("kernel view:\n") + kernel;
  if (stack.top_frame.empty() && stack.source == "kernel") {
    // The main thread's wait channel is the best frame there is.
    const size_t w = kernel.find(" wchan ");
    if (w != std::string::npos) stack.top_frame = kernel.substr(w + 7, kernel.find('\n') - w - 7);
  }
  return stack;
}

}  // namespace spawnpoint::agent
