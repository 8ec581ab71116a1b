// Text that leaves the process in JSON (termination messages, status documents): whatever
// bytes a rank printed, made valid UTF-8 and cut to a byte budget without splitting a
// character. Pure functions; thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace spawnpoint {

// `text` with every byte that is not part of a well-formed UTF-8 sequence (stray
// continuation bytes, overlongs, surrogates, truncated sequences) replaced by U+FFFD.
std::string ValidUtf8(std::string_view text);

// The end of `text` in at most `max_bytes`: `text` itself when it fits, else its last
// whole lines that fit behind `marker` (e.g. "...\n"), or, when not even the last line
// fits, the marker and that line's end, cut at a character boundary. `text` must be valid
// UTF-8; so is the result.
std::string KeepEnd(std::string_view text, size_t max_bytes, std::string_view marker);

// The start of `text` in at most `max_bytes`, cut at a character boundary, with `marker`
// appended when cut (e.g. "..."). `text` must be valid UTF-8; so is the result.
std::string KeepStart(std::string_view text, size_t max_bytes, std::string_view marker);

}  // namespace spawnpoint
