// Shared by the fuzz targets: the one entry point each defines, and a helper that splits an
// input into parts. Header-only; no state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace spawnpoint::fuzz {

// The input as text split at every "\n--\n": seeds stay readable, and the fuzzer mutates
// each part independently of the others. At most `max_parts` parts; the last keeps the rest.
inline std::vector<std::string> SplitParts(const uint8_t* data, size_t size, size_t max_parts) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  constexpr std::string_view kSep = "\n--\n";
  while (parts.size() + 1 < max_parts) {
    size_t at = text.find(kSep);
    if (at == std::string_view::npos) break;
    parts.emplace_back(text.substr(0, at));
    text.remove_prefix(at + kSep.size());
  }
  parts.emplace_back(text);
  return parts;
}

}  // namespace spawnpoint::fuzz
