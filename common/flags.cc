#include "common/flags.h"

#include <charconv>

namespace spawnpoint {

FlagArg SplitFlag(const std::string& arg) {
  FlagArg f{arg, "", false};
  if (arg.rfind("--", 0) == 0) {
    size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      f.name = arg.substr(0, eq);
      f.value = arg.substr(eq + 1);
      f.has_value = true;
    }
  }
  return f;
}

StatusOr<std::string> FlagValue(const FlagArg& flag, const std::vector<std::string>& args,
                                size_t* i) {
  if (flag.has_value) return flag.value;
  if (*i + 1 >= args.size()) return InvalidArgument(flag.name + ": missing value");
  return args[++*i];
}

StatusOr<long long> ParseIntFlag(const std::string& flag, const std::string& value, long long min,
                                 long long max) {
  long long v = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || ptr != value.data() + value.size() || v < min || v > max) {
    return InvalidArgument(flag + ": expected an integer in " + std::to_string(min) + ".." +
                           std::to_string(max) + ", got \"" + value + "\"");
  }
  return v;
}

}  // namespace spawnpoint
