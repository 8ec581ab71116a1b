#include "operator/kube/leader_election.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "operator/kube/errors.h"
#include "tests/kube/fake_clock.h"
#include "tests/kube/fake_transport.h"
#include "tests/support/test_process.h"

namespace spawnpoint::kube {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::ConnectionRefused;
using testing::FakeClock;
using testing::FakeTransport;
using ::testing::HasSubstr;
using testing::JsonResponse;
using testing::StatusResponse;

constexpr char kLeasePath[] = "/apis/coordination.k8s.io/v1/namespaces/sys/leases/op";

// One Lease with resourceVersion semantics: 404 until created, 409 on a stale update.
class FakeLeaseApi {
 public:
  HttpResponse Handle(const HttpRequest& r) {
    std::function<void()> hook;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (r.method == "PUT" && before_put_) hook = std::exchange(before_put_, nullptr);
    }
    if (hook) hook();
    std::lock_guard<std::mutex> lock(mu_);
    std::string path = r.target.substr(0, r.target.find('?'));
    if (r.method == "GET" && path == kLeasePath) {
      if (!lease_) return StatusResponse(404, "NotFound", "leases \"op\" not found");
      return JsonResponse(200, lease_->dump());
    }
    if (r.method == "POST" && path == "/apis/coordination.k8s.io/v1/namespaces/sys/leases") {
      if (lease_) return StatusResponse(409, "AlreadyExists", "leases \"op\" already exists");
      lease_ = Json::parse(r.body);
      (*lease_)["metadata"]["resourceVersion"] = std::to_string(++rv_);
      return JsonResponse(201, lease_->dump());
    }
    if (r.method == "PUT" && path == kLeasePath) {
      Json in = Json::parse(r.body);
      if (!lease_) return StatusResponse(404, "NotFound", "leases \"op\" not found");
      if (ResourceVersionOf(in) != ResourceVersionOf(*lease_)) {
        return StatusResponse(409, "Conflict", "the object has been modified");
      }
      lease_ = in;
      (*lease_)["metadata"]["resourceVersion"] = std::to_string(++rv_);
      return JsonResponse(200, lease_->dump());
    }
    return StatusResponse(405, "MethodNotAllowed", r.method + " " + r.target);
  }

  LeaderElectionRecord Record() {
    std::lock_guard<std::mutex> lock(mu_);
    return lease_ ? RecordFromLease(*lease_) : LeaderElectionRecord{};
  }
  // Runs `f` (e.g. a competing write) just before the next PUT is applied.
  void BeforeNextPut(std::function<void()> f) {
    std::lock_guard<std::mutex> lock(mu_);
    before_put_ = std::move(f);
  }
  void TouchLease() {  // someone else writes: the resourceVersion moves on
    std::lock_guard<std::mutex> lock(mu_);
    (*lease_)["metadata"]["resourceVersion"] = std::to_string(++rv_);
  }

 private:
  std::mutex mu_;
  std::optional<Json> lease_;
  int64_t rv_ = 100;
  std::function<void()> before_put_;
};

