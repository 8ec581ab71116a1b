#include "common/random.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

namespace spawnpoint {

StatusOr<std::string> RandomHex(size_t bytes) {
  std::vector<char> buf(bytes);
  FILE* f = std::fopen("/dev/urandom", "rbe");
  const size_t got = f ? std::fread(buf.data(), 1, buf.size(), f) : 0;
  if (f) std::fclose(f);
  if (got != buf.size()) {
    return Unavailable("cannot read " + std::to_string(bytes) + " bytes from /dev/urandom");
  }
  return HexEncode(std::string_view(buf.data(), buf.size()));
}

std::string HexEncode(std::string_view bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

StatusOr<std::string> ReadSecretFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    if (access(path.c_str(), F_OK) != 0 && errno == ENOENT) return NotFound("no such file");
    return Unavailable(std::string("cannot read it: ") + std::strerror(err));
  }
  std::stringstream content;
  content << in.rdbuf();
  std::string secret = content.str();
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.empty()) return InvalidArgument("empty");
  return secret;
}

}  // namespace spawnpoint
