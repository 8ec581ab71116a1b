#include "metrics/exposition.h"

#include <charconv>
#include <cmath>

namespace spawnpoint::metrics {
namespace {

bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Units that have a base unit instead; the list is what people actually write.
constexpr std::string_view kNonBaseUnits[] = {
    "_milliseconds", "_microseconds", "_nanoseconds", "_minutes",    "_hours",     "_days",
    "_ms",           "_millis",       "_micros",      "_nanos",      "_kilobytes", "_megabytes",
    "_gigabytes",    "_terabytes",    "_kb",          "_mb",         "_gb",        "_kib",
    "_mib",          "_gib",          "_percent",     "_percentage", "_pct",       "_milliwatts",
    "_kilowatts",    "_mhz",          "_khz",
};

// Length of the UTF-8 sequence starting at s[0], or 0 if it is not a valid one.
size_t Utf8Length(std::string_view s) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  size_t n = 0;
  uint32_t cp = 0;
  if ((c & 0xE0) == 0xC0) {
    n = 2;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (s.size() < n) return 0;
  for (size_t i = 1; i < n; ++i) {
    if ((b(i) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i) & 0x3F);
  }
  // Overlong forms, UTF-16 surrogates and values past U+10FFFF are not valid UTF-8.
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return 0;
  return n;
}

}  // namespace

const char* MetricTypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
    case MetricType::kUntyped:
      return "untyped";
  }
  return "untyped";
}

Status ValidateMetricName(std::string_view name) {
  if (name.empty()) return InvalidArgument("metric name is empty");
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (IsAlpha(c) || c == '_' || c == ':' || (i > 0 && IsDigit(c))) continue;
    return InvalidArgument("metric name \"" + std::string(name) +
                           "\" is not [a-zA-Z_:][a-zA-Z0-9_:]*");
  }
  return Status::Ok();
}

Status ValidateLabelName(std::string_view name) {
  if (name.empty()) return InvalidArgument("label name is empty");
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (IsAlpha(c) || c == '_' || (i > 0 && IsDigit(c))) continue;
    return InvalidArgument("label name \"" + std::string(name) +
                           "\" is not [a-zA-Z_][a-zA-Z0-9_]*");
  }
  if (name.substr(0, 2) == "__") {
    return InvalidArgument("label name \"" + std::string(name) +
                           "\" starts with \"__\", which Prometheus reserves");
  }
  return Status::Ok();
}

Status CheckNamingConventions(std::string_view name, MetricType type) {
  const std::string n(name);
  const bool total = EndsWith(name, "_total");
  if (type == MetricType::kCounter && !total) {
    return InvalidArgument("counter \"" + n + "\" must end in \"_total\"");
  }
  if (type != MetricType::kCounter && total) {
    return InvalidArgument("\"" + n + "\" ends in \"_total\", which is for counters only");
  }
  if (type == MetricType::kHistogram) {
    for (std::string_view s : {"_bucket", "_sum", "_count"}) {
      if (EndsWith(name, s)) {
        return InvalidArgument("histogram \"" + n + "\" must not end in \"" + std::string(s) +
                               "\": its samples get that suffix");
      }
    }
  }
  const std::string_view stem = total ? name.substr(0, name.size() - 6) : name;
  for (std::string_view unit : kNonBaseUnits) {
    if (EndsWith(stem, unit)) {
      return InvalidArgument("\"" + n + "\" is in \"" + std::string(unit.substr(1)) +
                             "\": use base units (_seconds, _bytes, _ratio for 0..1)");
    }
  }
  return Status::Ok();
}

void AppendEscapedLabelValue(std::string* out, std::string_view value) {
  size_t i = 0;
  while (i < value.size()) {
    const char c = value[i];
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '"') {
      out->append("\\\"");
    } else if (c == '\n') {
      out->append("\\n");
    } else if (static_cast<unsigned char>(c) < 0x80) {
      out->push_back(c);
    } else {
      const size_t n = Utf8Length(value.substr(i));
      if (n == 0) {
        out->append("\xEF\xBF\xBD");  // U+FFFD REPLACEMENT CHARACTER
        ++i;
        continue;
      }
      out->append(value.substr(i, n));
      i += n;
      continue;
    }
    ++i;
  }
}

void AppendEscapedHelp(std::string* out, std::string_view help) {
  size_t i = 0;
  while (i < help.size()) {
    const char c = help[i];
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '\n') {
      out->append("\\n");
    } else if (static_cast<unsigned char>(c) < 0x80) {
      out->push_back(c);
    } else {
      // Prometheus' scrape parser rejects a HELP text that is not valid UTF-8 (the whole
      // scrape), as it does a label value.
      const size_t n = Utf8Length(help.substr(i));
      out->append(n == 0 ? std::string_view("\xEF\xBF\xBD") : help.substr(i, n));
      i += n == 0 ? 1 : n;
      continue;
    }
    ++i;
  }
}

void AppendValue(std::string* out, double value) {
  if (std::isnan(value)) {
    out->append("NaN");
    return;
  }
  if (std::isinf(value)) {
    out->append(value > 0 ? "+Inf" : "-Inf");
    return;
  }
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  if (ec != std::errc()) {
    out->append("NaN");  // cannot happen for a finite double in 32 bytes
    return;
  }
  out->append(buf, end);
}

std::string FormatValue(double value) {
  std::string s;
  AppendValue(&s, value);
  return s;
}

std::string FormatLabelPairs(const std::vector<std::string>& names,
                             const std::vector<std::string>& values) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < values.size(); ++i) {
    if (i > 0) out.push_back(',');
    out.append(names[i]);
    out.append("=\"");
    AppendEscapedLabelValue(&out, values[i]);
    out.push_back('"');
  }
  return out;
}

}  // namespace spawnpoint::metrics
