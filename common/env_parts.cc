#include "common/env_parts.h"

#include <algorithm>

namespace spawnpoint {

std::vector<std::pair<std::string, std::string>> SplitEnvValue(const std::string& var,
                                                               const std::string& value,
                                                               size_t part_max) {
  if (value.size() <= part_max) return {{var, value}};
  const size_t parts = (value.size() + part_max - 1) / part_max;
  std::vector<std::pair<std::string, std::string>> out;
  out.emplace_back(var + "_PARTS", std::to_string(parts));
  for (size_t i = 0; i < parts; ++i) {
    out.emplace_back(var + "_" + std::to_string(i), value.substr(i * part_max, part_max));
  }
  return out;
}

StatusOr<std::optional<std::string>> JoinEnvValue(
    const std::string& var,
    const std::function<std::optional<std::string>(const std::string&)>& get) {
  std::optional<std::string> count = get(var + "_PARTS");
  if (!count) return get(var);
  const bool digits =
      !count->empty() && count->size() <= 6 && std::all_of(count->begin(), count->end(), ::isdigit);
  if (!digits || std::stoi(*count) < 1) {
    return InvalidArgument(var + "_PARTS: must be a count of parts (1 or more), got \"" + *count +
                           "\"");
  }
  std::string value;
  const int parts = std::stoi(*count);
  for (int i = 0; i < parts; ++i) {
    std::optional<std::string> part = get(var + "_" + std::to_string(i));
    if (!part) {
      return InvalidArgument(var + "_" + std::to_string(i) + ": not set, though " + var +
                             "_PARTS is " + *count);
    }
    value += *part;
  }
  return std::optional<std::string>(std::move(value));
}

}  // namespace spawnpoint
