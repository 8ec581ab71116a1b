// The agent's metrics flags: --metrics-addr (default 127.0.0.1:9400; "off" or "" disable it;
// checked when parsed, so a typo is a bad flag before anything starts) and --dcgm-compatible-names.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/cli/options.h"

namespace spawnpoint::agent {
namespace {

using ::testing::HasSubstr;

StatusOr<AgentOptions> Parse(std::vector<std::string> extra) {
  std::vector<std::string> args = {"run", "-f", "job.yaml"};
  args.insert(args.end(), extra.begin(), extra.end());
  return ParseAgentArgs(args);
}

TEST(MetricsOptionsTest, DefaultsServeOnPort9400WithOurNames) {
  auto o = Parse({});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->metrics_addr, "127.0.0.1:9400") << "a local run serves this machine only";
  EXPECT_FALSE(o->dcgm_compatible_names);
}

TEST(MetricsOptionsTest, AddressesOffAndDcgmNames) {
  EXPECT_EQ(Parse({"--metrics-addr", "127.0.0.1:9500"})->metrics_addr, "127.0.0.1:9500");
  EXPECT_EQ(Parse({"--metrics-addr=[::1]:0"})->metrics_addr, "[::1]:0");
  EXPECT_EQ(Parse({"--metrics-addr", "off"})->metrics_addr, "off");
  EXPECT_EQ(Parse({"--metrics-addr="})->metrics_addr, "");
  EXPECT_TRUE(Parse({"--dcgm-compatible-names"})->dcgm_compatible_names);
}

TEST(MetricsOptionsTest, AMalformedAddressIsABadFlag) {
  for (const char* bad : {"9400x", "host:", "::1:9400", ":99999"}) {
    auto o = Parse({"--metrics-addr", bad});
    ASSERT_FALSE(o.ok()) << bad;
    EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(o.status().message(), HasSubstr("--metrics-addr"));
  }
}

}  // namespace
}  // namespace spawnpoint::agent
