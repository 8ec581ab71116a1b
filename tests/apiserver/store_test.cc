// The store's API semantics, in process: versions and conflicts, generation and status
// subresources, admission of custom resources, finalizers, garbage collection, namespace
// deletion, paging and watch.
#include "tests/apiserver/store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/apiserver/table.h"

namespace spawnpoint::kubetest {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const json kCrd = json::parse(R"({
  "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
  "metadata": {"name": "trainingjobs.spawnpoint.dev"},
  "spec": {"group": "spawnpoint.dev", "scope": "Namespaced",
    "names": {"kind": "TrainingJob", "plural": "trainingjobs", "singular": "trainingjob",
              "shortNames": ["tj"]},
    "versions": [{"name": "v1alpha1", "served": true, "storage": true,
      "subresources": {"status": {}},
      "additionalPrinterColumns": [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Nodes", "type": "integer", "jsonPath": ".spec.nodes"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}],
      "schema": {"openAPIV3Schema": {"type": "object", "properties": {
        "spec": {"type": "object", "required": ["nodes"], "properties": {
          "nodes": {"type": "integer", "minimum": 1},
          "backend": {"type": "string", "default": "auto"}}},
        "status": {"type": "object", "properties": {"phase": {"type": "string"}}}}}}}]}
})");

class StoreTest : public ::testing::Test {
 protected:
  StoreTest() : store_(&registry_, Store::Options{50}) {}

  ResourceInfo Info(const std::string& group, const std::string& plural) {
    auto info = registry_.FindAnyVersion(group, plural);
    EXPECT_TRUE(info.has_value()) << group << "/" << plural;
    return *info;
  }
  ResourceInfo Pods() { return Info("", "pods"); }
  ResourceInfo ConfigMaps() { return Info("", "configmaps"); }
  ResourceInfo Jobs() {
    if (!registry_.Find("spawnpoint.dev", "v1alpha1", "trainingjobs")) {
      store_.Create(Info("apiextensions.k8s.io", "customresourcedefinitions"), "", kCrd, {});
    }
    return Info("spawnpoint.dev", "trainingjobs");
  }
  json Job(const std::string& name, int nodes = 2) {
    return {{"apiVersion", "spawnpoint.dev/v1alpha1"},
            {"kind", "TrainingJob"},
            {"metadata", {{"name", name}}},
            {"spec", {{"nodes", nodes}}}};
  }
  json ConfigMap(const std::string& name, json labels = json::object()) {
    return {{"metadata", {{"name", name}, {"labels", labels}}}, {"data", {{"k", "v"}}}};
  }
  json Pod(const std::string& name, json owner = nullptr) {
    json p = {{"metadata", {{"name", name}}},
              {"spec", {{"containers", {{{"name", "c"}, {"image", "busybox"}}}}}}};
    if (!owner.is_null()) p["metadata"]["ownerReferences"] = json::array({owner});
    return p;
  }
  static json OwnerRef(const json& owner, bool block = false) {
    return {{"apiVersion", owner["apiVersion"]},
            {"kind", owner["kind"]},
            {"name", owner["metadata"]["name"]},
            {"uid", owner["metadata"]["uid"]},
            {"blockOwnerDeletion", block}};
  }
  bool Exists(const ResourceInfo& info, const std::string& ns, const std::string& name) {
    try {
      store_.Get(info, ns, name);
      return true;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.code(), 404);
      return false;
    }
  }
  static int Code(const std::function<void()>& f) {
    try {
      f();
    } catch (const ApiError& e) {
      return e.code();
    }
    return 0;
  }

  Registry registry_;
  Store store_;
};

TEST_F(StoreTest, EveryWriteBumpsTheGlobalResourceVersion) {
  json a = store_.Create(ConfigMaps(), "default", ConfigMap("a"), {});
  json b = store_.Create(ConfigMaps(), "default", ConfigMap("b"), {});
  uint64_t rva = std::stoull(a["metadata"]["resourceVersion"].get<std::string>());
  uint64_t rvb = std::stoull(b["metadata"]["resourceVersion"].get<std::string>());
  EXPECT_EQ(rvb, rva + 1);
  EXPECT_FALSE(a["metadata"]["uid"].get<std::string>().empty());
  EXPECT_NE(a["metadata"]["uid"], b["metadata"]["uid"]);
  EXPECT_FALSE(a["metadata"]["creationTimestamp"].get<std::string>().empty());
  // A no-op update writes nothing.
  json same = store_.Update(ConfigMaps(), "default", "a", "", a, {});
  EXPECT_EQ(same["metadata"]["resourceVersion"], a["metadata"]["resourceVersion"]);
  EXPECT_EQ(store_.CurrentResourceVersion(), rvb);
}

