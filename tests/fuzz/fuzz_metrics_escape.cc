// The metrics exposition escaping (metrics/exposition.h), as a round trip: a label value,
// a HELP text and a sample value are escaped as the agent and operator write them, checked
// against the text format Prometheus parses (promtool's rules: escapes \\ \" \n only, valid
// UTF-8 throughout, no raw newline, no raw " in a label value) and read back with an
// unescaper written here from the format's specification; the read-back must equal the
// original (label values: with each byte that is not valid UTF-8 replaced by U+FFFD).
// Any mismatch aborts.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "metrics/exposition.h"
#include "tests/fuzz/fuzz_input.h"

namespace metrics = spawnpoint::metrics;

namespace {

[[noreturn]] void Fail(const char* what, std::string_view in, std::string_view out) {
  std::fprintf(stderr, "metrics_escape: %s\n  in  (%zu bytes)\n  out: %.*s\n", what, in.size(),
               static_cast<int>(out.size()), out.data());
  std::abort();
}

// Length of the valid UTF-8 sequence at the start of s (RFC 3629: no overlongs, no
// surrogates, at most U+10FFFF), or 0.
size_t Utf8Seq(std::string_view s) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  if (s.empty()) return 0;
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (s.size() < n) return 0;
  if (b(1) < lo || b(1) > hi) return 0;
  for (size_t i = 2; i < n; ++i) {
    if (b(i) < 0x80 || b(i) > 0xBF) return 0;
  }
  return n;
}

bool ValidUtf8(std::string_view s) {
  while (!s.empty()) {
    size_t n = Utf8Seq(s);
    if (n == 0) return false;
    s.remove_prefix(n);
  }
  return true;
}

// What the escaping must preserve: `s` with every byte that starts no valid sequence
// replaced by U+FFFD.
std::string Sanitised(std::string_view s) {
  std::string out;
  while (!s.empty()) {
    size_t n = Utf8Seq(s);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      s.remove_prefix(1);
    } else {
      out.append(s.substr(0, n));
      s.remove_prefix(n);
    }
  }
  return out;
}

// The text format's unescaping: `quote` true for a label value (\" allowed, raw " not).
std::optional<std::string> Unescape(std::string_view s, bool quote) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '\n') return std::nullopt;
    if (quote && c == '"') return std::nullopt;
    if (c != '\\') {
      out.push_back(c);
      continue;
    }
    if (++i == s.size()) return std::nullopt;
    switch (s[i]) {
      case '\\':
        out.push_back('\\');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case '"':
        if (!quote) return std::nullopt;  // HELP keeps quotes as they are
        out.push_back('"');
        break;
      default:
        return std::nullopt;
    }
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);

  std::string label;
  metrics::AppendEscapedLabelValue(&label, in);
  if (!ValidUtf8(label)) Fail("label value: not valid UTF-8", in, label);
  auto label_back = Unescape(label, /*quote=*/true);
  if (!label_back) Fail("label value: does not parse back", in, label);
  if (*label_back != Sanitised(in)) Fail("label value: parses back to another value", in, label);

  std::string help;
  metrics::AppendEscapedHelp(&help, in);
  if (!ValidUtf8(help)) Fail("HELP: not valid UTF-8", in, help);
  auto help_back = Unescape(help, /*quote=*/false);
  if (!help_back) Fail("HELP: does not parse back", in, help);
  if (*help_back != Sanitised(in)) Fail("HELP: parses back to another text", in, help);

  // Sample values: the input's first 8 bytes as a double, written and read back exactly.
  if (size >= sizeof(double)) {
    double v;
    std::memcpy(&v, data, sizeof(v));
    const std::string text = metrics::FormatValue(v);
    double back;
    if (text == "NaN") {
      back = std::nan("");
    } else if (text == "+Inf") {
      back = INFINITY;
    } else if (text == "-Inf") {
      back = -INFINITY;
    } else {
      char* end = nullptr;
      back = std::strtod(text.c_str(), &end);
      if (end != text.c_str() + text.size()) Fail("value: does not parse back", in, text);
    }
    if (std::isnan(v) ? !std::isnan(back) : back != v)
      Fail("value: reads back as another", in, text);
  }
  return 0;
}
