// `spawnpoint-operator status-watchdog`'s flags (operator/app/watchdog_options.h).
#include "operator/app/watchdog_options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace spawnpoint::op {
namespace {

using std::chrono::seconds;
using ::testing::HasSubstr;

TEST(WatchdogOptionsTest, TheChartsArguments) {
  auto o = ParseWatchdogArgs({"--lease-namespace=spawnpoint-system", "--lease-name", "sp",
                              "--namespace=team-a,team-b", "--stale-after=1m", "--interval=2s",
                              "--identity", "pod-1", "--log-level=debug"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->lease_namespace, "spawnpoint-system");
  EXPECT_EQ(o->lease_name, "sp");
  EXPECT_EQ(o->namespaces, (std::vector<std::string>{"team-a", "team-b"}));
  EXPECT_EQ(o->stale_after, seconds(60));
  EXPECT_EQ(o->interval, seconds(2));
  EXPECT_EQ(o->identity, "pod-1");
  EXPECT_EQ(o->log_level, "debug");
}

TEST(WatchdogOptionsTest, Defaults) {
  auto o = ParseWatchdogArgs({"--lease-namespace", "sys"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->lease_name, "spawnpoint-operator");
  EXPECT_TRUE(o->namespaces.empty());
  EXPECT_EQ(o->stale_after, seconds(45));
  EXPECT_EQ(o->interval, seconds(5));
}

TEST(WatchdogOptionsTest, BadInputNamesTheFlagAndWhatIsAllowed) {
  EXPECT_THAT(ParseWatchdogArgs({}).status().message(), HasSubstr("--lease-namespace is required"));
  EXPECT_THAT(ParseWatchdogArgs({"--lease-namespace=s", "--stale-after=soon"}).status().message(),
              HasSubstr("--stale-after: expected a duration such as 500ms, 10s, 5m or 1h"));
  EXPECT_THAT(ParseWatchdogArgs({"--lease-namespace=s", "--interval=0"}).status().message(),
              HasSubstr("--interval: must be > 0"));
  EXPECT_THAT(ParseWatchdogArgs({"--lease-namespace=s", "--stale-after=8s", "--interval=5s"})
                  .status()
                  .message(),
              HasSubstr("--stale-after must be at least twice --interval"));
  EXPECT_THAT(ParseWatchdogArgs({"--lease-namespace=s", "--namespace=Team_A"}).status().message(),
              HasSubstr("--namespace"));
  EXPECT_THAT(ParseWatchdogArgs({"--lease-namespace=s", "--leader-elect"}).status().message(),
              HasSubstr("unknown flag \"--leader-elect\""));
  EXPECT_THAT(ParseWatchdogArgs({"--lease-namespace"}).status().message(),
              HasSubstr("--lease-namespace"));
  EXPECT_TRUE(ParseWatchdogArgs({"--help"})->help);
}

}  // namespace
}  // namespace spawnpoint::op