// A candidate process: its own client and transport (which a test can cut off).
struct Candidate {
  Candidate(const std::string& id, FakeLeaseApi* api, FakeClock* clock, LeaderElectionConfig cfg)
      : transport(std::make_shared<FakeTransport>(clock)) {
    transport->SetSendHandler([this, api](const HttpRequest& r) {
      if (partitioned) return ConnectionRefused();
      return api->Handle(r);
    });
    ClientOptions o;
    o.qps = 0;
    o.retry.max_attempts = 1;
    o.logger = NullLogger();
    client = std::make_unique<Client>(RestConfig{.server = "http://fake"}, transport, clock, o);
    cfg.lease_namespace = "sys";
    cfg.lease_name = "op";
    cfg.identity = id;
    cfg.uniform01 = [] { return 0.0; };  // followers retry exactly every retry period
    // Wall time moves with the simulated clock, so each renewal writes a new renewTime.
    cfg.wall_clock = [clock] {
      return std::chrono::system_clock::time_point(
          std::chrono::duration_cast<std::chrono::system_clock::duration>(
              clock->Now().time_since_epoch() + std::chrono::hours(24 * 365 * 50)));
    };
    cfg.callbacks.on_started_leading = [this, clock] { started_at = clock->Now(); };
    cfg.callbacks.on_stopped_leading = [this, clock] { stopped_at = clock->Now(); };
    cfg.callbacks.on_new_leader = [this](const std::string& l) {
      std::lock_guard<std::mutex> lock(mu);
      leaders_seen.push_back(l);
    };
    auto e = LeaderElector::Create(client.get(), cfg);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    elector = std::move(e).value();
  }
  ~Candidate() {
    elector->Stop();
    if (thread.joinable()) thread.join();
  }
  void Start() {
    thread = std::thread([this] {
      elector->Run();
      done = true;
    });
  }

  std::shared_ptr<FakeTransport> transport;
  std::unique_ptr<Client> client;
  std::unique_ptr<LeaderElector> elector;
  std::thread thread;
  std::atomic<bool> partitioned{false};
  std::atomic<bool> done{false};
  std::optional<Clock::TimePoint> started_at, stopped_at;
  std::mutex mu;
  std::vector<std::string> leaders_seen;
};

TEST(LeaderElectionConfigTest, RejectsInconsistentTimings) {
  FakeClock clock;
  auto t = std::make_shared<FakeTransport>(&clock);
  Client client(RestConfig{.server = "http://fake"}, t, &clock, {.logger = NullLogger()});
  LeaderElectionConfig c{.lease_namespace = "sys", .lease_name = "op", .identity = "a"};
  EXPECT_TRUE(LeaderElector::Create(&client, c).ok());
  auto bad = c;
  bad.renew_deadline = seconds(15);
  EXPECT_THAT(LeaderElector::Create(&client, bad).status().message(), HasSubstr("renew deadline"));
  bad = c;
  bad.retry_period = seconds(9);
  EXPECT_FALSE(LeaderElector::Create(&client, bad).ok());
  bad = c;
  bad.identity = "";
  EXPECT_FALSE(LeaderElector::Create(&client, bad).ok());
}

TEST(LeaderElectionTest, AcquireCreatesTheLease) {
  FakeClock clock;
  FakeLeaseApi api;
  Candidate a("a", &api, &clock, {});
  EXPECT_TRUE(a.elector->TryAcquireOrRenew());
  auto r = api.Record();
  EXPECT_EQ(r.holder_identity, "a");
  EXPECT_EQ(r.lease_duration_seconds, 15);
  EXPECT_EQ(r.lease_transitions, 0);
  EXPECT_EQ(r.acquire_time, r.renew_time);
  EXPECT_EQ(r.renew_time.size(), std::string("2020-01-01T00:00:00.000000Z").size());
  EXPECT_EQ(a.elector->GetLeader(), "a");
  EXPECT_EQ(a.leaders_seen, std::vector<std::string>{"a"});
  // Renewing keeps acquireTime and moves renewTime.
  clock.Advance(seconds(2));
  EXPECT_TRUE(a.elector->TryAcquireOrRenew());
  auto r2 = api.Record();
  EXPECT_EQ(r2.acquire_time, r.acquire_time);
  EXPECT_NE(r2.renew_time, r.renew_time);
  EXPECT_EQ(r2.lease_transitions, 0);
}

