#include "common/bytes.h"

#include <cstdio>

namespace spawnpoint {

std::string FormatBytes(uint64_t bytes) {
  const char* units[] = {"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (v == static_cast<double>(static_cast<uint64_t>(v))) {
    std::snprintf(buf, sizeof(buf), "%llu%s", static_cast<unsigned long long>(v), units[u]);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f%s", v, units[u]);
  }
  return buf;
}

}  // namespace spawnpoint
