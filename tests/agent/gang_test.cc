// The gang of a job's agents (issue 19): GangCoordinator's attempts on simulated time, and
// the channel between real sockets (a job's token required).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/gang/coordinator.h"
#include "agent/gang/gang_channel.h"

namespace spawnpoint::agent::gang {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

RankFailure Killed(int rank) {
  RankFailure f;
  f.rank = rank;
  f.status.signal = SIGKILL;
  f.cause = {ExitReason::kKilled, "killed"};
  return f;
}

RankFailure Exit1(int rank) {
  RankFailure f;
  f.rank = rank;
  f.status.exit_code = 1;
  f.cause = {ExitReason::kUserError, "exit 1"};
  return f;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  CoordinatorOptions Options(int nnodes, int max_restarts) {
    CoordinatorOptions o;
    o.nnodes = nnodes;
    o.policy.max_restarts = max_restarts;
    o.policy.backoff_seconds = 10;
    o.pick_port = [this]() -> StatusOr<int> { return next_port_++; };
    return o;
  }
  // The single message of `out` (to every node), checked to be of kind `t`.
  static json Only(const std::vector<Outgoing>& out, const std::string& t) {
    EXPECT_EQ(out.size(), 1u);
    if (out.empty()) return json();
    EXPECT_EQ(out[0].node, kEveryNode);
    EXPECT_EQ(out[0].body.value("t", ""), t) << out[0].body;
    return out[0].body;
  }
  // Both nodes say hello and reach the barrier of `attempt`; the start message.
  json StartBoth(GangCoordinator& c, int attempt) {
    c.Hello(0, attempt);
    c.Hello(1, attempt);
    EXPECT_TRUE(c.Ready(0, attempt).empty()) << "a barrier waits for every node";
    return Only(c.Ready(1, attempt), "start");
  }
  SimulatedClock clock_;
  int next_port_ = 30000;
};

TEST_F(CoordinatorTest, EveryAttemptStartsBehindABarrierOnAFreshPort) {
  GangCoordinator c(Options(2, 3), &clock_);
  json start = StartBoth(c, 0);
  EXPECT_EQ(start["attempt"], 0);
  EXPECT_EQ(start["port"], 30000);
  // Node 1's rank is killed: every node is told to stop, and once node 0 says its ranks
  // were stopped, the gang restarts at once (the first failure after a start).
  Only(c.Exit(1, 0, Killed(1)), "stop");
  json verdict = Only(c.Exit(0, 0, std::nullopt, /*stopped=*/true), "verdict");
  EXPECT_EQ(verdict["decision"], "restart");
  EXPECT_EQ(verdict["next"], 1);
  EXPECT_EQ(verdict["restarts"], 1);
  EXPECT_EQ(verdict["failure"]["nodeRank"], 1);
  EXPECT_EQ(verdict["failure"]["reason"], "Killed");
  EXPECT_EQ(c.phase(), GangCoordinator::Phase::kBarrier);
  EXPECT_TRUE(c.Ready(0, 0).empty()) << "ready: its ranks are stopped (whatever it saw last)";
  start = Only(c.Ready(1, 1), "start");
  EXPECT_EQ(start["attempt"], 1);
  EXPECT_EQ(start["port"], 30001) << "a port the old attempt cannot hold";
  EXPECT_TRUE(c.Exit(0, 1, std::nullopt).empty());
}

TEST_F(CoordinatorTest, TheJobSucceedsWhenEveryNodeDid) {
  GangCoordinator c(Options(2, 3), &clock_);
  StartBoth(c, 0);
  EXPECT_TRUE(c.Exit(0, 0, std::nullopt).empty());
  json verdict = Only(c.Exit(1, 0, std::nullopt), "verdict");
  EXPECT_EQ(verdict["decision"], "succeeded");
  EXPECT_EQ(c.phase(), GangCoordinator::Phase::kSucceeded);
  // A node that joins late (its pod recreated) learns the end.
  auto late = c.Hello(1, 0);
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0].node, 1);
  EXPECT_EQ(late[0].body["decision"], "succeeded");
}

TEST_F(CoordinatorTest, FailuresWithinTheSettlingWindowAreWeighedAndTheFirstCauseWins) {
  GangCoordinator c(Options(2, 3), &clock_);
  StartBoth(c, 0);
  Only(c.Exit(1, 0, Killed(1)), "stop");
  // Node 0's rank then fails on its own (its peer is gone): the kill is the cause.
  json verdict = Only(c.Exit(0, 0, Exit1(0)), "verdict");
  EXPECT_EQ(verdict["decision"], "restart");
  EXPECT_EQ(verdict["failure"]["rank"], 1);
}

