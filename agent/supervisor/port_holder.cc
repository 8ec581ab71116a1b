#include "agent/supervisor/port_holder.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>
#include <sstream>

namespace spawnpoint::agent {
namespace {

constexpr const char* kListen = "0A";  // TCP_LISTEN in /proc/net/tcp's st column

// The inodes of the LISTEN sockets on `port` in one /proc/net/tcp-style table:
//   sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
// with local_address "0100007F:1F90" (IPv4) or 32 hex digits ":1F90" (IPv6).
void ListenInodes(const std::string& table, int port, std::set<std::string>* inodes) {
  std::ifstream in(table);
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string sl, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
    if (!(fields >> sl >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode)) {
      continue;
    }
    if (state != kListen) continue;
    const size_t colon = local.rfind(':');
    if (colon == std::string::npos) continue;
    const std::string hex = local.substr(colon + 1);
    if (hex.empty() || hex.size() > 4 ||
        !std::all_of(hex.begin(), hex.end(), [](unsigned char c) { return std::isxdigit(c); })) {
      continue;
    }
    if (std::stoi(hex, nullptr, 16) == port && inode != "0") inodes->insert(inode);
  }
}

bool AllDigits(const char* s) {
  if (*s == '\0') return false;
  for (; *s != '\0'; ++s) {
    if (!std::isdigit(static_cast<unsigned char>(*s))) return false;
  }
  return true;
}

// Whether one of `pid_dir`'s open files is a socket in `inodes`.
bool HoldsOne(const std::string& pid_dir, const std::set<std::string>& inodes) {
  const std::string fd_dir = pid_dir + "/fd";
  DIR* dir = opendir(fd_dir.c_str());
  if (dir == nullptr) return false;  // another user's, or gone
  bool found = false;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    char target[128];
    const std::string link = fd_dir + "/" + e->d_name;
    const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;
    const std::string t(target, static_cast<size_t>(n));
    // "socket:[123456]"
    if (t.rfind("socket:[", 0) != 0 || t.back() != ']') continue;
    if (inodes.count(t.substr(8, t.size() - 9))) {
      found = true;
      break;
    }
  }
  closedir(dir);
  return found;
}

std::string Command(const std::string& pid_dir) {
  std::ifstream in(pid_dir + "/comm");
  std::string comm;
  std::getline(in, comm);
  return comm;
}

}  // namespace

PortListeners FindPortListeners(int port, const std::string& proc_root) {
  PortListeners out;
  if (port <= 0 || port > 65535) return out;
  std::set<std::string> inodes;
  ListenInodes(proc_root + "/net/tcp", port, &inodes);
  ListenInodes(proc_root + "/net/tcp6", port, &inodes);
  if (inodes.empty()) return out;
  out.listening = true;
  DIR* dir = opendir(proc_root.c_str());
  if (dir == nullptr) return out;
  while (dirent* e = readdir(dir)) {
    if (!AllDigits(e->d_name)) continue;
    const std::string pid_dir = proc_root + "/" + e->d_name;
    if (!HoldsOne(pid_dir, inodes)) continue;
    out.holders.push_back({static_cast<pid_t>(std::stol(e->d_name)), Command(pid_dir)});
  }
  closedir(dir);
  std::sort(out.holders.begin(), out.holders.end(),
            [](const PortHolder& a, const PortHolder& b) { return a.pid < b.pid; });
  return out;
}

std::string DescribePortHolders(const PortListeners& listeners) {
  if (!listeners.listening) return "";
  if (listeners.holders.empty()) {
    return "held by a process this agent cannot see (another user's, or another container's "
           "in this pod)";
  }
  constexpr size_t kNamed = 4;  // a server's forked children share its socket
  std::string out = "held by";
  for (size_t i = 0; i < listeners.holders.size() && i < kNamed; ++i) {
    const PortHolder& h = listeners.holders[i];
    out += (i == 0 ? " pid " : ", pid ") + std::to_string(h.pid);
    if (!h.command.empty()) out += " (" + h.command + ")";
  }
  if (listeners.holders.size() > kNamed) {
    out += " and " + std::to_string(listeners.holders.size() - kNamed) + " more";
  }
  return out;
}

}  // namespace spawnpoint::agent