TEST_F(StoreTest, CreateConflictsAndMissingNamespace) {
  store_.Create(ConfigMaps(), "default", ConfigMap("a"), {});
  try {
    store_.Create(ConfigMaps(), "default", ConfigMap("a"), {});
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.code(), 409);
    EXPECT_EQ(e.reason(), "AlreadyExists");
    EXPECT_EQ(e.message(), "configmaps \"a\" already exists");
  }
  EXPECT_EQ(Code([&] { store_.Create(ConfigMaps(), "nowhere", ConfigMap("a"), {}); }), 404);
  EXPECT_EQ(Code([&] { store_.Create(ConfigMaps(), "default", ConfigMap("Bad_Name"), {}); }), 422);
  json generated = {{"metadata", {{"generateName", "job-"}}}};
  json g = store_.Create(ConfigMaps(), "default", generated, {});
  EXPECT_THAT(g["metadata"]["name"].get<std::string>(), ::testing::MatchesRegex("job-[a-z0-9]{5}"));
}

TEST_F(StoreTest, StaleUpdateIsAConflictWithTheRealMessage) {
  auto jobs = Jobs();
  json created = store_.Create(jobs, "default", Job("x"), {});
  json first = created;
  first["spec"]["nodes"] = 3;
  store_.Update(jobs, "default", "x", "", first, {});
  json stale = created;
  stale["spec"]["nodes"] = 4;
  try {
    store_.Update(jobs, "default", "x", "", stale, {});
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.code(), 409);
    EXPECT_EQ(e.reason(), "Conflict");
    EXPECT_EQ(e.message(),
              "Operation cannot be fulfilled on trainingjobs.spawnpoint.dev \"x\": the object has "
              "been modified; please apply your changes to the latest version and try again");
    EXPECT_EQ(e.ToStatus()["details"]["kind"], "trainingjobs");
  }
  // Custom resources need a resourceVersion on update.
  json unconditional = Job("x", 5);
  EXPECT_EQ(Code([&] { store_.Update(jobs, "default", "x", "", unconditional, {}); }), 422);
}

TEST_F(StoreTest, GenerationFollowsSpecAndStatusSubresourceIsSeparate) {
  auto jobs = Jobs();
  json j = store_.Create(jobs, "default", Job("x"), {});
  EXPECT_EQ(j["metadata"]["generation"], 1);
  EXPECT_EQ(j["spec"]["backend"], "auto") << "schema default applied";

  json meta_only = j;
  meta_only["metadata"]["labels"] = {{"a", "b"}};
  meta_only["status"] = {{"phase", "Running"}};
  json after_meta = store_.Update(jobs, "default", "x", "", meta_only, {});
  EXPECT_EQ(after_meta["metadata"]["generation"], 1);
  EXPECT_FALSE(after_meta.contains("status")) << "the main endpoint ignores status";

  json status = after_meta;
  status["status"] = {{"phase", "Running"}};
  status["spec"]["nodes"] = 7;
  json after_status = store_.Update(jobs, "default", "x", "status", status, {});
  EXPECT_EQ(after_status["status"]["phase"], "Running");
  EXPECT_EQ(after_status["spec"]["nodes"], 2) << "/status ignores spec";
  EXPECT_EQ(after_status["metadata"]["generation"], 1);

  json spec = after_status;
  spec["spec"]["nodes"] = 3;
  json after_spec = store_.Update(jobs, "default", "x", "", spec, {});
  EXPECT_EQ(after_spec["metadata"]["generation"], 2);
  EXPECT_EQ(after_spec["status"]["phase"], "Running") << "status survives a spec update";
}

TEST_F(StoreTest, CustomResourceAdmissionPrunesDefaultsAndValidates) {
  auto jobs = Jobs();
  json bad = Job("bad", 0);
  try {
    store_.Create(jobs, "default", bad, {});
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.code(), 422);
    EXPECT_EQ(e.message(),
              "TrainingJob.spawnpoint.dev \"bad\" is invalid: spec.nodes: Invalid value: 0: "
              "spec.nodes in body should be greater than or equal to 1");
  }
  json unknown = Job("u");
  unknown["spec"]["foo"] = 1;
  WriteOptions strict;
  strict.field_validation = FieldValidation::kStrict;
  try {
    store_.Create(jobs, "default", unknown, strict);
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.code(), 400);
    EXPECT_EQ(e.message(),
              "TrainingJob in version \"v1alpha1\" cannot be handled as a "
              "TrainingJob: strict decoding error: unknown field \"spec.foo\"");
  }
  std::vector<std::string> warnings;
  WriteOptions warn;
  warn.warnings = &warnings;
  json created = store_.Create(jobs, "default", unknown, warn);
  EXPECT_THAT(warnings, ElementsAre("unknown field \"spec.foo\""));
  EXPECT_FALSE(created["spec"].contains("foo"));
}

