// The status watchdog (operator/watchdog/status_watchdog.h) against a fake API server on a
// simulated clock: when it marks, what, and what it never overwrites.
#include "operator/watchdog/status_watchdog.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "operator/common/log.h"
#include "operator/kube/log.h"
#include "tests/kube/fake_transport.h"

namespace spawnpoint::op {
namespace {

using kube::HttpRequest;
using kube::HttpResponse;
using kube::testing::FakeTransport;
using kube::testing::JsonResponse;
using kube::testing::StatusResponse;
using std::chrono::seconds;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

constexpr char kLeasePath[] = "/apis/coordination.k8s.io/v1/namespaces/sys/leases/op";
constexpr char kJobs[] = "/apis/spawnpoint.dev/v1alpha1/";

Json Cond(const std::string& type, const std::string& status) {
  return {{"type", type}, {"status", status}, {"reason", "R"}, {"message", "m"}};
}

// The Lease, TrainingJobs (with resourceVersion preconditions on status patches) and events.
class FakeApi {
 public:
  HttpResponse Handle(const HttpRequest& r) {
    std::function<void()> hook;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (r.method == "PATCH") hook = std::exchange(before_patch_, nullptr);
    }
    if (hook) hook();
    std::lock_guard<std::mutex> lock(mu_);
    const std::string path = r.target.substr(0, r.target.find('?'));
    requests_.push_back(r.method + " " + path);
    if (path == kLeasePath) {
      if (lease_error_ != 0) return StatusResponse(lease_error_, "Forbidden", "leases forbidden");
      if (lease_rv_ == 0) return StatusResponse(404, "NotFound", "leases \"op\" not found");
      return JsonResponse(
          200, Json({{"metadata", {{"name", "op"}, {"resourceVersion", std::to_string(lease_rv_)}}},
                     {"spec", {{"holderIdentity", "operator-1"}}}})
                   .dump());
    }
    if (r.method == "GET" && (path == std::string(kJobs) + "trainingjobs" ||
                              path.find("/trainingjobs") == path.size() - 13)) {
      Json items = Json::array();
      for (const auto& [key, job] : jobs_) {
        if (path == std::string(kJobs) + "trainingjobs" ||
            path == std::string(kJobs) + "namespaces/" + NamespaceOf(job) + "/trainingjobs") {
          items.push_back(job);
        }
      }
      return JsonResponse(
          200, Json({{"metadata", {{"resourceVersion", "1"}}}, {"items", items}}).dump());
    }
    if (r.method == "PATCH") {
      if (patch_error_ != 0) return StatusResponse(patch_error_, "Forbidden", "patch forbidden");
      for (auto& [key, job] : jobs_) {
        const std::string status_path = std::string(kJobs) + "namespaces/" + NamespaceOf(job) +
                                        "/trainingjobs/" + NameOf(job) + "/status";
        if (path != status_path) continue;
        Json patch = Json::parse(r.body);
        const std::string precondition = Str(patch, "/metadata/resourceVersion"_json_pointer);
        if (!precondition.empty() &&
            precondition != Str(job, "/metadata/resourceVersion"_json_pointer)) {
          return StatusResponse(409, "Conflict", "the object has been modified");
        }
        job["status"]["conditions"] = patch["status"]["conditions"];
        Bump(&job);
        return JsonResponse(200, job.dump());
      }
      return StatusResponse(404, "NotFound", "no such job");
    }
    if (r.method == "POST" && path.find("/events") != std::string::npos) {
      events_.push_back(Json::parse(r.body));
      return JsonResponse(201, r.body);
    }
    return StatusResponse(405, "MethodNotAllowed", r.method + " " + r.target);
  }

