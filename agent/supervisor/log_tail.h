// The last lines a process wrote to one stream, bounded in lines and bytes, oldest dropped
// first: what the agent keeps of each rank's stderr and stdout to say why it failed. Lines
// are stored as written (any bytes); Lines() and Text() return valid UTF-8. Not
// thread-safe: one owner (the gang's loop).
#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

namespace spawnpoint::agent {

class LogTail {
 public:
  // Each line keeps at most `max_line_bytes` (its end: a progress bar's last state).
  explicit LogTail(size_t max_lines = 200, size_t max_bytes = 32 * 1024,
                   size_t max_line_bytes = 2048);

  // One line without its newline. A carriage return overwrites a terminal line: only what
  // follows the last one is kept (unless nothing does).
  void Add(std::string_view line);
  bool empty() const { return lines_.empty(); }

  // The kept lines, oldest first, each made valid UTF-8.
  std::vector<std::string> Lines() const;
  // The last `max_lines` lines joined by '\n', trimmed from the front to `max_bytes` (whole
  // lines where one fits), valid UTF-8; "...\n" first when lines were left out.
  std::string Text(size_t max_lines, size_t max_bytes) const;

 private:
  const size_t max_lines_;
  const size_t max_bytes_;
  const size_t max_line_bytes_;
  std::deque<std::string> lines_;
  size_t bytes_ = 0;
  bool dropped_ = false;  // lines were dropped from the front
};

}  // namespace spawnpoint::agent
