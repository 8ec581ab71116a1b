// Who listens on a TCP port of this machine, as /proc tells it: the LISTEN sockets on that
// port in net/tcp and net/tcp6, and the processes (those this user may read) whose open files
// include one. Reads files only; thread-safe.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace spawnpoint::agent {

struct PortHolder {
  pid_t pid = 0;
  std::string command;  // /proc/<pid>/comm: "python3"
};

struct PortListeners {
  bool listening = false;           // some LISTEN socket on the port (IPv4 or IPv6)
  std::vector<PortHolder> holders;  // the processes holding one, by pid; may be empty
};

// The LISTEN sockets on `port` and their holders, read under `proc_root` ("/proc"; a test's
// fake tree has net/tcp, net/tcp6 and <pid>/fd/* links to "socket:[inode]").
PortListeners FindPortListeners(int port, const std::string& proc_root = "/proc");

// How a message names them: "held by pid 4242 (python3)", "held by pid 1 (a), pid 2 (b)"
// (four at most, then "and 3 more"), "held by a process this agent cannot see (...)" when a
// socket listens but no readable process has it; "" when nothing listens.
std::string DescribePortHolders(const PortListeners& listeners);

}  // namespace spawnpoint::agent
