// The text format's building blocks: escaping, numbers, names and the naming conventions.
#include "metrics/exposition.h"

#include <cmath>
#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace spawnpoint::metrics {
namespace {

using ::testing::HasSubstr;

std::string EscapedLabel(std::string_view v) {
  std::string out;
  AppendEscapedLabelValue(&out, v);
  return out;
}

std::string EscapedHelp(std::string_view v) {
  std::string out;
  AppendEscapedHelp(&out, v);
  return out;
}

TEST(MetricsEscapeTest, LabelValuesEscapeBackslashQuoteAndNewline) {
  EXPECT_EQ(EscapedLabel(R"(C:\path)"), R"(C:\\path)");
  EXPECT_EQ(EscapedLabel(R"(say "hi")"), R"(say \"hi\")");
  EXPECT_EQ(EscapedLabel("two\nlines"), R"(two\nlines)");
  EXPECT_EQ(EscapedLabel("\\\"\n"), R"(\\\"\n)");
  // Tabs, carriage returns and braces are legal as they are.
  EXPECT_EQ(EscapedLabel("a\tb\rc{}=,"), "a\tb\rc{}=,");
}

TEST(MetricsEscapeTest, LabelValuesKeepUtf8AndReplaceInvalidBytes) {
  EXPECT_EQ(EscapedLabel("Grüße 日本 🚀"), "Grüße 日本 🚀");
  EXPECT_EQ(EscapedLabel("bad\xff"
                         "byte"),
            "bad\xEF\xBF\xBD"
            "byte");
  EXPECT_EQ(EscapedLabel("cut \xE6\x97"), "cut \xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(EscapedLabel("overlong \xC0\xAF"), "overlong \xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(EscapedLabel("surrogate \xED\xA0\x80").substr(0, 13), "surrogate \xEF\xBF\xBD");
}

TEST(MetricsEscapeTest, HelpEscapesBackslashAndNewlineButNotQuotes) {
  EXPECT_EQ(EscapedHelp(R"(a\b)"), R"(a\\b)");
  EXPECT_EQ(EscapedHelp("line1\nline2"), R"(line1\nline2)");
  EXPECT_EQ(EscapedHelp(R"(the "quoted" word)"), R"(the "quoted" word)");
}

// Found by tests/fuzz (metrics_escape, #15): Prometheus' scrape parser refuses a HELP text
// that is not valid UTF-8, and with it the whole scrape.
TEST(MetricsEscapeTest, HelpKeepsUtf8AndReplacesInvalidBytes) {
  EXPECT_EQ(EscapedHelp("Grüße 日本 🚀"), "Grüße 日本 🚀");
  EXPECT_EQ(EscapedHelp("bad\xff\\"), "bad\xEF\xBF\xBD\\\\");
  EXPECT_EQ(EscapedHelp("cut \xE6\x97"), "cut \xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(MetricsValueTest, ShortestRoundTripAndSpecialValues) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(1), "1");
  EXPECT_EQ(FormatValue(-3.5), "-3.5");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(1234567), "1234567");
  EXPECT_EQ(FormatValue(1e21), "1e+21");
  EXPECT_EQ(FormatValue(85899345920.0), "85899345920");
  EXPECT_EQ(std::stod(FormatValue(1.0 / 3)), 1.0 / 3);
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
}

TEST(MetricsNameTest, MetricNames) {
  EXPECT_TRUE(ValidateMetricName("spawnpoint_gpu_power_watts").ok());
  EXPECT_TRUE(ValidateMetricName("DCGM_FI_DEV_GPU_UTIL").ok());
  EXPECT_TRUE(ValidateMetricName("job:rate5m").ok());  // recording-rule style
  EXPECT_TRUE(ValidateMetricName("_x").ok());
  EXPECT_FALSE(ValidateMetricName("").ok());
  EXPECT_FALSE(ValidateMetricName("1abc").ok());
  EXPECT_FALSE(ValidateMetricName("has-dash").ok());
  EXPECT_FALSE(ValidateMetricName("has space").ok());
  EXPECT_FALSE(ValidateMetricName("ümlaut").ok());
}

TEST(MetricsNameTest, LabelNames) {
  EXPECT_TRUE(ValidateLabelName("pci_bus_id").ok());
  EXPECT_TRUE(ValidateLabelName("UUID").ok());
  EXPECT_FALSE(ValidateLabelName("").ok());
  EXPECT_FALSE(ValidateLabelName("a:b").ok());  // colons are for metric names only
  EXPECT_FALSE(ValidateLabelName("0gpu").ok());
  Status reserved = ValidateLabelName("__name__");
  EXPECT_FALSE(reserved.ok());
  EXPECT_THAT(reserved.message(), HasSubstr("reserves"));
}

TEST(MetricsConventionTest, CountersAndOnlyCountersEndInTotal) {
  EXPECT_TRUE(CheckNamingConventions("x_batches_total", MetricType::kCounter).ok());
  Status s = CheckNamingConventions("x_batches", MetricType::kCounter);
  EXPECT_THAT(s.message(), HasSubstr("must end in \"_total\""));
  EXPECT_FALSE(CheckNamingConventions("x_up_total", MetricType::kGauge).ok());
  EXPECT_FALSE(CheckNamingConventions("x_total", MetricType::kHistogram).ok());
}

TEST(MetricsConventionTest, BaseUnitsOnly) {
  EXPECT_TRUE(CheckNamingConventions("x_wait_seconds_total", MetricType::kCounter).ok());
  EXPECT_TRUE(CheckNamingConventions("x_memory_used_bytes", MetricType::kGauge).ok());
  EXPECT_TRUE(CheckNamingConventions("x_utilisation_ratio", MetricType::kGauge).ok());
  Status ms = CheckNamingConventions("x_latency_milliseconds", MetricType::kHistogram);
  EXPECT_THAT(ms.message(), HasSubstr("base units"));
  EXPECT_FALSE(CheckNamingConventions("x_wait_ms_total", MetricType::kCounter).ok());
  EXPECT_FALSE(CheckNamingConventions("x_memory_mib", MetricType::kGauge).ok());
  EXPECT_FALSE(CheckNamingConventions("x_util_percent", MetricType::kGauge).ok());
}

TEST(MetricsConventionTest, HistogramNamesLeaveTheSuffixesToTheirSamples) {
  EXPECT_TRUE(CheckNamingConventions("x_duration_seconds", MetricType::kHistogram).ok());
  EXPECT_FALSE(CheckNamingConventions("x_duration_count", MetricType::kHistogram).ok());
  EXPECT_FALSE(CheckNamingConventions("x_bucket", MetricType::kHistogram).ok());
  EXPECT_FALSE(CheckNamingConventions("x_sum", MetricType::kHistogram).ok());
}

TEST(MetricsLabelPairsTest, FormatsInOrderWithEscaping) {
  EXPECT_EQ(FormatLabelPairs({"a", "b"}, {"x", "say \"y\""}), R"(a="x",b="say \"y\"")");
  EXPECT_EQ(FormatLabelPairs({}, {}), "");
}

}  // namespace
}  // namespace spawnpoint::metrics
