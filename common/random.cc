#include "common/random.h"

#include <cstdio>
#include <vector>

namespace spawnpoint {

StatusOr<std::string> RandomHex(size_t bytes) {
  std::vector<unsigned char> buf(bytes);
  FILE* f = std::fopen("/dev/urandom", "rbe");
  const size_t got = f ? std::fread(buf.data(), 1, buf.size(), f) : 0;
  if (f) std::fclose(f);
  if (got != buf.size()) {
    return Unavailable("cannot read " + std::to_string(bytes) + " bytes from /dev/urandom");
  }
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes);
  for (unsigned char b : buf) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

}  // namespace spawnpoint
