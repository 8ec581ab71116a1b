#include "agent/devices/sysfs_util.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace spawnpoint::devices::internal {

std::optional<std::string> ReadTrimmed(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return std::nullopt;
  std::string s = ss.str();
  const char* ws = " \t\r\n";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return std::string();
  size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

std::optional<int64_t> ReadInt(const std::string& path) {
  auto s = ReadTrimmed(path);
  if (!s || s->empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  // Base 10 unless 0x-prefixed: a leading zero must not switch to octal.
  const bool hex = s->size() > 2 && (*s)[0] == '0' && ((*s)[1] == 'x' || (*s)[1] == 'X');
  long long v = std::strtoll(s->c_str(), &end, hex ? 16 : 10);
  if (errno != 0 || end == s->c_str() || *end != '\0') return std::nullopt;
  return static_cast<int64_t>(v);
}

std::vector<std::string> ListDir(const std::string& path) {
  std::vector<std::string> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    out.push_back(it->path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool Exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

int PciNumaNode(const std::string& sysfs_root, const std::string& pci_bus_id) {
  if (pci_bus_id.empty()) return -1;
  auto v = ReadInt(sysfs_root + "/bus/pci/devices/" + pci_bus_id + "/numa_node");
  if (!v || *v < 0) return -1;
  return static_cast<int>(*v);
}

}  // namespace spawnpoint::devices::internal
