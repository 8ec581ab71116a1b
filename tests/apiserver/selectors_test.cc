#include "tests/apiserver/selectors.h"

#include <gtest/gtest.h>

#include "tests/apiserver/api_error.h"

namespace spawnpoint::kubetest {
namespace {

const json kLabels = {{"app", "trainer"}, {"tier", "gpu"}, {"job", "resnet"}};

bool Select(const std::string& selector, const json& labels = kLabels) {
  return LabelSelector::Parse(selector).Matches(labels);
}

TEST(LabelSelectorTest, EqualityOperators) {
  EXPECT_TRUE(Select("app=trainer"));
  EXPECT_TRUE(Select("app==trainer"));
  EXPECT_FALSE(Select("app=loader"));
  EXPECT_TRUE(Select("app!=loader"));
  EXPECT_FALSE(Select("app!=trainer"));
  // != and notin also select objects without the label, like the real server.
  EXPECT_TRUE(Select("missing!=x"));
}

TEST(LabelSelectorTest, SetOperatorsAndExistence) {
  EXPECT_TRUE(Select("tier in (cpu, gpu)"));
  EXPECT_FALSE(Select("tier in (cpu)"));
  EXPECT_TRUE(Select("tier notin (cpu)"));
  EXPECT_FALSE(Select("tier notin (gpu,cpu)"));
  EXPECT_TRUE(Select("missing notin (x)"));
  EXPECT_TRUE(Select("job"));
  EXPECT_FALSE(Select("missing"));
  EXPECT_TRUE(Select("!missing"));
  EXPECT_FALSE(Select("!job"));
}

TEST(LabelSelectorTest, RequirementsAreAnded) {
  EXPECT_TRUE(Select("app=trainer,tier in (gpu),!missing,job"));
  EXPECT_FALSE(Select("app=trainer,tier=cpu"));
  EXPECT_TRUE(Select(""));
  EXPECT_FALSE(Select("app", json()));
  EXPECT_TRUE(Select("!app", json()));
}

TEST(LabelSelectorTest, KeysThatStartLikeOperatorsAreKeys) {
  EXPECT_TRUE(Select("input", {{"input", "x"}}));
  EXPECT_TRUE(Select("inside=1", {{"inside", "1"}}));
  EXPECT_TRUE(Select("example.com/role in (a)", {{"example.com/role", "a"}}));
}

TEST(LabelSelectorTest, SyntaxErrorsAreBadRequests) {
  for (const char* bad : {"app in x", "app in ()", "a=b c", "=x", "tier in (a"}) {
    try {
      LabelSelector::Parse(bad);
      ADD_FAILURE() << "parsed: " << bad;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.code(), 400) << bad;
      EXPECT_NE(e.message().find("unable to parse requirement"), std::string::npos) << bad;
    }
  }
}

TEST(LabelSelectorTest, FromJsonSupportsMatchLabelsAndExpressions) {
  json sel = {{"matchLabels", {{"app", "trainer"}}},
              {"matchExpressions",
               {{{"key", "tier"}, {"operator", "In"}, {"values", {"gpu"}}},
                {{"key", "missing"}, {"operator", "DoesNotExist"}}}}};
  EXPECT_TRUE(LabelSelector::FromJson(sel).Matches(kLabels));
  sel["matchExpressions"][0]["values"] = {"cpu"};
  EXPECT_FALSE(LabelSelector::FromJson(sel).Matches(kLabels));
}

TEST(FieldSelectorTest, MatchesDottedPaths) {
  json pod = {{"metadata", {{"name", "p0"}, {"namespace", "ml"}}},
              {"spec", {{"nodeName", "node-1"}}},
              {"status", {{"phase", "Running"}}}};
  std::vector<std::string> supported = {"metadata.name", "metadata.namespace", "spec.nodeName",
                                        "status.phase"};
  EXPECT_TRUE(
      FieldSelector::Parse("status.phase=Running,spec.nodeName=node-1", supported).Matches(pod));
  EXPECT_TRUE(FieldSelector::Parse("status.phase!=Failed", supported).Matches(pod));
  EXPECT_FALSE(FieldSelector::Parse("metadata.name==p1", supported).Matches(pod));
  // A missing field compares as the empty string.
  json unbound = {{"metadata", {{"name", "p1"}}}};
  EXPECT_TRUE(FieldSelector::Parse("spec.nodeName=", supported).Matches(unbound));
  EXPECT_EQ(FieldSelector::Parse("metadata.name=p0", supported).Pinned("metadata.name"), "p0");
}

TEST(FieldSelectorTest, UnsupportedFieldIsRejectedLikeTheRealServer) {
  try {
    FieldSelector::Parse("spec.foo=bar", {"metadata.name"});
    FAIL() << "accepted an unsupported field";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.code(), 400);
    EXPECT_EQ(e.message(), "field label not supported: spec.foo");
  }
  EXPECT_THROW(FieldSelector::Parse("nooperator", {}), ApiError);
}

}  // namespace
}  // namespace spawnpoint::kubetest