TEST(LeaderElectionTest, ExpiryIsJudgedByObservedTimeOnOurClock) {
  FakeClock clock;
  FakeLeaseApi api;
  Candidate a("a", &api, &clock, {});
  LeaderElectionConfig skewed;
  Candidate b("b", &api, &clock, skewed);
  ASSERT_TRUE(a.elector->TryAcquireOrRenew());
  // b starts 10 s later. The lease's renewTime is then 10 s old by the wall clock, but b
  // has only just seen the record: it must wait the full 15 s from now.
  clock.Advance(seconds(10));
  EXPECT_FALSE(b.elector->TryAcquireOrRenew());
  EXPECT_EQ(b.elector->GetLeader(), "a");
  clock.Advance(milliseconds(14900));
  EXPECT_FALSE(b.elector->TryAcquireOrRenew());
  clock.Advance(milliseconds(100));
  EXPECT_TRUE(b.elector->TryAcquireOrRenew());
  auto r = api.Record();
  EXPECT_EQ(r.holder_identity, "b");
  EXPECT_EQ(r.lease_transitions, 1);
  EXPECT_FALSE(a.elector->TryAcquireOrRenew());  // a sees b's fresh record
  EXPECT_EQ(a.elector->GetLeader(), "b");
  EXPECT_EQ(a.leaders_seen, (std::vector<std::string>{"a", "b"}));
}

TEST(LeaderElectionTest, ARenewalSeenResetsTheFollowersExpiry) {
  FakeClock clock;
  FakeLeaseApi api;
  Candidate a("a", &api, &clock, {});
  Candidate b("b", &api, &clock, {});
  ASSERT_TRUE(a.elector->TryAcquireOrRenew());
  EXPECT_FALSE(b.elector->TryAcquireOrRenew());
  clock.Advance(seconds(14));
  ASSERT_TRUE(a.elector->TryAcquireOrRenew());
  clock.Advance(seconds(1));
  EXPECT_FALSE(b.elector->TryAcquireOrRenew());  // observed the renewal just now
  clock.Advance(seconds(14));
  EXPECT_FALSE(b.elector->TryAcquireOrRenew());
  clock.Advance(seconds(1));
  EXPECT_TRUE(b.elector->TryAcquireOrRenew());
}

TEST(LeaderElectionTest, OptimisticUpdateLosesTheRaceWithConflict) {
  FakeClock clock;
  FakeLeaseApi api;
  Candidate a("a", &api, &clock, {});
  Candidate b("b", &api, &clock, {});
  ASSERT_TRUE(a.elector->TryAcquireOrRenew());
  EXPECT_FALSE(b.elector->TryAcquireOrRenew());
  clock.Advance(seconds(16));  // expired for b
  // Between b's read and b's write, someone else writes the lease.
  api.BeforeNextPut([&] { api.TouchLease(); });
  EXPECT_FALSE(b.elector->TryAcquireOrRenew());
  EXPECT_EQ(api.Record().holder_identity, "a");
}

// Runs candidates on the simulated clock, stepping from one wake-up to the next once every
// running candidate is asleep, and checks that there is never more than one leader.
class ElectionSim {
 public:
  ElectionSim(FakeClock* clock, std::vector<Candidate*> c) : clock_(clock), c_(std::move(c)) {}

  size_t Running() const {
    size_t n = 0;
    for (auto* c : c_) n += c->thread.joinable() && !c->done ? 1 : 0;
    return n;
  }
  // Waits until every running candidate sleeps on the clock.
  void Settle() {
    ASSERT_TRUE(spawnpoint::testing::WaitUntil(
        [&] { return clock_->PendingWaiters() == Running(); }, seconds(10)));
  }
  // Advances to the next wake-up.
  void Step() {
    Settle();
    if (::testing::Test::HasFatalFailure()) return;
    int leaders = 0;
    for (auto* c : c_) leaders += c->elector->IsLeader() ? 1 : 0;
    ASSERT_LE(leaders, 1) << "two leaders at once";
    auto next = clock_->NextDeadline();
    ASSERT_NE(next, Clock::TimePoint::max());
    clock_->Advance(next - clock_->Now());
  }
  void RunUntil(const std::function<bool()>& done, int max_steps = 200) {
    for (int i = 0; i < max_steps && !done(); ++i) {
      Step();
      if (::testing::Test::HasFatalFailure()) return;
    }
    Settle();
    ASSERT_TRUE(done());
  }

