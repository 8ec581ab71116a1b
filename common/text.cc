#include "common/text.h"

namespace spawnpoint {
namespace {

bool IsContinuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// The length of the well-formed sequence at the start of `s`, or 0 (RFC 3629's table).
size_t SequenceLength(std::string_view s) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;  // no overlongs
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
  } else {
    return 0;
  }
  if (s.size() < n) return 0;
  if (b(1) < lo || b(1) > hi) return 0;
  for (size_t i = 2; i < n; ++i) {
    if (!IsContinuation(b(i))) return 0;
  }
  return n;
}

}  // namespace

std::string ValidUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t n = SequenceLength(text.substr(i));
    if (n == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

std::string KeepEnd(std::string_view text, size_t max_bytes, std::string_view marker) {
  if (text.size() <= max_bytes) return std::string(text);
  if (max_bytes <= marker.size()) return std::string(marker.substr(0, max_bytes));
  const size_t room = max_bytes - marker.size();
  size_t start = text.size() - room;
  // Whole lines: start after a newline, when one is in what fits.
  const size_t nl = text.find('\n', start == 0 ? 0 : start - 1);
  if (nl != std::string_view::npos && nl + 1 < text.size()) {
    start = nl + 1;
  } else {
    while (start < text.size() && IsContinuation(static_cast<unsigned char>(text[start]))) {
      ++start;
    }
  }
  return std::string(marker) + std::string(text.substr(start));
}

std::string KeepStart(std::string_view text, size_t max_bytes, std::string_view marker) {
  if (text.size() <= max_bytes) return std::string(text);
  if (max_bytes <= marker.size()) return std::string(marker.substr(0, max_bytes));
  size_t cut = max_bytes - marker.size();
  while (cut > 0 && IsContinuation(static_cast<unsigned char>(text[cut]))) --cut;
  return std::string(text.substr(0, cut)) + std::string(marker);
}

}  // namespace spawnpoint