  void AddJob(const std::string& ns, const std::string& name, const std::string& phase,
              Json conditions = Json::array()) {
    std::lock_guard<std::mutex> lock(mu_);
    Json job = {{"metadata",
                 {{"name", name}, {"namespace", ns}, {"uid", "uid-" + name}, {"generation", 1}}},
                {"status", {{"conditions", conditions}}}};
    if (!phase.empty()) job["status"]["phase"] = phase;
    Bump(&job);
    jobs_[ns + "/" + name] = job;
  }
  Json Job(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return jobs_.at(key);
  }
  Json StaleCondition(const std::string& key) {
    const Json job = Job(key);
    for (const Json& c : job["status"]["conditions"]) {
      if (c["type"] == "StatusStale") return c;
    }
    return Json();
  }
  void RenewLease() {
    std::lock_guard<std::mutex> lock(mu_);
    lease_rv_ = ++rv_;
  }
  void FailLeaseReads(int code) {
    std::lock_guard<std::mutex> lock(mu_);
    lease_error_ = code;
  }
  void FailPatches(int code) {
    std::lock_guard<std::mutex> lock(mu_);
    patch_error_ = code;
  }
  // Runs `f` (the operator writing the job) just before the next PATCH is applied.
  void BeforeNextPatch(std::function<void()> f) {
    std::lock_guard<std::mutex> lock(mu_);
    before_patch_ = std::move(f);
  }
  void TouchJob(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    Bump(&jobs_.at(key));
  }
  std::vector<Json> Events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  int Patches() {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const auto& r : requests_) n += r.rfind("PATCH", 0) == 0;
    return n;
  }
  std::vector<std::string> Requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  void Bump(Json* object) { (*object)["metadata"]["resourceVersion"] = std::to_string(++rv_); }

  std::mutex mu_;
  std::map<std::string, Json> jobs_;
  std::vector<Json> events_;
  std::vector<std::string> requests_;
  std::function<void()> before_patch_;
  int64_t rv_ = 100;
  int64_t lease_rv_ = 0;  // 0: no Lease
  int lease_error_ = 0;
  int patch_error_ = 0;
};

