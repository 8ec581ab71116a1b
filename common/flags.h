// The pieces every command-line parser here shares, so the agent and the operator word
// their flag errors the same way. Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/status.h"

namespace spawnpoint {

// "--name=value" splits into ("--name", "value"); anything else is a bare name.
struct FlagArg {
  std::string name;
  std::string value;
  bool has_value = false;
};
FlagArg SplitFlag(const std::string& arg);

// The value of `flag`: its "=value", else the next argument (advancing *i).
StatusOr<std::string> FlagValue(const FlagArg& flag, const std::vector<std::string>& args,
                                size_t* i);

// An integer in [min, max]; the error names the flag, the range and what was given.
StatusOr<long long> ParseIntFlag(const std::string& flag, const std::string& value, long long min,
                                 long long max);

}  // namespace spawnpoint