TEST_F(StoreTest, FinalizersHoldDeletionUntilRemoved) {
  json cm = ConfigMap("f");
  cm["metadata"]["finalizers"] = {"example.com/hold"};
  store_.Create(ConfigMaps(), "default", cm, {});
  json deleting = store_.Delete(ConfigMaps(), "default", "f", {});
  EXPECT_TRUE(deleting["metadata"].contains("deletionTimestamp"));
  ASSERT_TRUE(Exists(ConfigMaps(), "default", "f"));
  json current = store_.Get(ConfigMaps(), "default", "f");
  current["metadata"]["finalizers"] = {"example.com/hold", "example.com/new"};
  EXPECT_EQ(Code([&] { store_.Update(ConfigMaps(), "default", "f", "", current, {}); }), 422)
      << "no new finalizers once deleting";
  current["metadata"].erase("finalizers");
  store_.Update(ConfigMaps(), "default", "f", "", current, {});
  EXPECT_FALSE(Exists(ConfigMaps(), "default", "f"));
}

TEST_F(StoreTest, DeletePreconditions) {
  json cm = store_.Create(ConfigMaps(), "default", ConfigMap("p"), {});
  DeleteOptions wrong_uid;
  wrong_uid.precondition_uid = "nope";
  EXPECT_EQ(Code([&] { store_.Delete(ConfigMaps(), "default", "p", wrong_uid); }), 409);
  DeleteOptions wrong_rv;
  wrong_rv.precondition_resource_version = "1";
  EXPECT_EQ(Code([&] { store_.Delete(ConfigMaps(), "default", "p", wrong_rv); }), 409);
  DeleteOptions right;
  right.precondition_uid = cm["metadata"]["uid"];
  store_.Delete(ConfigMaps(), "default", "p", right);
  EXPECT_FALSE(Exists(ConfigMaps(), "default", "p"));
  EXPECT_EQ(Code([&] { store_.Delete(ConfigMaps(), "default", "p", right); }), 404);
}

TEST_F(StoreTest, BackgroundDeletionCollectsDependents) {
  auto jobs = Jobs();
  json owner = store_.Create(jobs, "default", Job("owner"), {});
  json other = store_.Create(jobs, "default", Job("other"), {});
  store_.Create(Pods(), "default", Pod("p0", OwnerRef(owner)), {});
  json shared = Pod("shared", OwnerRef(owner));
  shared["metadata"]["ownerReferences"].push_back(OwnerRef(other));
  store_.Create(Pods(), "default", shared, {});
  store_.Create(Pods(), "default", Pod("free"), {});
  store_.Delete(jobs, "default", "owner", {});
  EXPECT_FALSE(Exists(Pods(), "default", "p0"));
  ASSERT_TRUE(Exists(Pods(), "default", "shared")) << "another owner still exists";
  EXPECT_EQ(store_.Get(Pods(), "default", "shared")["metadata"]["ownerReferences"].size(), 1u);
  EXPECT_TRUE(Exists(Pods(), "default", "free"));
}

TEST_F(StoreTest, ForegroundDeletionWaitsForBlockingDependents) {
  auto jobs = Jobs();
  json owner = store_.Create(jobs, "default", Job("owner"), {});
  json held = Pod("held", OwnerRef(owner, true));
  held["metadata"]["finalizers"] = {"example.com/hold"};
  store_.Create(Pods(), "default", held, {});
  DeleteOptions fg;
  fg.propagation = "Foreground";
  json deleting = store_.Delete(jobs, "default", "owner", fg);
  EXPECT_TRUE(deleting["metadata"].contains("deletionTimestamp"));
  EXPECT_THAT(deleting["metadata"]["finalizers"], ::testing::Contains("foregroundDeletion"));
  ASSERT_TRUE(Exists(jobs, "default", "owner")) << "the dependent still blocks";
  json pod = store_.Get(Pods(), "default", "held");
  EXPECT_TRUE(pod["metadata"].contains("deletionTimestamp"));
  pod["metadata"].erase("finalizers");
  store_.Update(Pods(), "default", "held", "", pod, {});
  EXPECT_FALSE(Exists(Pods(), "default", "held"));
  EXPECT_FALSE(Exists(jobs, "default", "owner")) << "the last blocking dependent is gone";
}

