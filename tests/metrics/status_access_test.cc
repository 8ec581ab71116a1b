// Who reads what of the agent's /status (agent/status/status_access.h): another tenant's pod
// reaching the agent's port gets every number and state but no log line, traceback, failure
// message or stack; the job's status token (the operator's) and the pod's loopback get all.
// Over the real endpoint: a reader from this machine's non-loopback address is a reader from
// the network as far as the agent can tell.
#include "agent/status/status_access.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/status/agent_endpoint.h"
#include "agent/status/node_status.h"
#include "tests/metrics/http_client.h"

namespace spawnpoint::agent {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

// Every string that comes from the rank's output or code, in one failure and one stall.
const char* const kLogWords[] = {"LOG-TAIL-LINE", "TRACEBACK-FRAME", "EXCEPTION-TEXT",
                                 "SOURCE-LINE",   "MESSAGE-QUOTE",   "PEER-LINE",
                                 "STALL-STACK",   "TOP-FRAME"};

json Failure() {
  return {{"rank", 1},
          {"localRank", 1},
          {"nodeRank", 0},
          {"exitCode", 1},
          {"reason", "UserError"},
          {"message", "uncaught exception: \"MESSAGE-QUOTE\""},
          {"line", "SOURCE-LINE"},
          {"exception", "ValueError: EXCEPTION-TEXT"},
          {"logTail", "step 3\nLOG-TAIL-LINE\n"},
          {"logStream", "stderr"},
          {"stack", "File x.py, line 3: TRACEBACK-FRAME"},
          {"retryable", false},
          {"failedAt", "2026-11-28T10:00:00.000Z"},
          {"consequences", json::array({{{"rank", 0},
                                         {"nodeRank", 0},
                                         {"exitCode", 1},
                                         {"reason", "PeerFailure"},
                                         {"line", "PEER-LINE"}}})}};
}

json Stall() {
  return {{"rank", 0},
          {"pod", "job-node-0"},
          {"silentSeconds", 612.5},
          {"medianStepSeconds", 0.4},
          {"beforeFirstStep", false},
          {"topFrame", "train.py:88 in TOP-FRAME"},
          {"stackSource", "py-stack"},
          {"message", "rank 0 made no step for 612 s:\n    STALL-STACK"},
          {"waiting", json::array({1})}};
}

TEST(StatusAccessTest, WithoutLogsKeepsNumbersAndStatesAndNoLogWord) {
  json doc = {{"job", "train"},
              {"namespace", "team-a"},
              {"phase", "Failed"},
              {"restarts", 2},
              {"lastFailure", Failure()},
              {"stall", Stall()},
              {"samplesPerSecond", 812.5},
              {"gpus", json::array({{{"gpu", 0}, {"utilisation", 0.9}}})}};
  const json out = WithoutLogs(doc);
  const std::string text = out.dump();
  for (const char* word : kLogWords) EXPECT_THAT(text, Not(HasSubstr(word)));
  EXPECT_EQ(
      out["lastFailure"],
      json({{"rank", 1},
            {"localRank", 1},
            {"nodeRank", 0},
            {"exitCode", 1},
            {"reason", "UserError"},
            {"retryable", false},
            {"failedAt", "2026-11-28T10:00:00.000Z"},
            {"consequences",
             json::array(
                 {{{"rank", 0}, {"nodeRank", 0}, {"exitCode", 1}, {"reason", "PeerFailure"}}})}}));
  EXPECT_EQ(out["stall"], json({{"rank", 0},
                                {"pod", "job-node-0"},
                                {"silentSeconds", 612.5},
                                {"medianStepSeconds", 0.4},
                                {"beforeFirstStep", false},
                                {"waiting", json::array({1})}}));
  for (const char* key : {"job", "namespace", "phase", "restarts", "samplesPerSecond", "gpus"}) {
    EXPECT_EQ(out[key], doc[key]) << key;
  }
  EXPECT_THAT(out.value("redacted", ""), HasSubstr("status token"));
  // A document without a failure or stall stays as it is, but for the note.
  json quiet = {{"phase", "Running"}, {"lastFailure", nullptr}, {"stall", nullptr}};
  json quiet_out = WithoutLogs(quiet);
  quiet_out.erase("redacted");
  EXPECT_EQ(quiet_out, quiet);
}

TEST(StatusAccessTest, OnlyTheTokenOrLoopbackMayReadLogs) {
  metrics::HttpRequest r;
  r.from_loopback = true;
  EXPECT_TRUE(MayReadLogs("", r)) << "the pod's own containers, kubectl port-forward";
  r.from_loopback = false;
  EXPECT_FALSE(MayReadLogs("", r));
  r.authorization = "Bearer ";
  EXPECT_FALSE(MayReadLogs("", r)) << "no token configured: an empty bearer is no key";
  r.authorization = "Bearer s3cret";
  EXPECT_TRUE(MayReadLogs("s3cret", r));
  for (const char* wrong :
       {"Bearer s3cre", "Bearer s3cret2", "Basic s3cret", "s3cret", "Bearer S3CRET", ""}) {
    r.authorization = wrong;
    EXPECT_FALSE(MayReadLogs("s3cret", r)) << wrong;
  }
}

TEST(StatusAccessTest, TheTokenFileIsReadOnceAndAMissingOneMeansNone) {
  const std::string dir = ::testing::TempDir();
  std::string note;
  EXPECT_EQ(*ReadStatusToken("", &note), "");
  EXPECT_EQ(note, "");
  { std::ofstream(dir + "/status-token") << "s3cret\n"; }
  EXPECT_EQ(*ReadStatusToken(dir + "/status-token", &note), "s3cret");
  StatusOr<std::string> missing = ReadStatusToken(dir + "/no-such-token", &note);
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(*missing, "");
  EXPECT_THAT(note,
              HasSubstr("no such file; /status serves log lines only on this pod's loopback"));
  { std::ofstream(dir + "/empty-token") << "\n"; }
  StatusOr<std::string> empty = ReadStatusToken(dir + "/empty-token", &note);
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(empty.status().message(), HasSubstr("empty"));
}

// This machine's first non-loopback IPv4 address: a connection to it comes from it, not from
// 127.0.0.1, as a connection from another pod would.
std::string NonLoopbackAddress() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* a = list; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    const in_addr addr = reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr;
    if ((ntohl(addr.s_addr) >> 24) == 127) continue;
    char buf[INET_ADDRSTRLEN] = {0};
    inet_ntop(AF_INET, &addr, buf, sizeof(buf));
    found = buf;
  }
  freeifaddrs(list);
  return found;
}

