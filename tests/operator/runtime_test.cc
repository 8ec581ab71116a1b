// The operator's runtime pieces without a cluster: flags, the HTTP reader over loopback, the
// agents' status aggregation and poller, events.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <mutex>

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
  EXPECT_EQ(o->namespaces, std::vector<std::string>{"ml"});
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

// --namespace a,b: a list (one watch per namespace); "" or no flag: every namespace. Each name
// is checked as the API server would: a bad one is named in the error, not found later as a
// watch that fails forever.
TEST(OperatorOptionsTest, NamespaceTakesAListOfDnsLabels) {
  using Names = std::vector<std::string>;
  EXPECT_EQ(ParseOperatorArgs({"--namespace", "team-a,team-b,3rd"})->namespaces,
            (Names{"team-a", "team-b", "3rd"}));
  EXPECT_EQ(ParseOperatorArgs({"--namespace=ml"})->namespaces, Names{"ml"});
  EXPECT_EQ(ParseOperatorArgs({"--namespace="})->namespaces, Names{});
  EXPECT_EQ(ParseOperatorArgs({})->namespaces, Names{});
  const std::string rule = "is not a DNS label (lowercase letters, digits and '-'";
  for (const auto& [value, bad] : std::vector<std::pair<std::string, std::string>>{
           {"team-a,Team_B", "\"Team_B\""},
           {"team-a,", "\"\""},
           {",team-a", "\"\""},
           {"team-a, team-b", "\" team-b\""},
           {"-a", "\"-a\""},
           {std::string(64, 'a'), "\"" + std::string(64, 'a') + "\""}}) {
    auto o = ParseOperatorArgs({"--namespace", value});
    ASSERT_FALSE(o.ok()) << value;
    EXPECT_THAT(o.status().message(),
                HasSubstr("--namespace: namespace " + bad + " in \"" + value + "\" " + rule))
        << value;
  }
  EXPECT_TRUE(ParseOperatorArgs({"--namespace", std::string(63, 'a')}).ok());
  EXPECT_THAT(ParseOperatorArgs({"--namespace", "a,b,a"}).status().message(),
              HasSubstr("--namespace: namespace \"a\" is listed twice in \"a,b,a\""));
}

// A create the quota refused: tried again after --quota-retry, backing off to --quota-retry-max,
// and on a ResourceQuota's change unless --watch-resource-quotas=false (RBAC without it).
TEST(OperatorOptionsTest, QuotaRetriesAndTheQuotaWatch) {
  auto defaults = ParseOperatorArgs({});
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->quota_retry, seconds(5));
  EXPECT_EQ(defaults->quota_retry_max, seconds(60));
  EXPECT_TRUE(defaults->watch_quotas);
  auto o = ParseOperatorArgs(
      {"--quota-retry", "10m", "--quota-retry-max=1h", "--watch-resource-quotas=false"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->quota_retry, std::chrono::minutes(10));
  EXPECT_EQ(o->quota_retry_max, std::chrono::hours(1));
  EXPECT_FALSE(o->watch_quotas);
  EXPECT_TRUE(ParseOperatorArgs({"--watch-resource-quotas"})->watch_quotas);
  EXPECT_THAT(ParseOperatorArgs({"--watch-resource-quotas=no"}).status().message(),
              HasSubstr("--watch-resource-quotas: expected true or false, got \"no\""));
  EXPECT_THAT(ParseOperatorArgs({"--quota-retry", "2m"}).status().message(),
              HasSubstr("--quota-retry-max must be at least --quota-retry"));
}

