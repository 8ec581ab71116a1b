// Status round trip and metav1.Condition semantics; wall-clock formatting.
#include "operator/reconciler/job_status.h"

#include <gtest/gtest.h>

#include "operator/common/log.h"
#include "operator/common/wall_clock.h"

namespace spawnpoint::op {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(JobStatusTest, RoundTripDropsUnknownFields) {
  json in = {{"phase", "Running"},
             {"conditions", json::array({{{"type", "Running"},
                                          {"status", "True"},
                                          {"observedGeneration", 2},
                                          {"lastTransitionTime", "2024-05-01T10:00:00Z"},
                                          {"reason", "GangRunning"},
                                          {"message", "m"}}})},
             {"observedGeneration", 2},
             {"worldSize", 8},
             {"gpus", 8},
             {"restarts", 1},
             {"evictions", 2},
             {"lastEviction", {{"reason", "Preempted"}, {"at", "2024-05-01T09:30:00Z"}}},
             {"startTime", "2024-05-01T09:00:00Z"},
             {"nodes", {{"pending", 0}, {"running", 2}, {"succeeded", 0}, {"failed", 0}}},
             {"lastFailure", {{"node", 1}, {"exitCode", 137}}},
             {"utilisation", {{"gpu", 0.9}}},
             {"bogus", 1}};
  json out = JobStatus::FromJson(in).ToJson();
  json expected = in;
  expected.erase("bogus");
  EXPECT_EQ(out, expected);
  EXPECT_EQ(JobStatus::FromJson(out).ToJson(), out);
}

TEST(JobStatusTest, LastTransitionTimeMovesOnlyWhenTheStatusFlips) {
  JobStatus s;
  EXPECT_TRUE(s.SetCondition("Running", true, "GangRunning", "a", 1, "T1"));
  EXPECT_FALSE(s.SetCondition("Running", true, "GangRunning", "b", 2, "T2"));
  EXPECT_EQ(s.Find("Running")->last_transition_time, "T1");
  EXPECT_EQ(s.Find("Running")->message, "b");
  EXPECT_EQ(s.Find("Running")->observed_generation, 2);
  EXPECT_TRUE(s.SetCondition("Running", false, "GangFailed", "c", 2, "T3"));
  EXPECT_EQ(s.Find("Running")->last_transition_time, "T3");
  EXPECT_FALSE(s.IsTrue("Running"));
  EXPECT_FALSE(s.Finished());
  s.SetCondition("Failed", true, "X", "y", 2, "T4");
  EXPECT_TRUE(s.Finished());
}

TEST(WallClockTest, FollowsTheInjectedClock) {
  SimulatedClock clock;
  WallClock wall(&clock, WallTime(seconds(1'714'557'600)));
  EXPECT_EQ(FormatTime(wall.Now()), "2024-05-01T10:00:00Z");
  clock.Advance(milliseconds(61'250));
  EXPECT_EQ(FormatTime(wall.Now()), "2024-05-01T10:01:01Z");
  EXPECT_EQ(FormatTime(wall.Now(), true), "2024-05-01T10:01:01.250Z");
}

TEST(WallClockTest, ParsesRfc3339) {
  auto t = ParseTime("2024-05-01T10:00:00Z");
  ASSERT_TRUE(t);
  EXPECT_EQ(*t, WallTime(seconds(1'714'557'600)));
  EXPECT_EQ(*ParseTime("2024-05-01T10:00:00.5Z"), *t + milliseconds(500));
  EXPECT_EQ(*ParseTime("2024-05-01T12:00:00+02:00"), *t);
  EXPECT_FALSE(ParseTime(""));
  EXPECT_FALSE(ParseTime("2024-05-01 10:00:00"));
  EXPECT_FALSE(ParseTime("2024-05-01T10:00:00"));
  EXPECT_EQ(FormatDuration(milliseconds(450)), "450ms");
  EXPECT_EQ(FormatDuration(seconds(2)), "2s");
  EXPECT_EQ(FormatDuration(milliseconds(2500)), "2.5s");
  EXPECT_EQ(FormatDuration(seconds(301)), "5m1s");
}

TEST(LogTest, LogfmtLinesCarryTheContext) {
  std::vector<std::string> lines;
  SetLogSink([&](const std::string& line) { lines.push_back(line); });
  Logger log(LogFields{{"job", "ml/resnet"}});
  log.With({{"reconcile", "r7"}}).Info("created pods", {{"pods", "a, b"}, {"n", 2}});
  SetLogSink([](const std::string&) {});
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(
      lines[0].find("level=info msg=\"created pods\" job=ml/resnet reconcile=r7 pods=\"a, b\" n=2"),
      std::string::npos)
      << lines[0];
  EXPECT_EQ(LogfmtValue("say \"hi\"\n"), "\"say \\\"hi\\\"\\n\"");
}

}  // namespace
}  // namespace spawnpoint::op
