// Each job's status token (operator/common/status_token.h): derived from the operator's key
// and the job's namespace, name and UID, put in the job's Secret before its pods exist, and
// the agents told where it is.
#include "operator/common/status_token.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "operator/common/names.h"
#include "operator/common/object.h"
#include "operator/reconciler/reconciler.h"
#include "tests/operator/fake_cluster.h"
#include "tests/operator/test_jobs.h"

namespace spawnpoint::op {
namespace {

using nlohmann::json;
using ::testing::Contains;
using ::testing::ElementsAre;
using testing::FakeCluster;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::MakeJob;

// The derivation is pinned (Python: hmac.new(b"k" * 32, b"spawnpoint-status\nteam-a\ntrain\n
// uid-1", hashlib.sha256).hexdigest()): an upgraded operator with the same key must give the
// agents of running jobs the tokens they hold.
TEST(StatusTokensTest, TheTokenIsAnHmacOfTheJobsNamespaceNameAndUid) {
  const StatusTokens tokens(std::string(32, 'k'));
  EXPECT_EQ(tokens.For("team-a", "train", "uid-1"),
            "851e748c6a67df14c04a89cab263e3ec1e891af284df3b3b11e0fb172e2b82c5");
  EXPECT_EQ(tokens.For("team-b", "train", "uid-1"),
            "b45b50f40e43834a411ed073c324ee29f2108de8f3675eeb695cfc4d26acd696");
  EXPECT_NE(tokens.For("team-a", "train", "uid-2"), tokens.For("team-a", "train", "uid-1"));
  EXPECT_NE(StatusTokens(std::string(32, 'j')).For("team-a", "train", "uid-1"),
            tokens.For("team-a", "train", "uid-1"));
}

TEST(StatusTokensTest, AKeyFileNeedsThirtyTwoBytesAndItsLineEndIsNotPartOfIt) {
  const std::string path = ::testing::TempDir() + "/status-token-key";
  { std::ofstream(path) << std::string(32, 'k') << "\n"; }
  StatusOr<StatusTokens> tokens = StatusTokens::FromFile(path);
  ASSERT_TRUE(tokens.ok()) << tokens.status().message();
  EXPECT_EQ(tokens->For("team-a", "train", "uid-1"),
            StatusTokens(std::string(32, 'k')).For("team-a", "train", "uid-1"));
  { std::ofstream(path) << "short\n"; }
  tokens = StatusTokens::FromFile(path);
  ASSERT_FALSE(tokens.ok());
  EXPECT_THAT(tokens.status().message(), HasSubstr("--status-token-key-file " + path +
                                                   ": 5 bytes; the key needs at least 32"));
  tokens = StatusTokens::FromFile(path + ".missing");
  ASSERT_FALSE(tokens.ok());
  EXPECT_THAT(tokens.status().message(), HasSubstr("cannot read it"));
  // Two random keys differ.
  EXPECT_NE(StatusTokens::Random()->For("a", "b", "c"), StatusTokens::Random()->For("a", "b", "c"));
}

class StatusTokenReconcileTest : public ::testing::Test {
 protected:
  StatusTokenReconcileTest()
      : wall_(&clock_, WallTime(std::chrono::seconds(1'714'557'600))), cluster_(&wall_) {
    ReconcilerOptions options;
    options.status_tokens = &tokens_;
    reconciler_ = std::make_unique<Reconciler>(&cluster_, &wall_, std::move(options), nullptr);
  }
  ReconcileResult Reconcile() { return reconciler_->Reconcile("default", "job", Logger()); }

  const StatusTokens tokens_{std::string(32, 'k')};
  SimulatedClock clock_;
  WallClock wall_;
  FakeCluster cluster_;
  std::unique_ptr<Reconciler> reconciler_;
};

// A job that does not restart in place gets a Secret too, holding only its status token,
// before its pods; each pod's agent reads it from the mounted Secret.
TEST_F(StatusTokenReconcileTest, EveryJobsSecretHoldsItsStatusTokenBeforeItsPods) {
  json job = cluster_.AddJob(MakeJob("job", 2, 3, 1));
  ASSERT_TRUE(Reconcile().status.ok());
  const std::string secret = JobSecretName("job", UidOf(job));
  EXPECT_THAT(cluster_.Writes(),
              ElementsAre("create-service job", "create-secret " + secret, "create-pod job-node-0",
                          "create-pod job-node-1", "update-status job"));
  EXPECT_EQ((*cluster_.Secret(secret))["stringData"],
            json({{"status", tokens_.For("default", "job", UidOf(job))}}));
  for (const std::string pod : {"job-node-0", "job-node-1"}) {
    const json& c = (*cluster_.Pod(pod))["spec"]["containers"][0];
    EXPECT_THAT(c["command"].get<std::vector<std::string>>(), Contains("--status-token-file"));
    EXPECT_EQ((*cluster_.Pod(pod))["spec"]["volumes"].back()["secret"]["secretName"], secret);
  }
}

TEST_F(StatusTokenReconcileTest, NoPodIsCreatedWhenTheSecretCannotBe) {
  cluster_.AddJob(MakeJob("job", 2, 3, 1));
  cluster_.FailNext("create-secret", spawnpoint::Status(StatusCode::kForbidden, "no secrets"));
  EXPECT_EQ(Reconcile().status.code(), StatusCode::kForbidden);
  EXPECT_THAT(cluster_.PodNames(), IsEmpty());
  ASSERT_TRUE(Reconcile().status.ok());
  EXPECT_THAT(cluster_.PodNames(), ElementsAre("job-node-0", "job-node-1"));
}

}  // namespace
}  // namespace spawnpoint::op