TEST(OperatorOptionsTest, TheLeaseIsInTheOneWatchedNamespaceElseTheConfigs) {
  auto lease_ns = [](std::vector<std::string> args) {
    return LeaseNamespace(*ParseOperatorArgs(args), "from-config");
  };
  EXPECT_EQ(lease_ns({"--namespace=ml"}), "ml");
  EXPECT_EQ(lease_ns({"--namespace=team-a,team-b"}), "from-config");
  EXPECT_EQ(lease_ns({}), "from-config");
  EXPECT_EQ(lease_ns({"--namespace=team-a,team-b", "--leader-elect-namespace=ops"}), "ops");
  EXPECT_EQ(lease_ns({"--namespace=ml", "--leader-elect-namespace=ops"}), "ops");
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
  EXPECT_TRUE(ParseOperatorArgs({"--version"})->version);
  EXPECT_FALSE(ParseOperatorArgs({})->version);
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
  auto status = reader.Read("127.0.0.1", port, "");
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  std::vector<PodReading> readings;
  readings.push_back({"job-node-0", *status});
  readings.push_back({"job-node-1", reader.Read("127.0.0.1", 1, "")});  // nothing listens there
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

// A document whose progress[] has `busy` for ranks first_rank, first_rank+1, ...; a negative
// figure: no full window yet (null).
json ProgressDoc(int first_rank, const std::vector<double>& busy) {
  json progress = json::array();
  for (size_t i = 0; i < busy.size(); ++i) {
    progress.push_back({{"rank", first_rank + static_cast<int>(i)},
                        {"steps", 40},
                        {"lastStepAgeSeconds", 0.01},
                        {"stepSource", "optimizer"},
                        {"stalled", false},
                        {"busySeconds", busy[i] < 0 ? json(nullptr) : json(busy[i])},
                        {"waitSeconds", busy[i] < 0 ? json(nullptr) : json(0.01)}});
  }
  // The agent's own verdict among its node's ranks, which the job's does not use.
  return json{{"phase", "Running"}, {"progress", progress}, {"straggler", nullptr}};
}

// The agents' progress[] judged together (api/straggler.h): the slowest rank of the job.
TEST(JobStragglerTest, TheSlowestRankOfTheWholeJobIsNamed) {
  // One rank per node: no agent can tell, the operator can.
  std::vector<PodReading> two;
  two.push_back({"job-node-0", ProgressDoc(0, {0.05})});
  two.push_back({"job-node-1", ProgressDoc(1, {0.1})});
  std::optional<JobStragglerReading> r = JobStraggler(two, 1.5, nullptr);
  ASSERT_TRUE(r.has_value());
  EXPECT_DOUBLE_EQ(r->slowest_ratio, 2.0);
  ASSERT_TRUE(r->straggler.is_object());
  EXPECT_EQ(r->straggler["rank"], 1);
  EXPECT_EQ(r->straggler["pod"], "job-node-1");
  EXPECT_DOUBLE_EQ(r->straggler["ratio"].get<double>(), 2.0);
  EXPECT_EQ(r->straggler["busySeconds"], 0.1);
  EXPECT_EQ(r->straggler["peersBusySeconds"], 0.05);
  EXPECT_EQ(r->straggler["windowSteps"], 20);
  EXPECT_EQ(r->straggler["message"],
            "rank 1 (pod job-node-1) is 2.00x slower than the other ranks: 0.1 s of its own work "
            "per step vs 0.05 s (medians of the last 20 steps)");

  // Against the median of every other rank, whatever its node: 4 ranks on 2 nodes.
  std::vector<PodReading> four;
  four.push_back({"job-node-0", ProgressDoc(0, {0.05, 0.06})});
  four.push_back({"job-node-1", ProgressDoc(2, {0.04, 0.09})});
  r = JobStraggler(four, 1.5, nullptr);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->straggler["rank"], 3);
  EXPECT_DOUBLE_EQ(r->straggler["peersBusySeconds"].get<double>(), 0.05);
  EXPECT_DOUBLE_EQ(r->slowest_ratio, 0.09 / 0.05);
}

TEST(JobStragglerTest, BelowTheRatioOrWithoutFiguresNoneIsNamed) {
  std::vector<PodReading> close;
  close.push_back({"job-node-0", ProgressDoc(0, {0.1, 0.1})});
  close.push_back({"job-node-1", ProgressDoc(2, {0.13})});
  std::optional<JobStragglerReading> r = JobStraggler(close, 1.5, nullptr);
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->straggler.is_null());
  EXPECT_NEAR(r->slowest_ratio, 1.3, 1e-9);
  // Named before, it stays named down to the halfway ratio (1.25) ...
  const json named = {{"rank", 2}, {"pod", "job-node-1"}, {"ratio", 1.6}};
  r = JobStraggler(close, 1.5, named);
  ASSERT_TRUE(r->straggler.is_object());
  EXPECT_EQ(r->straggler["rank"], 2);
  // ... but only the same rank of the same pod.
  EXPECT_TRUE(JobStraggler(close, 1.5, {{"rank", 2}, {"pod", "job-node-0"}})->straggler.is_null());
  EXPECT_TRUE(JobStraggler(close, 1.5, {{"rank", 0}, {"pod", "job-node-1"}})->straggler.is_null());
  // A lower stragglerRatio names it at once.
  EXPECT_EQ(JobStraggler(close, 1.2, nullptr)->straggler["rank"], 2);

  // Fewer than two ranks with a full window: no judgement.
  std::vector<PodReading> early;
  early.push_back({"job-node-0", ProgressDoc(0, {0.05})});
  early.push_back({"job-node-1", ProgressDoc(1, {-1})});
  early.push_back({"job-node-2", json{{"phase", "Running"}}});  // an agent without progress
  r = JobStraggler(early, 1.5, nullptr);
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->straggler.is_null());
  EXPECT_EQ(r->slowest_ratio, 0);

  // A pod that cannot be read: its rank might be the slowest.
  std::vector<PodReading> unread;
  unread.push_back({"job-node-0", ProgressDoc(0, {0.05, 0.2})});
  unread.push_back({"job-node-1", Unavailable("connection refused")});
  EXPECT_FALSE(JobStraggler(unread, 1.5, nullptr).has_value());
}

