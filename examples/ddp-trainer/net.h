// Plain-socket helpers for the rendezvous, kept out of the torch translation unit.
#pragma once

#include <chrono>
#include <string>

#include "common/status.h"

namespace spawnpoint::trainer {

// Polls (every 5 ms) until a TCP connect to host:port succeeds or the deadline passes.
// c10d's TCPStore client sleeps a fixed second after a refused connect, so ranks that come
// up before the store server would otherwise lose up to a second each.
Status WaitForListener(const std::string& host, int port,
                       std::chrono::steady_clock::time_point deadline);

// True for 127.0.0.0/8, ::1 and "localhost".
bool IsLoopback(const std::string& host);

// The local address the kernel would use as source to reach host:port (no packet is
// sent), or "" if host does not resolve or is unreachable. This is the address peers on
// other nodes can reach us at, whatever this machine's hostname resolves to.
std::string LocalAddressFor(const std::string& host, int port);

}  // namespace spawnpoint::trainer