TEST(StatusAccessTest, TheEndpointServesLogLinesOnlyToTheTokenAndLoopback) {
  const std::string remote = NonLoopbackAddress();
  ASSERT_FALSE(remote.empty()) << "this machine has no non-loopback IPv4 address to read from";
  NodeStatusOptions o;
  o.identity = {.job = "train", .job_namespace = "team-a", .pod = "train-node-0"};
  NodeStatus status(o);
  status.OnRankFailure(1, "UserError", Failure());
  auto endpoint = AgentEndpoint::Start("0.0.0.0:0", &status, "s3cret");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().message();
  const int port = (*endpoint)->port();
  auto get = [&](const std::string& host, const std::string& auth) {
    std::string raw = "GET /status HTTP/1.1\r\nHost: x\r\n" + auth + "Connection: close\r\n\r\n";
    auto r = testing::HttpRaw(host, port, raw);
    EXPECT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r.ok() ? r->status : 0, 200);
    return r.ok() ? json::parse(r->body) : json();
  };
  // Another tenant's pod: the failure's rank, reason and exit code, no log line.
  json tenant = get(remote, "");
  EXPECT_EQ(tenant["lastFailure"]["reason"], "UserError");
  EXPECT_EQ(tenant["lastFailure"]["exitCode"], 1);
  for (const char* word : kLogWords) EXPECT_THAT(tenant.dump(), Not(HasSubstr(word)));
  EXPECT_TRUE(tenant.contains("redacted"));
  EXPECT_TRUE(get(remote, "Authorization: Bearer guessed\r\n").contains("redacted"))
      << "... a wrong token reads no more";
  // The operator, with the job's token (the header's name in any case), and loopback.
  for (const char* auth :
       {"Authorization: Bearer s3cret\r\n", "authorization:Bearer s3cret \r\n"}) {
    json op = get(remote, auth);
    EXPECT_EQ(op["lastFailure"]["logTail"], "step 3\nLOG-TAIL-LINE\n") << auth;
    EXPECT_FALSE(op.contains("redacted")) << auth;
  }
  json local = get("127.0.0.1", "");
  EXPECT_EQ(local["lastFailure"]["logTail"], "step 3\nLOG-TAIL-LINE\n");
  EXPECT_EQ(local["lastFailure"]["stack"], "File x.py, line 3: TRACEBACK-FRAME");
}

}  // namespace
}  // namespace spawnpoint::agent
