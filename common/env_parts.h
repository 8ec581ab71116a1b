// One value too long for one environment variable, in parts. Linux refuses to start a program
// with an environment string over 128 KiB (MAX_ARG_STRLEN: execve fails with E2BIG, "Argument
// list too long"), though the whole environment may hold 2 MiB or more. A value over kEnvPartMax
// bytes is given as VAR_PARTS=N and VAR_0 .. VAR_{N-1}, each at most kEnvPartMax bytes, cut at
// byte boundaries (give ASCII, e.g. JSON dumped with ensure_ascii, so no UTF-8 sequence is cut).
// Pure; thread-safe.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace spawnpoint {

// 100 KiB: "VAR_N=" and the value stay well under 128 KiB.
inline constexpr size_t kEnvPartMax = 100 * 1024;

// The variables that carry `value` under `var`: {var, value} when it fits, else the parts.
std::vector<std::pair<std::string, std::string>> SplitEnvValue(const std::string& var,
                                                               const std::string& value,
                                                               size_t part_max = kEnvPartMax);

// The value SplitEnvValue gave under `var`, read through `get` (getenv's answer, nullopt when
// unset): VAR's own value, or its parts joined. nullopt when neither is set; an error naming
// the variable when VAR_PARTS is not a count or a part is missing.
StatusOr<std::optional<std::string>> JoinEnvValue(
    const std::string& var,
    const std::function<std::optional<std::string>(const std::string&)>& get);

}  // namespace spawnpoint
