// The operator's runtime pieces without a cluster: flags, the HTTP reader over loopback, the
// agents' status aggregation and poller, events.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "metrics/server.h"
#include "operator/app/options.h"
#include "operator/controller/event_recorder.h"
#include "operator/http/http_get.h"
#include "operator/utilisation/agent_status.h"
#include "operator/utilisation/utilisation_poller.h"
#include "tests/kube/fake_clock.h"
#include "tests/support/test_process.h"

namespace spawnpoint::op {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

TEST(OperatorOptionsTest, ParsesTheFlags) {
  auto o = ParseOperatorArgs({"--kubeconfig",
                              "/kc",
                              "--namespace=ml",
                              "--leader-elect",
                              "--leader-elect-lease-duration",
                              "2s",
                              "--leader-elect-renew-deadline",
                              "1500ms",
                              "--leader-elect-retry-period",
                              "0.25",
                              "--metrics-addr",
                              ":9090",
                              "--health-addr",
                              "127.0.0.1:9091",
                              "--agent-image",
                              "a:1",
                              "--max-concurrent-reconciles",
                              "8",
                              "--pending-timeout",
                              "10m",
                              "--utilisation-interval",
                              "0"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->kubeconfig, "/kc");
  EXPECT_EQ(o->ns, "ml");
  EXPECT_TRUE(o->leader_elect);
  EXPECT_EQ(o->lease_duration, seconds(2));
  EXPECT_EQ(o->renew_deadline, milliseconds(1500));
  EXPECT_EQ(o->retry_period, milliseconds(250));
  EXPECT_EQ(o->metrics_addr, ":9090");
  EXPECT_EQ(o->agent_image, "a:1");
  EXPECT_EQ(o->max_concurrent_reconciles, 8);
  EXPECT_EQ(o->pending_timeout, std::chrono::minutes(10));
  EXPECT_EQ(o->utilisation_interval, Clock::Duration::zero());
}

TEST(OperatorOptionsTest, OffTurnsAnAddressOffAsTheAgentsFlagDoes) {
  for (const char* off : {"off", "0", ""}) {
    auto o = ParseOperatorArgs({"--metrics-addr", off, "--health-addr", off});
    ASSERT_TRUE(o.ok()) << off << ": " << o.status().message();
    EXPECT_EQ(o->metrics_addr, "") << off;
    EXPECT_EQ(o->health_addr, "") << off;
  }
  auto defaults = ParseOperatorArgs({});
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->metrics_addr, ":8080");
  EXPECT_EQ(defaults->health_addr, ":8081");
}

TEST(OperatorOptionsTest, RejectsBadFlagsByName) {
  EXPECT_THAT(ParseOperatorArgs({"--bogus"}).status().message(),
              HasSubstr("unknown flag \"--bogus\""));
  EXPECT_THAT(ParseOperatorArgs({"--max-concurrent-reconciles", "0"}).status().message(),
              HasSubstr("--max-concurrent-reconciles: expected an integer in 1..256"));
  EXPECT_THAT(ParseOperatorArgs({"--pending-timeout", "soon"}).status().message(),
              HasSubstr("--pending-timeout: expected a duration"));
  EXPECT_THAT(ParseOperatorArgs({"--leader-elect", "--leader-elect-lease-duration", "5s"})
                  .status()
                  .message(),
              HasSubstr("must be longer than --leader-elect-renew-deadline"));
  EXPECT_THAT(ParseOperatorArgs({"--namespace"}).status().message(), HasSubstr("missing value"));
  EXPECT_TRUE(ParseOperatorArgs({"--help"})->help);
}

TEST(HttpTest, ReaderOverLoopback) {
  auto server = metrics::MetricsServer::Start({.address = "127.0.0.1:0"});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  (*server)->Handle("/status", [](const metrics::HttpRequest&) {
    return metrics::HttpResponse{
        200, "application/json",
        R"({"loader":[{"rank":0,"stats":{"dataStall":0.1,"samplesPerSecond":100}},)"
        R"({"rank":1,"stats":{"dataStall":0.3,"samplesPerSecond":50}},)"
        R"({"rank":2,"up":false,"stats":{"dataStall":0.9,"samplesPerSecond":7}}],)"
        R"("gpus":[{"utilisation":0.9},{"utilisation":97}]})"};
  });
  int port = (*server)->port();
  auto missing = HttpGet("127.0.0.1", port, "/nope", seconds(2));
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->code, 404);

  HttpAgentStatusReader reader(seconds(2));
  auto status = reader.Read("127.0.0.1", port);
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  std::vector<PodReading> readings;
  readings.push_back({"job-node-0", *status});
  readings.push_back({"job-node-1", reader.Read("127.0.0.1", 1)});  // nothing listens there
  json u = AggregateUtilisation(readings, "2024-05-01T10:00:00Z");
  EXPECT_DOUBLE_EQ(u["gpu"].get<double>(), 0.935);
  EXPECT_DOUBLE_EQ(u["dataStall"].get<double>(), 0.2);
  EXPECT_DOUBLE_EQ(u["samplesPerSecond"].get<double>(), 150.0);
  EXPECT_EQ(u["pods"], 1);
  EXPECT_THAT(u["error"].get<std::string>(), HasSubstr("job-node-1: "));
  EXPECT_EQ(u["updated"], "2024-05-01T10:00:00Z");
  (*server)->Stop();
  EXPECT_FALSE(HttpGet("127.0.0.1", port, "/status", milliseconds(500)).ok());
}

