#include "tests/support/free_port.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <vector>

namespace spawnpoint::testing {
namespace {

// [first, last) below the kernel's ephemeral range and above the privileged ports; from
// 10000 up so no well-known service of a developer's machine is in the way.
std::pair<int, int> DrawRange() {
  int low = 32768, high = 60999;
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  in >> low >> high;
  if (low > 12000) return {10000, low};
  return {high + 1, 65000};  // an unusual machine: its range starts low, so draw above it
}

// A socket bound to `port` on every interface, or -1.
int BindAny(int port) {
  const int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {  // no IPv6 on this machine: every IPv4 interface
    const int v4 = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    sa.sin_port = htons(static_cast<uint16_t>(port));
    if (v4 >= 0 && ::bind(v4, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) return v4;
    if (v4 >= 0) ::close(v4);
    return -1;
  }
  const int off = 0;  // dual stack: IPv4 and IPv6 at once
  ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
  sockaddr_in6 sa{};
  sa.sin6_family = AF_INET6;
  sa.sin6_addr = in6addr_any;
  sa.sin6_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

int FreePort(int consecutive) {
  static thread_local std::mt19937 gen{std::random_device{}()};
  const auto [first, last] = DrawRange();
  std::uniform_int_distribution<int> pick(first, last - consecutive);
  for (int draw = 0; draw < 1000; ++draw) {
    const int port = pick(gen);
    std::vector<int> held;
    for (int p = port; p < port + consecutive; ++p) {
      const int fd = BindAny(p);
      if (fd < 0) break;
      held.push_back(fd);
    }
    const bool all = static_cast<int>(held.size()) == consecutive;
    for (int fd : held) ::close(fd);
    if (all) return port;
  }
  std::fprintf(stderr, "FreePort: no %d free consecutive ports in 1000 draws\n", consecutive);
  std::abort();
}

}  // namespace spawnpoint::testing
