#include "agent/supervisor/process_table.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace spawnpoint::agent {
namespace {

// include/linux/sched.h: set by exit_signals() when a thread enters do_exit(), before
// its memory and files are released.
constexpr unsigned long kPfExiting = 0x00000004;

std::vector<std::string> NumericEntries(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long n = strtol(e->d_name, &end, 10);
    if (*end == '\0' && n > 0) out.emplace_back(e->d_name);
  }
  closedir(d);
  return out;
}

bool ReadLine(const std::string& path, std::string* line) {
  std::ifstream in(path);
  return static_cast<bool>(std::getline(in, *line));
}

}  // namespace

bool ParseStat(const std::string& line, char* state, unsigned long* flags, pid_t* ppid,
               pid_t* pgid) {
  // The command name may hold spaces and parentheses: fields resume after the last ')'.
  const size_t close_paren = line.rfind(')');
  if (close_paren == std::string::npos) return false;
  std::istringstream rest(line.substr(close_paren + 1));
  long parent = 0, group = 0, session = 0, tty = 0, tpgid = 0;
  unsigned long f = 0;
  char s = 0;
  if (!(rest >> s >> parent >> group >> session >> tty >> tpgid >> f)) return false;
  *state = s;
  *flags = f;
  *ppid = static_cast<pid_t>(parent);
  *pgid = static_cast<pid_t>(group);
  return true;
}

std::vector<ProcEntry> ListProcesses(const std::string& proc_root) {
  std::vector<ProcEntry> out;
  for (const std::string& name : NumericEntries(proc_root)) {
    std::string line;
    if (!ReadLine(proc_root + "/" + name + "/stat", &line)) continue;  // exited meanwhile
    char state = 0;
    unsigned long flags = 0;
    ProcEntry e;
    if (!ParseStat(line, &state, &flags, &e.ppid, &e.pgid)) continue;
    e.pid = static_cast<pid_t>(std::atol(name.c_str()));
    out.push_back(e);
  }
  return out;
}

int64_t ProcessCpuNs(pid_t pid, const std::string& proc_root) {
  std::string line;
  if (!ReadLine(proc_root + "/" + std::to_string(pid) + "/stat", &line)) return -1;
  const size_t close_paren = line.rfind(')');
  if (close_paren == std::string::npos) return -1;
  // After the command: state (field 3) ... utime (14), stime (15), in clock ticks.
  std::istringstream rest(line.substr(close_paren + 1));
  std::string field;
  for (int i = 3; i <= 13; ++i) {
    if (!(rest >> field)) return -1;
  }
  unsigned long long utime = 0, stime = 0;
  if (!(rest >> utime >> stime)) return -1;
  static const long ticks = sysconf(_SC_CLK_TCK) > 0 ? sysconf(_SC_CLK_TCK) : 100;
  return static_cast<int64_t>((utime + stime) *
                              (1'000'000'000ULL / static_cast<unsigned long long>(ticks)));
}

std::vector<pid_t> ChildrenOf(pid_t pid, const std::string& proc_root) {
  std::vector<pid_t> out;
  const std::string tasks = proc_root + "/" + std::to_string(pid) + "/task";
  for (const std::string& tid : NumericEntries(tasks)) {
    std::ifstream in(tasks + "/" + tid + "/children");
    long child = 0;
    while (in >> child) out.push_back(static_cast<pid_t>(child));
  }
  return out;
}

bool ProcessIsExiting(pid_t pid, const std::string& proc_root) {
  const std::string tasks = proc_root + "/" + std::to_string(pid) + "/task";
  const std::vector<std::string> tids = NumericEntries(tasks);
  if (tids.empty()) return true;  // gone (reaped), or its /proc entry with it
  for (const std::string& tid : tids) {
    std::string line;
    if (!ReadLine(tasks + "/" + tid + "/stat", &line)) continue;  // that thread is gone
    char state = 0;
    unsigned long flags = 0;
    pid_t ppid = 0, pgid = 0;
    if (!ParseStat(line, &state, &flags, &ppid, &pgid)) return false;
    const bool dead = state == 'Z' || state == 'X' || state == 'x';
    if (!dead && (flags & kPfExiting) == 0) return false;
  }
  return true;
}

}  // namespace spawnpoint::agent
