// ParseQuantity: the Kubernetes quantity forms used for sizes, and clear errors for the rest.

#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "api/training_job.h"

namespace spawnpoint::api {
namespace {

TEST(ParseQuantity, AcceptsKubernetesForms) {
  struct Case {
    const char* text;
    int64_t bytes;
  };
  for (const Case& c : {
           Case{"0", 0},
           Case{"1000000", 1000000},
           Case{"+5", 5},
           Case{"1k", 1000},
           Case{"1M", 1000000},
           Case{"1G", 1000000000},
           Case{"2T", 2000000000000},
           Case{"1P", 1000000000000000},
           Case{"1E", 1000000000000000000},
           Case{"1Ki", 1024},
           Case{"512Mi", 512LL << 20},
           Case{"8Gi", 8LL << 30},
           Case{"1Ti", 1LL << 40},
           Case{"1Pi", 1LL << 50},
           Case{"7Ei", 7LL << 60},
           Case{"1.5Gi", 1610612736},
           Case{"0.5Ki", 512},
           Case{".5k", 500},
           Case{"1.", 1},
           Case{"2.50M", 2500000},
           Case{"0.1", 1},  // fractions of a byte round up, as Kubernetes does
           Case{"1e3", 1000},
           Case{"1E9", 1000000000},
           Case{"5e-1", 1},
           Case{"1.5e+2", 150},
           Case{"9223372036854775807", INT64_MAX},
           Case{"000012", 12},
       }) {
    auto bytes = ParseQuantity(c.text);
    ASSERT_TRUE(bytes.ok()) << c.text << ": " << bytes.status().message();
    EXPECT_EQ(*bytes, c.bytes) << c.text;
  }
}

TEST(ParseQuantity, RejectsWithReasons) {
  const std::string help =
      "expected a non-negative number with an optional suffix Ki, Mi, Gi, Ti, Pi, Ei (powers of "
      "1024) or k, M, G, T, P, E (powers of 1000), e.g. \"8Gi\"";
  const std::string too_large =
      "too large; the maximum is 9223372036854775807 bytes (just under 8Ei)";
  struct Case {
    std::string text;
    std::string message;
  };
  for (const Case& c : {
           Case{"", "invalid quantity \"\": empty; " + help},
           Case{"-1Gi", "invalid quantity \"-1Gi\": must not be negative"},
           Case{"Gi", "invalid quantity \"Gi\": must start with a number; " + help},
           Case{"lots", "invalid quantity \"lots\": must start with a number; " + help},
           Case{".", "invalid quantity \".\": must start with a number; " + help},
           Case{"8GB",
                "invalid quantity \"8GB\": unknown suffix \"GB\" (did you mean \"8Gi\" (powers of "
                "1024) or \"8G\" (powers of 1000)?); " +
                    help},
           Case{"64kb",
                "invalid quantity \"64kb\": unknown suffix \"kb\" (did you mean \"64Ki\" (powers "
                "of 1024) or \"64k\" (powers of 1000)?); " +
                    help},
           Case{"8gi",
                "invalid quantity \"8gi\": unknown suffix \"gi\" (did you mean \"8Gi\" (powers of "
                "1024) or \"8G\" (powers of 1000)?); " +
                    help},
           Case{"1K",
                "invalid quantity \"1K\": unknown suffix \"K\" (did you mean \"1Ki\" (powers of "
                "1024) or \"1k\" (powers of 1000)?); " +
                    help},
           Case{"8 Gi", "invalid quantity \"8 Gi\": unknown suffix \" Gi\"; " + help},
           Case{"1.2.3", "invalid quantity \"1.2.3\": unknown suffix \".3\"; " + help},
           Case{"512m",
                "invalid quantity \"512m\": \"m\" is a fraction (milli, micro, nano), not a size "
                "in bytes; did you mean \"512Mi\" (powers of 1024) or \"512M\" (powers of 1000)?"},
           Case{"1e",
                "invalid quantity \"1e\": unknown suffix \"e\" (did you mean \"1Ei\" (powers of "
                "1024) or \"1E\" (powers of 1000)?); " +
                    help},
           Case{"1e+", "invalid quantity \"1e+\": the exponent has no digits"},
           Case{"1e1000", "invalid quantity \"1e1000\": exponent out of range"},
           Case{"8Ei", "invalid quantity \"8Ei\": " + too_large},
           Case{"9223372036854775808", "invalid quantity \"9223372036854775808\": " + too_large},
           Case{"10E", "invalid quantity \"10E\": " + too_large},
           Case{"1e30", "invalid quantity \"1e30\": " + too_large},
           Case{std::string(40, '9'),
                "invalid quantity \"" + std::string(40, '9') + "\": " + too_large},
       }) {
    auto bytes = ParseQuantity(c.text);
    ASSERT_FALSE(bytes.ok()) << c.text << " gave " << *bytes;
    EXPECT_EQ(bytes.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(bytes.status().message(), c.message);
  }
}

}  // namespace
}  // namespace spawnpoint::api