// The agent's document as docs/status.md states it: every field present, null where there
// is nothing (a GPU reading the backend did not give, a rank without loader statistics).
TEST(HttpTest, AggregatesTheAgentsDocumentWithItsNulls) {
  const json doc = json::parse(R"({
    "job": "resnet", "namespace": "ml", "nodeRank": 0, "pod": "resnet-node-0",
    "hostname": "gpu-node-7", "phase": "Running", "members": 3, "membersUp": 3, "ranks": 3,
    "ranksUp": 3, "restarts": 1, "lastFailure": {"rank": 1, "localRank": 1, "nodeRank": 0,
    "exitCode": 137, "signal": "SIGKILL", "reason": "Killed", "message": "killed",
    "time": "2025-05-20T10:11:12Z"}, "gpuBackend": "nvml", "gpuUtilisation": 0.9,
    "dataStall": 0.2, "samplesPerSecond": 150, "gpuError": null,
    "gpus": [{"gpu": 0, "uuid": "GPU-0", "pciBusId": "0000:07:00.0", "modelName": "A100",
              "rank": 0, "utilisation": 0.9, "memoryUsedBytes": 1, "memoryTotalBytes": 2,
              "powerWatts": null, "temperatureCelsius": null},
             {"gpu": 1, "uuid": "GPU-1", "pciBusId": "0000:0f:00.0", "modelName": "A100",
              "rank": 1, "utilisation": null, "memoryUsedBytes": null,
              "memoryTotalBytes": null, "powerWatts": null, "temperatureCelsius": null}],
    "loader": [{"rank": 0, "localRank": 0, "up": true, "pool": null,
                "stats": {"dataStall": 0.1, "samplesPerSecond": 100}},
               {"rank": 1, "localRank": 1, "up": true, "pool": {"workers": []},
                "stats": {"dataStall": 0.3, "samplesPerSecond": 50}},
               {"rank": 2, "localRank": 2, "up": true, "pool": null, "stats": null}],
    "elapsedSeconds": 812.4, "updated": "2025-05-20T10:11:12Z"})");
  std::vector<PodReading> readings;
  readings.push_back({"resnet-node-0", doc});
  json u = AggregateUtilisation(readings, "2025-05-20T10:11:13Z");
  EXPECT_DOUBLE_EQ(u["gpu"].get<double>(), 0.9) << "a null utilisation is no reading";
  EXPECT_DOUBLE_EQ(u["dataStall"].get<double>(), 0.2) << "a rank without statistics is skipped";
  EXPECT_DOUBLE_EQ(u["samplesPerSecond"].get<double>(), 150.0);
  EXPECT_EQ(u["pods"], 1);
  EXPECT_FALSE(u.contains("error"));
}

// The agents' "stall" (docs/status.md) folded into the job's: the culprit silent longest.
TEST(JobStallTest, TheRankSilentLongestIsTheJobsStall) {
  auto doc = [](json stall) {
    return json{{"phase", "Running"}, {"stall", std::move(stall)}, {"progress", json::array()}};
  };
  auto stall = [](int rank, const std::string& pod, double silent) {
    return json{{"rank", rank},
                {"pod", pod},
                {"silentSeconds", silent},
                {"medianStepSeconds", 0.01},
                {"topFrame", "f"},
                {"message", "rank " + std::to_string(rank)}};
  };
  std::vector<PodReading> none;
  none.push_back({"job-node-0", doc(nullptr)});
  none.push_back({"job-node-1", json{{"phase", "Running"}}});  // an agent without the field
  std::optional<json> s = JobStall(none);
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(s->is_null());

  // Node 1's rank hangs; node 0's rank, waiting for it in the allreduce, falls silent later.
  std::vector<PodReading> both;
  both.push_back({"job-node-0", doc(stall(0, "job-node-0", 7.5))});
  both.push_back({"job-node-1", doc(stall(1, "job-node-1", 8.0))});
  s = JobStall(both);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ((*s)["rank"], 1);
  EXPECT_EQ((*s)["pod"], "job-node-1");
  std::vector<PodReading> host;
  host.push_back({"job-node-0", doc(stall(1, "gpu-host-7", 8.0))});
  EXPECT_EQ((*JobStall(host))["pod"], "job-node-0") << "the pod it was read from";

  std::vector<PodReading> tie;
  tie.push_back({"job-node-1", doc(stall(3, "job-node-1", 8.0))});
  tie.push_back({"job-node-0", doc(stall(1, "job-node-0", 8.0))});
  EXPECT_EQ((*JobStall(tie))["rank"], 1) << "then the lowest rank";

  // A pod that cannot be read: no verdict unless another pod reports a stall.
  std::vector<PodReading> unread;
  unread.push_back({"job-node-0", doc(nullptr)});
  unread.push_back({"job-node-1", Unavailable("connection refused")});
  EXPECT_FALSE(JobStall(unread).has_value());
  unread.push_back({"job-node-2", doc(stall(5, "job-node-2", 9))});
  ASSERT_TRUE(JobStall(unread).has_value());
  EXPECT_EQ((*JobStall(unread))["rank"], 5);
}