 private:
  FakeClock* clock_;
  std::vector<Candidate*> c_;
};

TEST(LeaderElectionTest, LeaderLosesAfterRenewDeadlineAndFollowerTakesOver) {
  FakeClock clock;
  FakeLeaseApi api;
  Candidate a("a", &api, &clock, {});
  Candidate b("b", &api, &clock, {});
  ElectionSim sim(&clock, {&a, &b});
  const auto t0 = clock.Now();
  a.Start();
  ASSERT_TRUE(spawnpoint::testing::WaitUntil([&] { return a.elector->IsLeader(); }, seconds(10)));
  EXPECT_EQ(*a.started_at, t0);
  ASSERT_TRUE(clock.BlockUntilWaiters(1));  // a sleeps until its first renewal
  clock.Advance(seconds(1));                // b starts a second later, off a's renewal beat
  b.Start();
  // A few renewals while b keeps trying.
  sim.RunUntil([&] { return clock.Now() >= t0 + seconds(21); });
  EXPECT_TRUE(a.elector->IsLeader());
  EXPECT_FALSE(b.elector->IsLeader());
  EXPECT_EQ(api.Record().holder_identity, "a");
  // The leader is cut off from the API server: it stops renewing.
  auto last_renew = t0 + seconds(20);  // renewals at 0, 2, ..., 20
  a.partitioned = true;
  sim.RunUntil([&] { return a.done.load(); });
  ASSERT_TRUE(a.stopped_at.has_value());
  EXPECT_EQ(*a.stopped_at - last_renew, seconds(10));  // the renew deadline
  EXPECT_FALSE(a.elector->IsLeader());
  sim.RunUntil([&] { return b.elector->IsLeader(); });
  // b saw the last renewal at its next poll (21 s) and waited a full lease from there.
  EXPECT_EQ(*b.started_at - t0, seconds(37));
  EXPECT_GT(*b.started_at, *a.stopped_at);
  EXPECT_EQ(api.Record().lease_transitions, 1);
  b.elector->Stop();
  b.thread.join();
}

TEST(LeaderElectionTest, CleanShutdownReleasesForAnImmediateFailover) {
  FakeClock clock;
  FakeLeaseApi api;
  Candidate a("a", &api, &clock, {});
  Candidate b("b", &api, &clock, {});
  ElectionSim sim(&clock, {&a, &b});
  const auto t0 = clock.Now();
  a.Start();
  ASSERT_TRUE(spawnpoint::testing::WaitUntil([&] { return a.elector->IsLeader(); }, seconds(10)));
  ASSERT_TRUE(clock.BlockUntilWaiters(1));
  clock.Advance(seconds(1));
  b.Start();
  sim.RunUntil([&] { return clock.Now() >= t0 + seconds(5); });
  a.elector->Stop();
  a.thread.join();
  EXPECT_TRUE(a.stopped_at.has_value());
  auto r = api.Record();
  EXPECT_EQ(r.holder_identity, "");
  EXPECT_EQ(r.lease_duration_seconds, 1);
  // b takes over at its next retry instead of waiting out the 15 s lease.
  sim.RunUntil([&] { return b.elector->IsLeader(); });
  EXPECT_LE(*b.started_at - t0, seconds(8));
  EXPECT_EQ(api.Record().holder_identity, "b");
  b.elector->Stop();
  b.thread.join();
  EXPECT_EQ(api.Record().holder_identity, "");
}

TEST(LeaderElectionTest, ReturnsWithoutCallbacksWhenStoppedBeforeLeading) {
  FakeClock clock;
  FakeLeaseApi api;
  Candidate a("a", &api, &clock, {});
  a.partitioned = true;
  a.Start();
  ASSERT_TRUE(clock.BlockUntilDeadline());
  a.elector->Stop();
  a.thread.join();
  EXPECT_FALSE(a.started_at.has_value());
  EXPECT_FALSE(a.stopped_at.has_value());
}

}  // namespace
}  // namespace spawnpoint::kube