// Node 1's rank fails with a collective error because node 0's rank was killed, and its
// report arrives first: the kill (earlier, and not a collective's error) is the cause.
TEST_F(CoordinatorTest, AConsequenceReportedFirstYieldsToItsCause) {
  GangCoordinator c(Options(2, 3), &clock_);
  StartBoth(c, 0);
  RankFailure gloo = Exit1(1);
  gloo.cause = {*ExitReasonFromName("CollectiveError"), "a collective failed"};
  gloo.failed_at_ms = 2'000;
  RankFailure killed = Killed(0);
  killed.failed_at_ms = 1'000;
  Only(c.Exit(1, 0, gloo), "stop");
  json verdict = Only(c.Exit(0, 0, killed), "verdict");
  EXPECT_EQ(verdict["decision"], "restart") << "exit 1 alone would not be retried";
  EXPECT_EQ(verdict["failure"]["rank"], 0);
  EXPECT_EQ(verdict["failure"]["reason"], "Killed");
  EXPECT_EQ(verdict["causeCameFirst"], true);
  EXPECT_EQ(verdict["failure"]["consequences"][0]["rank"], 1);
}

TEST_F(CoordinatorTest, ANodeThatDoesNotReportIsDecidedAfterTheSettlingWindow) {
  GangCoordinator c(Options(2, 3), &clock_);
  StartBoth(c, 0);
  Only(c.Exit(1, 0, Killed(1)), "stop");
  clock_.Advance(std::chrono::milliseconds(999));
  EXPECT_TRUE(c.Tick().empty());
  clock_.Advance(std::chrono::milliseconds(1));
  EXPECT_EQ(Only(c.Tick(), "verdict")["decision"], "restart");
}

TEST_F(CoordinatorTest, TheBudgetIsTheJobsWholeFailingWithMaxRestartsReachedAfterExactlyIt) {
  GangCoordinator c(Options(2, 2), &clock_);
  for (int attempt = 0; attempt < 2; ++attempt) {
    StartBoth(c, attempt);
    c.Exit(attempt % 2, attempt, Killed(0));  // whichever node fails, one budget
    json verdict = Only(c.Exit(1 - attempt % 2, attempt, std::nullopt, true), "verdict");
    EXPECT_EQ(verdict["decision"], "restart");
    clock_.Advance(std::chrono::seconds(60));
  }
  StartBoth(c, 2);
  c.Exit(0, 2, Killed(0));
  json verdict = Only(c.Exit(1, 2, std::nullopt, true), "verdict");
  EXPECT_EQ(verdict["decision"], "fail");
  EXPECT_EQ(verdict["reason"], "MaxRestartsReached");
  EXPECT_EQ(verdict["restarts"], 2);
  EXPECT_EQ(c.phase(), GangCoordinator::Phase::kFailed);
}

TEST_F(CoordinatorTest, ANonRetryableExitFailsTheJob) {
  GangCoordinator c(Options(2, 3), &clock_);
  StartBoth(c, 0);
  c.Exit(0, 0, Exit1(0));
  json verdict = Only(c.Exit(1, 0, std::nullopt, true), "verdict");
  EXPECT_EQ(verdict["decision"], "fail");
  EXPECT_EQ(verdict["reason"], "NonRetryableFailure");
  EXPECT_EQ(verdict["failure"]["exitCode"], 1);
}

TEST_F(CoordinatorTest, ALostNodeFailsItsAttemptAndTheGangWaitsForItToRejoin) {
  GangCoordinator c(Options(2, 3), &clock_);
  StartBoth(c, 0);
  Only(c.Lost(1), "stop");  // its pod was deleted while its ranks ran
  json verdict = Only(c.Exit(0, 0, std::nullopt, true), "verdict");
  EXPECT_EQ(verdict["decision"], "restart");
  EXPECT_EQ(verdict["failure"]["retryable"], true);
  EXPECT_THAT(verdict["failure"]["message"].get<std::string>(), HasSubstr("node 1 was lost"));
  EXPECT_TRUE(c.Ready(0, 1).empty());
  clock_.Advance(std::chrono::seconds(100));
  EXPECT_TRUE(c.Tick().empty()) << "the rejoin timeout (120 s) has not passed";
  c.Hello(1, 0);  // the recreated pod's agent knows no attempt: the coordinator's wins
  EXPECT_EQ(Only(c.Ready(1, 1), "start")["attempt"], 1);
}