TEST_F(StoreTest, OrphanDeletionKeepsDependentsWithoutTheReference) {
  auto jobs = Jobs();
  json owner = store_.Create(jobs, "default", Job("owner"), {});
  store_.Create(Pods(), "default", Pod("p0", OwnerRef(owner)), {});
  DeleteOptions orphan;
  orphan.propagation = "Orphan";
  store_.Delete(jobs, "default", "owner", orphan);
  ASSERT_TRUE(Exists(Pods(), "default", "p0"));
  EXPECT_FALSE(store_.Get(Pods(), "default", "p0")["metadata"].contains("ownerReferences"));
}

TEST_F(StoreTest, NamespaceDeletionEmptiesTheNamespaceFirst) {
  auto ns = Info("", "namespaces");
  store_.Create(ns, "", {{"metadata", {{"name", "ml"}}}}, {});
  json held = ConfigMap("held");
  held["metadata"]["finalizers"] = {"example.com/hold"};
  store_.Create(ConfigMaps(), "ml", held, {});
  store_.Create(ConfigMaps(), "ml", ConfigMap("plain"), {});
  json deleting = store_.Delete(ns, "", "ml", {});
  EXPECT_EQ(deleting["status"]["phase"], "Terminating");
  EXPECT_FALSE(Exists(ConfigMaps(), "ml", "plain"));
  EXPECT_EQ(Code([&] { store_.Create(ConfigMaps(), "ml", ConfigMap("new"), {}); }), 403);
  ASSERT_TRUE(Exists(ns, "", "ml"));
  json cm = store_.Get(ConfigMaps(), "ml", "held");
  cm["metadata"].erase("finalizers");
  store_.Update(ConfigMaps(), "ml", "held", "", cm, {});
  EXPECT_FALSE(Exists(ns, "", "ml"));
}

TEST_F(StoreTest, PagingNeitherRepeatsNorSkips) {
  for (int i = 0; i < 23; ++i) {
    store_.Create(ConfigMaps(), "default",
                  ConfigMap("cm-" + std::to_string(100 + i), {{"odd", i % 2 ? "yes" : "no"}}), {});
  }
  std::vector<std::string> names;
  ListOptions opts;
  opts.limit = 5;
  int pages = 0;
  do {
    ListResult page = store_.List(ConfigMaps(), "default", opts);
    for (const auto& item : page.items) names.push_back(item["metadata"]["name"]);
    if (!page.continue_token.empty()) {
      EXPECT_TRUE(page.remaining_item_count.has_value());
    }
    opts.continue_token = page.continue_token;
    ++pages;
  } while (!opts.continue_token.empty());
  EXPECT_EQ(pages, 5);
  ASSERT_EQ(names.size(), 23u);
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_EQ(std::unique(names.begin(), names.end()), names.end());

  ListOptions odd;
  odd.labels = LabelSelector::Parse("odd=yes");
  EXPECT_EQ(store_.List(ConfigMaps(), "default", odd).items.size(), 11u);
  EXPECT_EQ(store_.List(ConfigMaps(), "", odd).items.size(), 11u) << "all namespaces";
}

TEST_F(StoreTest, ExpiredContinueTokenIsGone) {
  for (int i = 0; i < 4; ++i)
    store_.Create(ConfigMaps(), "default", ConfigMap("c" + std::to_string(i)), {});
  ListOptions opts;
  opts.limit = 2;
  ListResult first = store_.List(ConfigMaps(), "default", opts);
  ASSERT_FALSE(first.continue_token.empty());
  store_.Create(ConfigMaps(), "default", ConfigMap("later"), {});
  store_.Compact();
  opts.continue_token = first.continue_token;
  try {
    store_.List(ConfigMaps(), "default", opts);
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.code(), 410);
    EXPECT_EQ(e.reason(), "Expired");
  }
}

std::vector<std::string> Drain(Watcher& w) {
  std::vector<std::string> out;
  WatchEvent ev;
  while (w.Next(&ev, std::chrono::steady_clock::now()) == Watcher::Result::kEvent) {
    out.push_back(ev.type + " " + ev.object["metadata"]["name"].get<std::string>());
  }
  return out;
}

