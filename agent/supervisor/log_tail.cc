#include "agent/supervisor/log_tail.h"

#include "common/text.h"

namespace spawnpoint::agent {

LogTail::LogTail(size_t max_lines, size_t max_bytes, size_t max_line_bytes)
    : max_lines_(max_lines), max_bytes_(max_bytes), max_line_bytes_(max_line_bytes) {}

void LogTail::Add(std::string_view line) {
  const size_t cr = line.find_last_of('\r');
  if (cr != std::string_view::npos && cr + 1 < line.size()) line = line.substr(cr + 1);
  if (line.size() > max_line_bytes_) line = line.substr(line.size() - max_line_bytes_);
  lines_.emplace_back(line);
  bytes_ += line.size();
  while (lines_.size() > max_lines_ || (bytes_ > max_bytes_ && lines_.size() > 1)) {
    bytes_ -= lines_.front().size();
    lines_.pop_front();
    dropped_ = true;
  }
}

std::vector<std::string> LogTail::Lines() const {
  std::vector<std::string> out;
  out.reserve(lines_.size());
  for (const std::string& l : lines_) out.push_back(ValidUtf8(l));
  return out;
}

std::string LogTail::Text(size_t max_lines, size_t max_bytes) const {
  std::string text;
  const size_t first = lines_.size() > max_lines ? lines_.size() - max_lines : 0;
  for (size_t i = first; i < lines_.size(); ++i) {
    if (i > first) text += '\n';
    text += lines_[i];
  }
  // Lines left out are marked, as KeepEnd marks the ones it cuts.
  const std::string marker = "...\n";
  if ((first > 0 || dropped_) && max_bytes > marker.size()) {
    return marker + KeepEnd(ValidUtf8(text), max_bytes - marker.size(), "");
  }
  return KeepEnd(ValidUtf8(text), max_bytes, marker);
}

}  // namespace spawnpoint::agent