class ScriptedReader : public AgentStatusReader {
 public:
  StatusOr<json> Read(const std::string& ip, int port, const std::string&) override {
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

// Each pod's document by its IP.
class ProgressReader : public AgentStatusReader {
 public:
  StatusOr<json> Read(const std::string& ip, int, const std::string&) override {
    std::lock_guard<std::mutex> lock(mu);
    auto it = docs.find(ip);
    if (it == docs.end()) return Unavailable("connection refused");
    return it->second;
  }
  std::mutex mu;
  std::map<std::string, json> docs;
};

TEST(UtilisationPollerTest, KeepsTheJobsStragglerAndTheSlowestRanksRatio) {
  SimulatedClock clock;
  WallClock wall(&clock, WallTime(seconds(1'714'557'600)));
  ProgressReader reader;
  reader.docs["10.0.0.1"] = ProgressDoc(0, {0.05});
  reader.docs["10.0.0.2"] = ProgressDoc(1, {0.1});
  RunningJob job{"ml", "a", {{"a-node-0", "10.0.0.1"}, {"a-node-1", "10.0.0.2"}}};
  job.straggler_ratio = 1.5;
  std::vector<RunningJob> running = {job};
  UtilisationPoller poller(
      &reader, &wall, {seconds(30), 9400}, [&] { return running; }, nullptr);
  EXPECT_FALSE(poller.LatestStraggler("ml", "a"));
  poller.PollOnce();
  std::optional<StragglerReading> s = poller.LatestStraggler("ml", "a");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->straggler["rank"], 1);
  EXPECT_EQ(s->straggler["pod"], "a-node-1");
  EXPECT_EQ(s->updated, "2024-05-01T10:00:00Z");
  EXPECT_EQ((*poller.Latest("ml", "a"))["slowestRankRatio"], 2.0);

  // 1.3: below 1.5, but the poller named it last time (hysteresis down to 1.25).
  reader.docs["10.0.0.2"] = ProgressDoc(1, {0.065});
  poller.PollOnce();
  EXPECT_EQ(poller.LatestStraggler("ml", "a")->straggler["rank"], 1);
  EXPECT_EQ((*poller.Latest("ml", "a"))["slowestRankRatio"], 1.3);
  // 1.2: cleared; 1.3 again is not enough for a new naming.
  reader.docs["10.0.0.2"] = ProgressDoc(1, {0.06});
  poller.PollOnce();
  EXPECT_TRUE(poller.LatestStraggler("ml", "a")->straggler.is_null());
  reader.docs["10.0.0.2"] = ProgressDoc(1, {0.065});
  poller.PollOnce();
  EXPECT_TRUE(poller.LatestStraggler("ml", "a")->straggler.is_null());

  // A new poller (the operator restarted) goes by status.straggler.
  running[0].straggler = {{"rank", 1}, {"pod", "a-node-1"}, {"ratio", 1.6}};
  UtilisationPoller restarted(
      &reader, &wall, {seconds(30), 9400}, [&] { return running; }, nullptr);
  restarted.PollOnce();
  EXPECT_EQ(restarted.LatestStraggler("ml", "a")->straggler["rank"], 1);

  // A pod not read: no verdict, and no ratio.
  reader.docs.erase("10.0.0.1");
  poller.PollOnce();
  EXPECT_FALSE(poller.LatestStraggler("ml", "a"));
  EXPECT_FALSE(poller.Latest("ml", "a")->contains("slowestRankRatio"));
  running.clear();
  restarted.PollOnce();
  EXPECT_FALSE(restarted.LatestStraggler("ml", "a")) << "a job no longer running is forgotten";
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