TEST_F(StoreTest, WatchReplaysFromAResourceVersionAndFollowsSelectors) {
  store_.Create(ConfigMaps(), "default", ConfigMap("before"), {});
  std::string rv = std::to_string(store_.CurrentResourceVersion());
  json a = store_.Create(ConfigMaps(), "default", ConfigMap("a", {{"sel", "yes"}}), {});
  json moved = a;
  moved["metadata"]["labels"]["sel"] = "no";
  moved = store_.Update(ConfigMaps(), "default", "a", "", moved, {});
  moved["metadata"]["labels"]["sel"] = "yes";
  store_.Update(ConfigMaps(), "default", "a", "", moved, {});
  store_.Delete(ConfigMaps(), "default", "a", {});

  ListOptions all;
  auto replay = store_.Watch(ConfigMaps(), "default", all, rv);
  EXPECT_THAT(Drain(*replay), ElementsAre("ADDED a", "MODIFIED a", "MODIFIED a", "DELETED a"));

  ListOptions sel;
  sel.labels = LabelSelector::Parse("sel=yes");
  auto filtered = store_.Watch(ConfigMaps(), "default", sel, rv);
  EXPECT_THAT(Drain(*filtered), ElementsAre("ADDED a", "DELETED a", "ADDED a", "DELETED a"))
      << "leaving and re-entering the selector";

  auto from_now = store_.Watch(ConfigMaps(), "default", all, "");
  EXPECT_THAT(Drain(*from_now), ElementsAre("ADDED before")) << "synthetic ADDED for what exists";
  store_.Create(ConfigMaps(), "default", ConfigMap("live"), {});
  EXPECT_THAT(Drain(*from_now), ElementsAre("ADDED live"));
  EXPECT_EQ(from_now->IdleProgress(), store_.CurrentResourceVersion());
}

TEST_F(StoreTest, WatchFromBeforeTheWindowIsGone) {
  std::string old = std::to_string(store_.CurrentResourceVersion());
  for (int i = 0; i < 60; ++i)
    store_.Create(ConfigMaps(), "default", ConfigMap("w" + std::to_string(i)), {});
  try {
    store_.Watch(ConfigMaps(), "default", ListOptions{}, old);
    FAIL() << "watch window is 50 events";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.code(), 410);
    EXPECT_THAT(e.message(), HasSubstr("too old resource version: " + old));
  }
  std::string recent = std::to_string(store_.CurrentResourceVersion() - 10);
  auto w = store_.Watch(ConfigMaps(), "default", ListOptions{}, recent);
  EXPECT_EQ(Drain(*w).size(), 10u);
}

TEST_F(StoreTest, DeletingACrdRemovesItsResources) {
  auto jobs = Jobs();
  store_.Create(jobs, "default", Job("x"), {});
  store_.Delete(Info("apiextensions.k8s.io", "customresourcedefinitions"), "",
                "trainingjobs.spawnpoint.dev", {});
  EXPECT_FALSE(registry_.Find("spawnpoint.dev", "v1alpha1", "trainingjobs").has_value());
  Jobs();
  EXPECT_TRUE(store_.List(Jobs(), "default", {}).items.empty());
}

TEST(TableTest, CustomColumnsAndAges) {
  Registry registry;
  Store store(&registry, {});
  store.Create(*registry.Find("apiextensions.k8s.io", "v1", "customresourcedefinitions"), "", kCrd,
               {});
  auto info = *registry.Find("spawnpoint.dev", "v1alpha1", "trainingjobs");
  json job = {{"metadata",
               {{"name", "j"},
                {"creationTimestamp",
                 FormatTimestamp(std::chrono::system_clock::now() - std::chrono::seconds(125))}}},
              {"spec", {{"nodes", 3}}},
              {"status", {{"phase", "Running"}}}};
  json table = BuildTable(info, {job}, IncludeObject::kMetadata, true, "7");
  std::vector<std::string> names;
  for (const auto& c : table["columnDefinitions"]) names.push_back(c["name"]);
  EXPECT_THAT(names, ElementsAre("Name", "Phase", "Nodes", "Age"));
  EXPECT_EQ(table["rows"][0]["cells"], json::parse(R"(["j", "Running", 3, "2m5s"])"));
  EXPECT_EQ(table["rows"][0]["object"]["kind"], "PartialObjectMetadata");
  EXPECT_EQ(HumanDuration(std::chrono::seconds(45)), "45s");
  EXPECT_EQ(HumanDuration(std::chrono::seconds(600)), "10m");
  EXPECT_EQ(HumanDuration(std::chrono::hours(5) + std::chrono::minutes(3)), "5h3m");
  EXPECT_EQ(HumanDuration(std::chrono::hours(50)), "2d2h");
  EXPECT_EQ(EvalJsonPath(job, ".spec.nodes").at(0), 3);
  EXPECT_TRUE(EvalJsonPath(job, ".status.missing").empty());
}

}  // namespace
}  // namespace spawnpoint::kubetest
