// Secrets: drawn from the kernel's random source, written as hex, and read from the files a
// Secret volume mounts. Thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "common/status.h"

namespace spawnpoint {

// `bytes` random bytes from /dev/urandom, hex-encoded (2 × bytes lowercase characters);
// Unavailable if they cannot be read.
StatusOr<std::string> RandomHex(size_t bytes);

// `bytes` as 2 × size lowercase hex characters.
std::string HexEncode(std::string_view bytes);

// The content of a file that holds a secret (a token, a key), without its trailing line ends.
// NotFound when there is no such file, Unavailable when it cannot be read (the reason),
// InvalidArgument when it holds nothing else. Messages are the reason alone: the caller names
// the file and what it is for.
StatusOr<std::string> ReadSecretFile(const std::string& path);

}  // namespace spawnpoint
