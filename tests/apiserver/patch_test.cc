#include "tests/apiserver/patch.h"

#include <gtest/gtest.h>

#include "tests/apiserver/api_error.h"

namespace spawnpoint::kubetest {
namespace {

using json = nlohmann::json;

const json kPod = json::parse(R"({
  "metadata": {"name": "p", "labels": {"a": "1", "b": "2"}, "finalizers": ["x"]},
  "spec": {
    "containers": [
      {"name": "trainer", "image": "t:1", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
       "ports": [{"containerPort": 80}]},
      {"name": "sidecar", "image": "s:1"}
    ],
    "tolerations": [{"key": "k"}]
  }
})");

TEST(MergePatchTest, MergesObjectsReplacesListsAndDeletesNulls) {
  json out = ApplyMergePatch(kPod, json::parse(R"({"metadata": {"labels": {"a": null, "c": "3"}},
      "spec": {"tolerations": [{"key": "other"}]}})"));
  EXPECT_EQ(out["metadata"]["labels"], json({{"b", "2"}, {"c", "3"}}));
  EXPECT_EQ(out["spec"]["tolerations"], json::parse(R"([{"key": "other"}])"));
  EXPECT_EQ(out["spec"]["containers"], kPod["spec"]["containers"]);
  EXPECT_THROW(ApplyMergePatch(kPod, json::array()), ApiError);
}

TEST(StrategicMergePatchTest, MergesContainersAndEnvByName) {
  json out = ApplyStrategicMergePatch(kPod, json::parse(R"({"spec": {"containers": [
      {"name": "trainer", "image": "t:2", "env": [{"name": "B", "value": "20"}, {"name": "C", "value": "3"}]}]}})"));
  const json& c = out["spec"]["containers"];
  ASSERT_EQ(c.size(), 2u) << "the sidecar is kept";
  EXPECT_EQ(c[0]["image"], "t:2");
  EXPECT_EQ(c[0]["env"], json::parse(R"([{"name":"A","value":"1"},{"name":"B","value":"20"},
                                         {"name":"C","value":"3"}])"));
  EXPECT_EQ(c[0]["ports"], kPod["spec"]["containers"][0]["ports"]);
  EXPECT_EQ(c[1]["name"], "sidecar");
}

TEST(StrategicMergePatchTest, HonoursDirectivesAndAtomicLists) {
  json out = ApplyStrategicMergePatch(
      kPod, json::parse(R"({"$setElementOrder/containers": [{"name": "trainer"}],
        "metadata": {"finalizers": ["y"]},
        "spec": {"containers": [{"name": "sidecar", "$patch": "delete"}],
                 "tolerations": [{"key": "k2"}]}})"));
  ASSERT_EQ(out["spec"]["containers"].size(), 1u);
  EXPECT_EQ(out["spec"]["containers"][0]["name"], "trainer");
  EXPECT_EQ(out["metadata"]["finalizers"], json({"x", "y"})) << "finalizers merge as a set";
  EXPECT_EQ(out["spec"]["tolerations"], json::parse(R"([{"key":"k2"}])"))
      << "unknown lists replace";
  EXPECT_FALSE(out.contains("$setElementOrder/containers"));

  json replaced = ApplyStrategicMergePatch(
      kPod, json::parse(R"({"spec": {"containers": [{"name": "only"}, {"$patch": "replace"}]}})"));
  EXPECT_EQ(replaced["spec"]["containers"], json::parse(R"([{"name": "only"}])"));
  json removed = ApplyStrategicMergePatch(
      kPod, json::parse(R"({"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}})"));
  EXPECT_EQ(removed["metadata"]["finalizers"], json::parse(R"([])"));
}

TEST(JsonPatchTest, AppliesOperationsAndRejectsFailedTests) {
  json out = ApplyJsonPatch(kPod, json::parse(R"([
      {"op": "replace", "path": "/spec/containers/0/image", "value": "t:3"},
      {"op": "add", "path": "/metadata/labels/c", "value": "3"},
      {"op": "remove", "path": "/metadata/finalizers/0"}])"));
  EXPECT_EQ(out["spec"]["containers"][0]["image"], "t:3");
  EXPECT_EQ(out["metadata"]["labels"]["c"], "3");
  EXPECT_TRUE(out["metadata"]["finalizers"].empty());
  try {
    ApplyJsonPatch(kPod,
                   json::parse(R"([{"op": "test", "path": "/metadata/name", "value": "q"}])"));
    FAIL() << "a failed test operation was applied";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.code(), 422);
  }
  EXPECT_THROW(ApplyJsonPatch(kPod, json::object()), ApiError);
}

TEST(PatchTypeTest, FromContentType) {
  EXPECT_EQ(PatchTypeFromContentType("application/merge-patch+json"), PatchType::kMerge);
  EXPECT_EQ(PatchTypeFromContentType("application/strategic-merge-patch+json; charset=utf-8"),
            PatchType::kStrategic);
  EXPECT_EQ(PatchTypeFromContentType("application/json-patch+json"), PatchType::kJsonPatch);
  EXPECT_EQ(PatchTypeFromContentType("application/apply-patch+yaml"), PatchType::kApply);
  EXPECT_EQ(PatchTypeFromContentType("application/json"), PatchType::kUnknown);
}

}  // namespace
}  // namespace spawnpoint::kubetest