TEST_F(CoordinatorTest, ANodeThatNeverRejoinsGivesTheGangUpAsRetryable) {
  GangCoordinator c(Options(2, 3), &clock_);
  StartBoth(c, 0);
  c.Lost(1);
  c.Exit(0, 0, std::nullopt, true);
  clock_.Advance(std::chrono::seconds(119));
  EXPECT_TRUE(c.Tick().empty());
  clock_.Advance(std::chrono::seconds(1));
  json verdict = Only(c.Tick(), "verdict");
  EXPECT_EQ(verdict["decision"], "fail");
  EXPECT_EQ(verdict["reason"], "NodeLost");
  EXPECT_EQ(verdict["failure"]["retryable"], true) << "the operator recreates the gang";
}

TEST_F(CoordinatorTest, ANewCoordinatorTakesTheAttemptTheNodesReached) {
  GangCoordinator c(Options(2, 3), &clock_);  // node 0's pod recreated: it knows attempt 0
  c.Hello(0, 0);
  EXPECT_TRUE(c.Ready(0, 0).empty());
  c.Hello(1, 2);  // after node 0 reached the barrier: it stays there
  EXPECT_EQ(c.attempt(), 2);
  // Node 1 was running attempt 2 when the coordinator went: it counts that as failed.
  EXPECT_EQ(Only(c.Ready(1, 3), "start")["attempt"], 3);
}

// The last allowed attempt's coordinator was lost: the nodes count that attempt as failed,
// and the new coordinator does not start one more beyond maxRestarts.
TEST_F(CoordinatorTest, ANewCoordinatorKeepsTheBudgetTheNodesCounted) {
  GangCoordinator c(Options(2, 2), &clock_);
  c.Hello(0, 2);
  EXPECT_TRUE(c.Ready(0, 2).empty());
  c.Hello(1, 3);  // node 1 ran attempt 2 (the last allowed) when the coordinator went
  json verdict = Only(c.Ready(1, 3), "verdict");
  EXPECT_EQ(verdict["decision"], "fail");
  EXPECT_EQ(verdict["reason"], "MaxRestartsReached");
  EXPECT_EQ(verdict["restarts"], 2) << "attempts 0, 1 and 2 ran: two restarts";
  EXPECT_EQ(c.phase(), GangCoordinator::Phase::kFailed);
}

// ---- The channel, on real sockets ----

class ChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GangServer::Options o;
    o.job = "ddp";
    o.token = "s3cret-token";
    o.bind_host = "127.0.0.1";
    o.coordinator.nnodes = 2;
    o.coordinator.pick_port = []() -> StatusOr<int> { return 4242; };
    o.say = [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu_);
      log_ += line + "\n";
    };
    auto s = GangServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
  }
  std::unique_ptr<GangPeer> Peer(int node, const std::string& token, int attempt = 0) {
    GangPeer::Options o{
        .job = "ddp", .token = token, .host = "127.0.0.1", .port = server_->port(), .node = node};
    auto p = GangPeer::Connect(o, attempt, Deadline());
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? std::move(*p) : nullptr;
  }
  static Clock::TimePoint Deadline() { return RealClock::Get()->Now() + std::chrono::seconds(30); }
  std::string Log() {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }
  // The log outlives the server: its thread may still say something while it stops.
  std::mutex mu_;
  std::string log_;
  std::unique_ptr<GangServer> server_;
};

TEST_F(ChannelTest, TwoAgentsMeetAtTheBarrierAndAreToldToStopTogether) {
  auto a = Peer(0, "s3cret-token"), b = Peer(1, "s3cret-token");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->Send({{"t", "ready"}, {"attempt", 0}}));
  ASSERT_TRUE(b->Send({{"t", "ready"}, {"attempt", 0}}));
  for (GangPeer* p : {a.get(), b.get()}) {
    auto m = p->Next(Deadline());
    ASSERT_TRUE(m);
    EXPECT_EQ((*m)["t"], "start");
    EXPECT_EQ((*m)["port"], 4242);
  }
  EXPECT_FALSE(a->StopSeen(0));
  ASSERT_TRUE(
      b->Send({{"t", "exit"}, {"attempt", 0}, {"ok", false}, {"failure", Killed(1).ToJson()}}));
  auto m = a->Next(Deadline());
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)["t"], "stop");
  EXPECT_TRUE(a->StopSeen(0));
}

