// The Prometheus text exposition format, version 0.0.4: metric and label name rules, the
// naming conventions spawnpoint holds its own metrics to, escaping and number formatting.
// Everything here is a pure function of its arguments and thread-safe.
//
// The format, as Prometheus and promtool read it:
//   # HELP <name> <help, with \ and newline escaped>
//   # TYPE <name> counter|gauge|histogram|summary|untyped
//   <name>{<label>="<value, with \ " and newline escaped>",...} <value>
// Every sample of one metric family is written in one group after its HELP and TYPE.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace spawnpoint::metrics {

// What /metrics answers with; Prometheus picks the parser from it.
inline constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

enum class MetricType { kCounter, kGauge, kHistogram, kUntyped };

// "counter", "gauge", "histogram", "untyped".
const char* MetricTypeName(MetricType type);

// Label name/value pairs, in the order they are written.
using Labels = std::vector<std::pair<std::string, std::string>>;

// [a-zA-Z_:][a-zA-Z0-9_:]*
Status ValidateMetricName(std::string_view name);
// [a-zA-Z_][a-zA-Z0-9_]*, and not starting with "__" (reserved for Prometheus itself).
Status ValidateLabelName(std::string_view name);

// The conventions (https://prometheus.io/docs/practices/naming/) as rules that can fail:
//  - a counter's name ends in "_total", and nothing else's does;
//  - values are in base units, named by a suffix: "_seconds", "_bytes", "_ratio" (0..1),
//    so a name ending in a scaled or non-base unit ("_milliseconds", "_ms", "_kilobytes",
//    "_mib", "_percent", ...) is refused, also before "_total";
//  - a histogram's name does not end in "_bucket", "_sum" or "_count" (its samples do).
// Foreign names kept for compatibility (DCGM exporter's) skip this check, not the syntax one.
Status CheckNamingConventions(std::string_view name, MetricType type);

// Appends `value` escaped for a label value: \ -> \\, " -> \", newline -> \n. Bytes that
// are not valid UTF-8 become U+FFFD, because Prometheus rejects the whole scrape otherwise.
void AppendEscapedLabelValue(std::string* out, std::string_view value);
// Appends `help` escaped for a HELP line: \ -> \\, newline -> \n (quotes stay as they are);
// bytes that are not valid UTF-8 become U+FFFD, as in label values.
void AppendEscapedHelp(std::string* out, std::string_view help);

// Appends a sample value: the shortest text that reads back as the same double ("1",
// "0.25", "1e+21"), "NaN", "+Inf" or "-Inf". Allocates only if `out` must grow.
void AppendValue(std::string* out, double value);
std::string FormatValue(double value);

// `a="x",b="y"` (without braces) for names[i]=values[i]; names.size() must equal
// values.size() (the caller checks).
std::string FormatLabelPairs(const std::vector<std::string>& names,
                             const std::vector<std::string>& values);

}  // namespace spawnpoint::metrics