class ScriptedReader : public AgentStatusReader {
 public:
  StatusOr<json> Read(const std::string& ip, int port) override {
    ++reads;
    last_port = port;
    if (ip == "10.0.0.9") return Unavailable("connection refused");
    return json{
        {"loader",
         json::array({{{"rank", 0}, {"stats", {{"dataStall", 0.5}, {"samplesPerSecond", 10}}}}})}};
  }
  int reads = 0;
  int last_port = 0;
};

TEST(UtilisationPollerTest, ReadsRunningJobsAndForgetsFinishedOnes) {
  SimulatedClock clock;
  WallClock wall(&clock, WallTime(seconds(1'714'557'600)));
  ScriptedReader reader;
  std::vector<RunningJob> running = {
      {"ml", "a", {{"a-node-0", "10.0.0.1"}, {"a-node-1", "10.0.0.9"}}}};
  std::vector<std::string> enqueued;
  UtilisationPoller poller(
      &reader, &wall, {seconds(30), 9400}, [&] { return running; },
      [&](const std::string& ns, const std::string& name) { enqueued.push_back(ns + "/" + name); });
  EXPECT_FALSE(poller.Latest("ml", "a"));
  poller.PollOnce();
  EXPECT_EQ(reader.reads, 2);
  EXPECT_EQ(reader.last_port, 9400);
  auto latest = poller.Latest("ml", "a");
  ASSERT_TRUE(latest);
  EXPECT_EQ((*latest)["pods"], 1);
  EXPECT_EQ((*latest)["dataStall"], 0.5);
  EXPECT_THAT((*latest)["error"].get<std::string>(), HasSubstr("a-node-1: connection refused"));
  EXPECT_EQ((*latest)["updated"], "2024-05-01T10:00:00Z");
  EXPECT_EQ(enqueued, std::vector<std::string>{"ml/a"});
  EXPECT_FALSE(poller.LatestStall("ml", "a")) << "a pod was not read and none reports a stall";
  running = {{"ml", "a", {{"a-node-0", "10.0.0.1"}}}};
  poller.PollOnce();
  auto stall = poller.LatestStall("ml", "a");
  ASSERT_TRUE(stall);
  EXPECT_TRUE(stall->stall.is_null());
  EXPECT_EQ(stall->updated, "2024-05-01T10:00:00Z");
  running.clear();
  poller.PollOnce();
  EXPECT_FALSE(poller.Latest("ml", "a"));
  EXPECT_FALSE(poller.LatestStall("ml", "a"));
}

TEST(UtilisationPollerTest, PollsOnTheClock) {
  kube::testing::FakeClock clock;
  WallClock wall(&clock);
  ScriptedReader reader;
  std::atomic<int> rounds{0};
  UtilisationPoller poller(
      &reader, &wall, {seconds(30), 9400},
      [&] {
        ++rounds;
        return std::vector<RunningJob>{};
      },
      nullptr);
  poller.Start();
  for (int i = 1; i <= 3; ++i) {
    ASSERT_TRUE(clock.BlockUntilNextDeadlineIn(seconds(30))) << "waiting a whole interval";
    EXPECT_EQ(rounds, i - 1);
    clock.Advance(seconds(30));
    ASSERT_TRUE(spawnpoint::testing::WaitUntil([&] { return rounds >= i; }, seconds(5))) << i;
  }
  poller.Stop();
}

TEST(EventRecorderTest, EventObject) {
  json job = {
      {"apiVersion", "spawnpoint.dev/v1alpha1"},
      {"kind", "TrainingJob"},
      {"metadata", {{"name", "j"}, {"namespace", "ml"}, {"uid", "u"}, {"resourceVersion", "7"}}}};
  json e = MakeEvent(job, EventType::kWarning, "NodeFailed", std::string(2000, 'x'), "j.abc",
                     "2024-05-01T10:00:00Z", "op-0");
  EXPECT_EQ(e["metadata"]["namespace"], "ml");
  EXPECT_EQ(e["involvedObject"]["kind"], "TrainingJob");
  EXPECT_EQ(e["involvedObject"]["uid"], "u");
  EXPECT_EQ(e["type"], "Warning");
  EXPECT_EQ(e["reason"], "NodeFailed");
  EXPECT_EQ(e["message"].get<std::string>().size(), 1024u);
  EXPECT_EQ(e["source"]["component"], "spawnpoint-operator");
  EXPECT_EQ(e["reportingInstance"], "op-0");
}

}  // namespace
}  // namespace spawnpoint::op