TEST_F(ChannelTest, AConnectionWithoutTheJobsTokenIsRefusedAndTheTokenNeverLogged) {
  auto stranger = Peer(1, "guessed-token");
  ASSERT_TRUE(stranger);
  auto m = stranger->Next(Deadline());
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)["t"], "refused");
  EXPECT_THAT(Log(), HasSubstr("gang channel: refused a connection from 127.0.0.1"));
  EXPECT_THAT(Log(), Not(HasSubstr("guessed-token")));
  EXPECT_THAT(Log(), Not(HasSubstr("s3cret-token")));
  EXPECT_FALSE(stranger->Send({{"t", "ready"}, {"attempt", 0}})) << "a refused peer stays out";
  EXPECT_FALSE(stranger->Next(RealClock::Get()->Now() + std::chrono::milliseconds(300)))
      << "and does not dial again (it would be refused again)";
  // The refused connection is no member: the real node 1 still completes the barrier.
  auto a = Peer(0, "s3cret-token"), b = Peer(1, "s3cret-token");
  ASSERT_TRUE(a->Send({{"t", "ready"}, {"attempt", 0}}));
  ASSERT_TRUE(b->Send({{"t", "ready"}, {"attempt", 0}}));
  m = a->Next(Deadline());
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)["t"], "start");
}

// Anyone can reach the gang's port: messages whose fields have the wrong type cost the
// sender its connection, never the coordinator (nlohmann's type errors are caught).
TEST_F(ChannelTest, MessagesWithFieldsOfTheWrongTypeDropTheSenderNotTheCoordinator) {
  for (const std::string line :
       {R"({"t": 1})", R"({"t": "hello", "job": "ddp", "node": "0", "token": "s3cret-token"})",
        R"({"t": "hello", "job": ["ddp"]})", R"([1, 2])", "not json at all"}) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(server_->port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    const std::string msg = line + "\n";
    ASSERT_EQ(::write(fd, msg.data(), msg.size()), static_cast<ssize_t>(msg.size()));
    // The coordinator answers (refused) or just closes: either way the connection ends.
    char buf[4096];
    while (::read(fd, buf, sizeof(buf)) > 0) {
    }
    ::close(fd);
  }
  EXPECT_THAT(Log(), HasSubstr("dropped a connection from 127.0.0.1"));
  // The coordinator still runs the gang.
  auto a = Peer(0, "s3cret-token"), b = Peer(1, "s3cret-token");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->Send({{"t", "ready"}, {"attempt", 0}}));
  ASSERT_TRUE(b->Send({{"t", "ready"}, {"attempt", 0}}));
  auto m = a->Next(Deadline());
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)["t"], "start");
}

TEST_F(ChannelTest, APeerReconnectsWhenTheCoordinatorComesBack) {
  auto a = Peer(0, "s3cret-token", 3);
  ASSERT_TRUE(a);
  a->Started(3);  // its ranks run attempt 3
  const int port = server_->port();
  server_.reset();  // node 0's pod deleted
  auto m = a->Next(Deadline());
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)["t"], "lost");
  EXPECT_TRUE(a->StopSeen(3)) << "the ranks must stop: rank 0 went with the coordinator";
  GangServer::Options o;
  o.job = "ddp";
  o.token = "s3cret-token";
  o.bind_host = "127.0.0.1";
  o.port = port;  // the recreated pod listens where the old one did
  o.coordinator.nnodes = 1;
  o.coordinator.pick_port = []() -> StatusOr<int> { return 5151; };
  auto s = GangServer::Start(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  server_ = std::move(*s);
  m = a->Next(Deadline());
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)["t"], "reconnected");
  a->Ended();
  EXPECT_TRUE(a->StopSeen(3)) << "still: its ranks were stopped";
  ASSERT_TRUE(a->Send({{"t", "ready"}, {"attempt", 3}}));
  m = a->Next(Deadline());
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)["t"], "start");
  EXPECT_EQ((*m)["attempt"], 3) << "the attempt the node said in its hello";
}

}  // namespace
}  // namespace spawnpoint::agent::gang
