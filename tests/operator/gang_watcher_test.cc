// The gang watcher (operator/utilisation/gang_watcher.h) on a scripted reader and simulated
// time: node 0's agent first, the next pod when it cannot be read, another job's document
// ignored, the job enqueued only when what its agents say changes.
#include "operator/utilisation/gang_watcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

namespace spawnpoint::op {
namespace {

using nlohmann::json;
using std::chrono::seconds;

class DocumentReader : public AgentStatusReader {
 public:
  StatusOr<json> Read(const std::string& ip, int port, const std::string&) override {
    reads.push_back(ip);
    auto it = documents.find(ip);
    if (it == documents.end()) return Unavailable("connection refused");
    return it->second;
  }
  std::map<std::string, json> documents;
  std::vector<std::string> reads;
};

json Document(const std::string& job, int restarts, const std::string& phase) {
  return {{"job", job},           {"namespace", "ml"}, {"nodeRank", 0},
          {"restarts", restarts}, {"phase", phase},    {"lastFailure", nullptr}};
}

TEST(GangWatcherTest, ReadsNodeZeroFirstAndEnqueuesOnlyOnAChange) {
  SimulatedClock clock;
  WallClock wall(&clock, WallTime(seconds(1'714'557'600)));
  DocumentReader reader;
  std::vector<GangJob> jobs = {{"ml", "a", {{"a-node-0", "10.0.0.1"}, {"a-node-1", "10.0.0.2"}}}};
  std::vector<std::string> enqueued;
  GangWatcher watcher(
      &reader, &wall, {std::chrono::milliseconds(500), 9400}, [&] { return jobs; },
      [&](const std::string& ns, const std::string& name) { enqueued.push_back(ns + "/" + name); });
  reader.documents["10.0.0.1"] = Document("a", 0, "Running");
  reader.documents["10.0.0.2"] = Document("a", 0, "Running");
  watcher.PollOnce();
  EXPECT_EQ(reader.reads, std::vector<std::string>{"10.0.0.1"}) << "node 0 answers: enough";
  std::optional<GangReading> r = watcher.LatestGang("ml", "a");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->restarts, 0);
  EXPECT_EQ(r->phase, "Running");
  EXPECT_EQ(r->pod, "a-node-0");
  EXPECT_EQ(r->updated, "2024-05-01T10:00:00.000Z");
  EXPECT_EQ(enqueued.size(), 1u);
  watcher.PollOnce();
  EXPECT_EQ(enqueued.size(), 1u) << "nothing changed";

  // Node 0's agent gone (its pod replaced): node 1's says the gang restarted.
  reader.documents.erase("10.0.0.1");
  reader.documents["10.0.0.2"] = Document("a", 1, "Restarting");
  watcher.PollOnce();
  r = watcher.LatestGang("ml", "a");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->restarts, 1);
  EXPECT_EQ(r->pod, "a-node-1");
  EXPECT_EQ(enqueued.size(), 2u);

  // Nobody answers: the last reading stands. Another job's agent on the address: ignored.
  reader.documents["10.0.0.2"] = Document("b", 7, "Running");
  watcher.PollOnce();
  EXPECT_EQ(watcher.LatestGang("ml", "a")->restarts, 1);
  EXPECT_EQ(enqueued.size(), 2u);

  jobs.clear();  // finished: forgotten
  watcher.PollOnce();
  EXPECT_FALSE(watcher.LatestGang("ml", "a"));
}

TEST(GangWatcherTest, ADocumentWithoutRestartsIsNoReading) {
  EXPECT_FALSE(ReadGang(json{{"job", "a"}}, "ml", "a", "a-node-0", "t"));
  EXPECT_FALSE(ReadGang(json::array(), "ml", "a", "a-node-0", "t"));
  EXPECT_FALSE(ReadGang(Document("a", 1, "Running"), "other-ns", "a", "a-node-0", "t"));
  std::optional<GangReading> r = ReadGang(
      [] {
        json d = Document("a", 2, "Running");
        d["lastFailure"] = {{"rank", 1}, {"nodeRank", 1}, {"reason", "Killed"}};
        return d;
      }(),
      "ml", "a", "a-node-0", "t");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->last_failure["reason"], "Killed");
}

}  // namespace
}  // namespace spawnpoint::op