class StatusWatchdogTest : public ::testing::Test {
 protected:
  StatusWatchdogTest()
      : wall_(&clock_, WallTime(seconds(1'714'557'600))),  // 2024-05-01T10:00:00Z
        transport_(std::make_shared<FakeTransport>(&clock_)),
        client_(kube::RestConfig{.server = "http://fake"}, transport_, &clock_,
                {.qps = 0, .logger = kube::NullLogger()}) {
    transport_->SetSendHandler([this](const HttpRequest& r) { return api_.Handle(r); });
  }

  StatusWatchdog Make(std::vector<std::string> namespaces = {}) {
    return StatusWatchdog(&client_, &wall_,
                          {.lease_namespace = "sys",
                           .lease_name = "op",
                           .namespaces = std::move(namespaces),
                           .stale_after = seconds(45),
                           .interval = seconds(5),
                           .identity = "watchdog-1"},
                          Logger());
  }

  SimulatedClock clock_;
  WallClock wall_;
  FakeApi api_;
  std::shared_ptr<FakeTransport> transport_;
  kube::Client client_;
};

TEST_F(StatusWatchdogTest, ALeaseThatIsRenewedMarksNothing) {
  api_.RenewLease();
  api_.AddJob("team-a", "running", "Running");
  StatusWatchdog watchdog = Make();
  for (int i = 0; i < 30; ++i) {  // 150 s, the Lease renewed every round
    WatchdogRound round = watchdog.Check();
    EXPECT_TRUE(round.lease_read);
    EXPECT_FALSE(round.stale) << i;
    clock_.Advance(seconds(5));
    api_.RenewLease();
  }
  EXPECT_EQ(api_.Patches(), 0);
  EXPECT_THAT(api_.Events(), IsEmpty());
}

TEST_F(StatusWatchdogTest, UnfinishedJobsAreMarkedOnceTheLeaseWasUnchangedForStaleAfter) {
  api_.RenewLease();
  api_.AddJob("team-a", "running", "Running", Json::array({Cond("Running", "True")}));
  api_.AddJob("team-a", "new", "");
  api_.AddJob("team-b", "suspended", "Suspended");
  api_.AddJob("team-a", "done", "Succeeded", Json::array({Cond("Succeeded", "True")}));
  api_.AddJob("team-b", "failed", "Failed", Json::array({Cond("Failed", "True")}));
  StatusWatchdog watchdog = Make();
  for (int t = 0; t < 45; t += 5) {  // unchanged, but not yet for 45 s
    WatchdogRound round = watchdog.Check();
    EXPECT_FALSE(round.stale) << t;
    clock_.Advance(seconds(5));
  }
  EXPECT_EQ(api_.Patches(), 0);
  WatchdogRound round = watchdog.Check();  // 45 s after the last change it saw
  EXPECT_TRUE(round.stale);
  EXPECT_THAT(round.marked,
              UnorderedElementsAre("team-a/running", "team-a/new", "team-b/suspended"));
  Json stale = api_.StaleCondition("team-a/running");
  EXPECT_EQ(stale["status"], "True");
  EXPECT_EQ(stale["reason"], "OperatorNotRunning");
  EXPECT_EQ(stale["lastTransitionTime"], "2024-05-01T10:00:45Z");
  EXPECT_THAT(stale["message"].get<std::string>(),
              HasSubstr("its Lease sys/op has not been renewed for 45 s (holder \"operator-1\", "
                        "last change seen at 2024-05-01T10:00:00Z). This status (phase Running) "
                        "is what the operator last wrote"));
  // The job's other conditions are kept.
  EXPECT_EQ(api_.Job("team-a/running")["status"]["conditions"][0]["type"], "Running");
  EXPECT_TRUE(api_.StaleCondition("team-a/done").is_null());
  EXPECT_TRUE(api_.StaleCondition("team-b/failed").is_null());
  // One Warning event a job, by the watchdog.
  std::vector<Json> events = api_.Events();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0]["reason"], "StatusStale");
  EXPECT_EQ(events[0]["type"], "Warning");
  EXPECT_EQ(events[0]["reportingComponent"], "spawnpoint.dev/spawnpoint-status-watchdog");
  EXPECT_EQ(events[0]["reportingInstance"], "watchdog-1");
  EXPECT_EQ(events[0]["involvedObject"]["kind"], "TrainingJob");
  // Later rounds mark only what is new.
  clock_.Advance(seconds(5));
  EXPECT_THAT(watchdog.Check().marked, IsEmpty());
  api_.AddJob("team-a", "later", "Pending");
  clock_.Advance(seconds(5));
  EXPECT_THAT(watchdog.Check().marked, ElementsAre("team-a/later"));
  EXPECT_EQ(api_.Events().size(), 4u);
}

TEST_F(StatusWatchdogTest, ALeaseRenewedAgainStopsTheMarking) {
  api_.RenewLease();
  api_.AddJob("team-a", "a", "Running");
  StatusWatchdog watchdog = Make();
  watchdog.Check();
  clock_.Advance(seconds(45));
  EXPECT_THAT(watchdog.Check().marked, ElementsAre("team-a/a"));
  api_.RenewLease();  // an operator leads again
  api_.AddJob("team-a", "b", "Running");
  clock_.Advance(seconds(5));
  WatchdogRound round = watchdog.Check();
  EXPECT_FALSE(round.stale);
  EXPECT_THAT(round.marked, IsEmpty());
  clock_.Advance(seconds(40));  // not yet 45 s since the renewal
  EXPECT_FALSE(watchdog.Check().stale);
  EXPECT_TRUE(api_.StaleCondition("team-a/b").is_null());
}

TEST_F(StatusWatchdogTest, AStatusWrittenSinceTheListIsNeverOverwritten) {
  api_.RenewLease();
  api_.AddJob("team-a", "a", "Running");
  StatusWatchdog watchdog = Make();
  watchdog.Check();
  clock_.Advance(seconds(45));
  api_.BeforeNextPatch([&] { api_.TouchJob("team-a/a"); });  // the operator wrote it
  WatchdogRound round = watchdog.Check();
  EXPECT_EQ(round.conflicts, 1);
  EXPECT_THAT(round.marked, IsEmpty());
  EXPECT_TRUE(api_.StaleCondition("team-a/a").is_null());
  EXPECT_THAT(api_.Events(), IsEmpty());
  clock_.Advance(seconds(5));
  EXPECT_THAT(watchdog.Check().marked, ElementsAre("team-a/a"));  // read again, marked
}

TEST_F(StatusWatchdogTest, ALeaseThatCannotBeReadIsNoEvidence) {
  api_.RenewLease();
  api_.AddJob("team-a", "a", "Running");
  StatusWatchdog watchdog = Make();
  watchdog.Check();
  api_.FailLeaseReads(403);
  for (int i = 0; i < 30; ++i) {
    clock_.Advance(seconds(5));
    WatchdogRound round = watchdog.Check();
    EXPECT_FALSE(round.lease_read);
    EXPECT_THAT(round.marked, IsEmpty());
  }
  EXPECT_EQ(api_.Patches(), 0);
  // Readable again and unchanged all along: stale (the last change was seen 150 s ago).
  api_.FailLeaseReads(0);
  EXPECT_THAT(watchdog.Check().marked, ElementsAre("team-a/a"));
}

TEST_F(StatusWatchdogTest, NoLeaseAtAllIsNoOperator) {
  api_.AddJob("team-a", "a", "Pending");
  StatusWatchdog watchdog = Make();
  EXPECT_FALSE(watchdog.Check().stale);  // judged from when the watchdog first looked
  clock_.Advance(seconds(45));
  WatchdogRound round = watchdog.Check();
  EXPECT_THAT(round.marked, ElementsAre("team-a/a"));
  EXPECT_THAT(api_.StaleCondition("team-a/a")["message"].get<std::string>(),
              HasSubstr("its Lease sys/op does not exist. This status (phase Pending)"));
}

TEST_F(StatusWatchdogTest, OnlyTheListedNamespacesAreRead) {
  api_.RenewLease();
  api_.AddJob("team-a", "a", "Running");
  api_.AddJob("team-b", "b", "Running");
  api_.AddJob("other", "c", "Running");
  StatusWatchdog watchdog = Make({"team-a", "team-b"});
  watchdog.Check();
  clock_.Advance(seconds(45));
  EXPECT_THAT(watchdog.Check().marked, UnorderedElementsAre("team-a/a", "team-b/b"));
  for (const std::string& r : api_.Requests()) {
    if (r.rfind("GET", 0) == 0 && r.find("trainingjobs") != std::string::npos) {
      EXPECT_THAT(
          r, ::testing::AnyOf(HasSubstr("/namespaces/team-a/"), HasSubstr("/namespaces/team-b/")));
    }
  }
}

// Failures are logged, not repeated every round: a Lease that cannot be read once until a read
// succeeds (then a new failure is news), a refused patch once.
TEST_F(StatusWatchdogTest, AFailureIsLoggedOnceNotEveryRound) {
  std::vector<std::string> lines;
  SetLogSink([&](const std::string& line) { lines.push_back(line); });
  auto count = [&](const std::string& text) {
    return std::count_if(lines.begin(), lines.end(), [&](const std::string& line) {
      return line.find(text) != std::string::npos;
    });
  };
  api_.RenewLease();
  api_.AddJob("team-a", "a", "Running");
  StatusWatchdog watchdog = Make();
  watchdog.Check();
  api_.FailLeaseReads(403);
  for (int i = 0; i < 5; ++i) watchdog.Check();
  EXPECT_EQ(count("cannot read the operator's Lease"), 1);
  api_.FailLeaseReads(0);
  watchdog.Check();
  api_.FailLeaseReads(403);
  watchdog.Check();
  EXPECT_EQ(count("cannot read the operator's Lease"), 2);
  api_.FailLeaseReads(0);
  api_.FailPatches(403);
  clock_.Advance(seconds(45));
  for (int i = 0; i < 5; ++i) {
    EXPECT_THAT(watchdog.Check().marked, IsEmpty());
    clock_.Advance(seconds(5));
  }
  EXPECT_EQ(count("cannot mark a job's status stale"), 1);
  SetLogSink([](const std::string&) {});
}

}  // namespace
}  // namespace spawnpoint::op
