// RBAC evaluation and authentication helpers, in process: request attributes as
// kube-apiserver derives them, rule matching, subjects and bindings, the 403 message,
// tokens, and the protobuf bodies kubectl sends to the review APIs.
#include "tests/apiserver/rbac.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/apiserver/auth.h"

namespace spawnpoint::kubetest {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The stored RBAC objects, as a plain list.
class FakeObjects : public RbacObjects {
 public:
  void Add(const std::string& yamlish_json) { objects_.push_back(json::parse(yamlish_json)); }

  std::vector<json> ClusterRoleBindings() const override { return OfKind("ClusterRoleBinding"); }
  std::vector<json> RoleBindings(const std::string& ns) const override {
    std::vector<json> out;
    for (const auto& o : OfKind("RoleBinding")) {
      if (o["metadata"]["namespace"] == ns) out.push_back(o);
    }
    return out;
  }
  std::vector<json> ClusterRoles() const override { return OfKind("ClusterRole"); }
  std::optional<json> ClusterRole(const std::string& name) const override {
    for (const auto& o : OfKind("ClusterRole")) {
      if (o["metadata"]["name"] == name) return o;
    }
    return std::nullopt;
  }
  std::optional<json> Role(const std::string& ns, const std::string& name) const override {
    for (const auto& o : OfKind("Role")) {
      if (o["metadata"]["name"] == name && o["metadata"]["namespace"] == ns) return o;
    }
    return std::nullopt;
  }

 private:
  std::vector<json> OfKind(const std::string& kind) const {
    std::vector<json> out;
    for (const auto& o : objects_) {
      if (o["kind"] == kind) out.push_back(o);
    }
    return out;
  }
  std::vector<json> objects_;
};

Attributes Req(const std::string& method, const std::string& path,
               std::map<std::string, std::string> query = {}) {
  return RequestAttributes(method, path, query);
}

Attributes As(Attributes a, const UserInfo& user) {
  a.user = user;
  return a;
}

PolicyRule Rule(std::vector<std::string> groups, std::vector<std::string> resources,
                std::vector<std::string> verbs, std::vector<std::string> names = {}) {
  return PolicyRule{
      std::move(verbs), std::move(groups), std::move(resources), std::move(names), {}};
}

// --- Request attributes ---

TEST(RequestAttributesTest, VerbsFromMethodAndPath) {
  const std::string pods = "/api/v1/namespaces/ns/pods";
  EXPECT_EQ(Req("GET", pods).verb, "list");
  EXPECT_EQ(Req("GET", pods, {{"watch", "true"}}).verb, "watch");
  EXPECT_EQ(Req("GET", pods, {{"watch", "1"}}).verb, "watch");
  // What Go's strconv.ParseBool reads as true; anything else is a list.
  for (const char* yes : {"t", "T", "TRUE", "True"}) {
    EXPECT_EQ(Req("GET", pods, {{"watch", yes}}).verb, "watch") << yes;
  }
  for (const char* no : {"false", "0", "yes", "on", ""}) {
    EXPECT_EQ(Req("GET", pods, {{"watch", no}}).verb, "list") << no;
  }
  EXPECT_EQ(Req("GET", "/api/v1/watch/namespaces/ns/pods").verb, "watch");
  EXPECT_EQ(Req("GET", pods + "/p").verb, "get");
  EXPECT_EQ(Req("HEAD", pods + "/p").verb, "get");
  EXPECT_EQ(Req("POST", pods).verb, "create");
  EXPECT_EQ(Req("PUT", pods + "/p").verb, "update");
  EXPECT_EQ(Req("PATCH", pods + "/p").verb, "patch");
  EXPECT_EQ(Req("DELETE", pods + "/p").verb, "delete");
  EXPECT_EQ(Req("DELETE", pods).verb, "deletecollection");
}

TEST(RequestAttributesTest, GroupResourceSubresourceNamespaceName) {
  Attributes a = Req("PUT", "/apis/spawnpoint.dev/v1alpha1/namespaces/x/trainingjobs/j/status");
  EXPECT_TRUE(a.resource_request);
  EXPECT_EQ(a.api_group, "spawnpoint.dev");
  EXPECT_EQ(a.api_version, "v1alpha1");
  EXPECT_EQ(a.resource, "trainingjobs");
  EXPECT_EQ(a.subresource, "status");
  EXPECT_EQ(a.ns, "x");
  EXPECT_EQ(a.name, "j");

  Attributes log = Req("GET", "/api/v1/namespaces/ns/pods/p/log");
  EXPECT_EQ(log.verb, "get");
  EXPECT_EQ(log.resource, "pods");
  EXPECT_EQ(log.subresource, "log");

  Attributes nodes = Req("GET", "/api/v1/nodes");
  EXPECT_EQ(nodes.ns, "");
  EXPECT_EQ(nodes.resource, "nodes");
  Attributes all_pods = Req("GET", "/api/v1/pods");
  EXPECT_EQ(all_pods.ns, "");
  EXPECT_EQ(all_pods.resource, "pods");
}

TEST(RequestAttributesTest, ANamespaceIsInItself) {
  Attributes ns = Req("GET", "/api/v1/namespaces/team");
  EXPECT_EQ(ns.resource, "namespaces");
  EXPECT_EQ(ns.name, "team");
  EXPECT_EQ(ns.ns, "team");
  Attributes status = Req("PUT", "/api/v1/namespaces/team/status");
  EXPECT_EQ(status.resource, "namespaces");
  EXPECT_EQ(status.subresource, "status");
  EXPECT_EQ(status.name, "team");
  Attributes list = Req("GET", "/api/v1/namespaces");
  EXPECT_EQ(list.verb, "list");
  EXPECT_EQ(list.ns, "");
}

TEST(RequestAttributesTest, AFieldSelectorOnTheNameNamesTheObject) {
  const std::string pods = "/api/v1/namespaces/ns/pods";
  EXPECT_EQ(Req("GET", pods, {{"fieldSelector", "metadata.name=p"}}).name, "p");
  EXPECT_EQ(Req("GET", pods, {{"fieldSelector", "status.phase=Running,metadata.name==p"}}).name,
            "p");
  Attributes watch = Req("GET", pods, {{"watch", "true"}, {"fieldSelector", "metadata.name=p"}});
  EXPECT_EQ(watch.verb, "watch");
  EXPECT_EQ(watch.name, "p");
  EXPECT_EQ(Req("GET", pods, {{"fieldSelector", "metadata.name!=p"}}).name, "");
  EXPECT_EQ(Req("GET", pods, {{"fieldSelector", "spec.nodeName=n"}}).name, "");
  EXPECT_EQ(Req("DELETE", pods, {{"fieldSelector", "metadata.name=p"}}).verb, "deletecollection");
}

TEST(RequestAttributesTest, DiscoveryAndOtherPathsAreNonResource) {
  for (const char* p : {"/api", "/api/v1", "/apis", "/apis/apps", "/apis/apps/v1", "/version",
                        "/openapi/v3", "/openapi/v3/api/v1", "/healthz", "/"}) {
    Attributes a = Req("GET", p);
    EXPECT_FALSE(a.resource_request) << p;
    EXPECT_EQ(a.verb, "get") << p;
    EXPECT_EQ(a.path, p);
  }
  EXPECT_EQ(Req("POST", "/version").verb, "post");
  EXPECT_TRUE(Req("GET", "/api/v1/pods").resource_request);
  EXPECT_TRUE(Req("GET", "/apis/apps/v1/deployments").resource_request);
}

// --- Rules ---

TEST(RuleAllowsTest, VerbsGroupsAndResources) {
  Attributes list = Req("GET", "/api/v1/namespaces/ns/pods");
  EXPECT_TRUE(RuleAllows(list, Rule({""}, {"pods"}, {"list"})));
  EXPECT_TRUE(RuleAllows(list, Rule({""}, {"pods"}, {"*"})));
  EXPECT_TRUE(RuleAllows(list, Rule({"*"}, {"*"}, {"list"})));
  EXPECT_FALSE(RuleAllows(list, Rule({""}, {"pods"}, {"get", "watch"})));
  EXPECT_FALSE(RuleAllows(list, Rule({"apps"}, {"pods"}, {"list"})));
  EXPECT_FALSE(RuleAllows(list, Rule({""}, {"services"}, {"list"})));
  EXPECT_FALSE(RuleAllows(list, Rule({}, {"pods"}, {"list"}))) << "no apiGroups: no match";
  Attributes job = Req("GET", "/apis/spawnpoint.dev/v1alpha1/namespaces/ns/trainingjobs/j");
  EXPECT_TRUE(RuleAllows(job, Rule({"spawnpoint.dev"}, {"trainingjobs"}, {"get"})));
  EXPECT_FALSE(RuleAllows(job, Rule({""}, {"trainingjobs"}, {"get"})));
}

TEST(RuleAllowsTest, SubresourcesAreSeparateResources) {
  Attributes status =
      Req("PATCH", "/apis/spawnpoint.dev/v1alpha1/namespaces/ns/trainingjobs/j/status");
  const std::vector<std::string> g = {"spawnpoint.dev"};
  EXPECT_FALSE(RuleAllows(status, Rule(g, {"trainingjobs"}, {"patch"})));
  EXPECT_TRUE(RuleAllows(status, Rule(g, {"trainingjobs/status"}, {"patch"})));
  EXPECT_TRUE(RuleAllows(status, Rule(g, {"*/status"}, {"patch"})));
  EXPECT_TRUE(RuleAllows(status, Rule(g, {"*"}, {"patch"})));
  EXPECT_FALSE(RuleAllows(status, Rule(g, {"trainingjobs/*"}, {"patch"})))
      << "Kubernetes has no resource/* wildcard";
  EXPECT_FALSE(RuleAllows(status, Rule(g, {"*/scale"}, {"patch"})));
  Attributes main = Req("PATCH", "/apis/spawnpoint.dev/v1alpha1/namespaces/ns/trainingjobs/j");
  EXPECT_FALSE(RuleAllows(main, Rule(g, {"trainingjobs/status"}, {"patch"})));
  EXPECT_FALSE(RuleAllows(main, Rule(g, {"*/status"}, {"patch"})));
  Attributes log = Req("GET", "/api/v1/namespaces/ns/pods/p/log");
  EXPECT_TRUE(RuleAllows(log, Rule({""}, {"pods/log"}, {"get"})));
  EXPECT_FALSE(RuleAllows(log, Rule({""}, {"pods"}, {"get"})));
}

TEST(RuleAllowsTest, ResourceNamesNeedANamedRequest) {
  PolicyRule named = Rule({"coordination.k8s.io"}, {"leases"}, {"*"}, {"leader"});
  const std::string leases = "/apis/coordination.k8s.io/v1/namespaces/ns/leases";
  EXPECT_TRUE(RuleAllows(Req("GET", leases + "/leader"), named));
  EXPECT_TRUE(RuleAllows(Req("PUT", leases + "/leader"), named));
  EXPECT_TRUE(RuleAllows(Req("DELETE", leases + "/leader"), named));
  EXPECT_FALSE(RuleAllows(Req("GET", leases + "/other"), named));
  EXPECT_FALSE(RuleAllows(Req("POST", leases), named)) << "create has no name";
  EXPECT_FALSE(RuleAllows(Req("GET", leases), named)) << "list without a name";
  EXPECT_FALSE(RuleAllows(Req("GET", leases, {{"watch", "true"}}), named));
  EXPECT_FALSE(RuleAllows(Req("DELETE", leases), named));
  EXPECT_TRUE(RuleAllows(Req("GET", leases, {{"fieldSelector", "metadata.name=leader"}}), named));
  EXPECT_TRUE(RuleAllows(
      Req("GET", leases, {{"watch", "true"}, {"fieldSelector", "metadata.name=leader"}}), named));
}

TEST(RuleAllowsTest, NonResourceUrls) {
  PolicyRule discovery{{"get"}, {}, {}, {}, {"/api", "/api/*", "/version"}};
  EXPECT_TRUE(RuleAllows(Req("GET", "/api"), discovery));
  EXPECT_TRUE(RuleAllows(Req("GET", "/api/v1"), discovery));
  EXPECT_TRUE(RuleAllows(Req("GET", "/version"), discovery));
  EXPECT_FALSE(RuleAllows(Req("GET", "/version/"), discovery));
  EXPECT_FALSE(RuleAllows(Req("GET", "/apis"), discovery));
  EXPECT_FALSE(RuleAllows(Req("POST", "/api"), discovery));
  EXPECT_FALSE(RuleAllows(Req("GET", "/api/v1/pods"), discovery))
      << "a resource request never matches nonResourceURLs";
  PolicyRule all{{"*"}, {}, {}, {}, {"*"}};
  EXPECT_TRUE(RuleAllows(Req("DELETE", "/anything"), all));
  PolicyRule resources{{"*"}, {"*"}, {"*"}, {}, {}};
  EXPECT_FALSE(RuleAllows(Req("GET", "/version"), resources));
}

TEST(PolicyRuleTest, RoundTripsJson) {
  json j = {
      {"apiGroups", {""}}, {"resources", {"pods"}}, {"verbs", {"get"}}, {"resourceNames", {"p"}}};
  PolicyRule r = PolicyRule::FromJson(j);
  EXPECT_THAT(r.api_groups, ElementsAre(""));
  EXPECT_THAT(r.resource_names, ElementsAre("p"));
  EXPECT_EQ(r.ToJson(), j);
}

// --- Subjects ---

TEST(SubjectTest, UsersGroupsAndServiceAccounts) {
  UserInfo sa = ServiceAccountUser("ns", "op");
  EXPECT_EQ(sa.name, "system:serviceaccount:ns:op");
  EXPECT_THAT(sa.groups, ElementsAre("system:serviceaccounts", "system:serviceaccounts:ns",
                                     "system:authenticated"));
  EXPECT_TRUE(
      SubjectMatches(sa, {{"kind", "ServiceAccount"}, {"name", "op"}, {"namespace", "ns"}}, ""));
  EXPECT_FALSE(SubjectMatches(
      sa, {{"kind", "ServiceAccount"}, {"name", "op"}, {"namespace", "other"}}, "ns"));
  EXPECT_TRUE(SubjectMatches(sa, {{"kind", "ServiceAccount"}, {"name", "op"}}, "ns"))
      << "a RoleBinding's namespace is the default";
  EXPECT_FALSE(SubjectMatches(sa, {{"kind", "ServiceAccount"}, {"name", "op"}}, ""))
      << "a ClusterRoleBinding has none";
  EXPECT_TRUE(SubjectMatches(sa, {{"kind", "Group"}, {"name", "system:serviceaccounts:ns"}}, ""));
  EXPECT_TRUE(SubjectMatches(sa, {{"kind", "User"}, {"name", "system:serviceaccount:ns:op"}}, ""));
  EXPECT_FALSE(SubjectMatches(sa, {{"kind", "User"}, {"name", "op"}}, ""));
  std::string ns, name;
  EXPECT_TRUE(ParseServiceAccountUser("system:serviceaccount:ns:op", &ns, &name));
  EXPECT_EQ(ns + "/" + name, "ns/op");
  EXPECT_FALSE(ParseServiceAccountUser("system:serviceaccount:ns", &ns, &name));
  EXPECT_FALSE(ParseServiceAccountUser("bob", &ns, &name));
}

// --- Bindings ---

class AuthorizeTest : public ::testing::Test {
 protected:
  AuthorizeTest() {
    objects_.Add(R"({"kind": "ClusterRole", "metadata": {"name": "node-reader"},
      "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]})");
    objects_.Add(R"({"kind": "ClusterRole", "metadata": {"name": "job-editor"},
      "rules": [{"apiGroups": ["spawnpoint.dev"], "resources": ["trainingjobs"],
                 "verbs": ["get", "list", "watch", "update"]},
                {"apiGroups": ["spawnpoint.dev"], "resources": ["trainingjobs/status"],
                 "verbs": ["update", "patch"]}]})");
    objects_.Add(R"({"kind": "Role", "metadata": {"name": "pod-admin", "namespace": "team"},
      "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}]})");
    objects_.Add(R"({"kind": "ClusterRoleBinding", "metadata": {"name": "op-nodes"},
      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                  "name": "node-reader"},
      "subjects": [{"kind": "ServiceAccount", "name": "op", "namespace": "system"}]})");
    objects_.Add(R"({"kind": "RoleBinding", "metadata": {"name": "op-pods", "namespace": "team"},
      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-admin"},
      "subjects": [{"kind": "ServiceAccount", "name": "op", "namespace": "system"}]})");
    objects_.Add(R"({"kind": "RoleBinding", "metadata": {"name": "op-jobs", "namespace": "team"},
      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                  "name": "job-editor"},
      "subjects": [{"kind": "ServiceAccount", "name": "op", "namespace": "system"}]})");
  }

  Decision Check(const std::string& method, const std::string& path,
                 const UserInfo& user = ServiceAccountUser("system", "op")) {
    return Authorize(objects_, As(Req(method, path), user));
  }

  FakeObjects objects_;
};

TEST_F(AuthorizeTest, ClusterRoleBindingAppliesEverywhere) {
  Decision d = Check("GET", "/api/v1/nodes");
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.reason,
            "RBAC: allowed by ClusterRoleBinding \"op-nodes\" of ClusterRole \"node-reader\" to "
            "ServiceAccount \"op/system\"");
  EXPECT_TRUE(Check("GET", "/api/v1/nodes/n").allowed);
  EXPECT_FALSE(Check("DELETE", "/api/v1/nodes/n").allowed);
  EXPECT_FALSE(Check("GET", "/api/v1/nodes", ServiceAccountUser("system", "other")).allowed);
}

TEST_F(AuthorizeTest, RoleBindingOnlyInItsNamespace) {
  Decision d = Check("POST", "/api/v1/namespaces/team/pods");
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.reason,
            "RBAC: allowed by RoleBinding \"op-pods/team\" of Role \"pod-admin\" to "
            "ServiceAccount \"op/system\"");
  EXPECT_TRUE(Check("DELETE", "/api/v1/namespaces/team/pods").allowed);
  EXPECT_FALSE(Check("GET", "/api/v1/namespaces/other/pods").allowed);
  EXPECT_FALSE(Check("GET", "/api/v1/pods").allowed) << "all namespaces needs a cluster binding";
  EXPECT_FALSE(Check("GET", "/api/v1/namespaces/team/pods/p/log").allowed);
}

TEST_F(AuthorizeTest, RoleBindingToAClusterRoleAppliesInItsNamespace) {
  const std::string team = "/apis/spawnpoint.dev/v1alpha1/namespaces/team/trainingjobs";
  EXPECT_TRUE(Check("GET", team).allowed);
  EXPECT_TRUE(Check("PUT", team + "/j").allowed);
  EXPECT_TRUE(Check("PATCH", team + "/j/status").allowed);
  EXPECT_FALSE(Check("PATCH", team + "/j").allowed);
  EXPECT_FALSE(Check("POST", team).allowed);
  EXPECT_FALSE(Check("GET", "/apis/spawnpoint.dev/v1alpha1/namespaces/other/trainingjobs").allowed);
  EXPECT_FALSE(Check("GET", "/apis/spawnpoint.dev/v1alpha1/trainingjobs").allowed);
  EXPECT_EQ(Check("GET", team).reason,
            "RBAC: allowed by RoleBinding \"op-jobs/team\" of ClusterRole \"job-editor\" to "
            "ServiceAccount \"op/system\"");
}

TEST_F(AuthorizeTest, SystemMastersMayDoAnything) {
  UserInfo admin = AdminUser();
  Decision d = Check("DELETE", "/api/v1/nodes", admin);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.reason, "");
  EXPECT_TRUE(Check("POST", "/whatever", admin).allowed);
}

TEST_F(AuthorizeTest, GroupsAndUsersAndDefaultedServiceAccountNamespace) {
  objects_.Add(R"({"kind": "RoleBinding", "metadata": {"name": "cm", "namespace": "team"},
    "roleRef": {"kind": "Role", "name": "pod-admin"},
    "subjects": [{"kind": "Group", "name": "devs"}, {"kind": "User", "name": "alice"},
                 {"kind": "ServiceAccount", "name": "local"}]})");
  EXPECT_TRUE(Check("GET", "/api/v1/namespaces/team/pods", UserInfo{"bob", "", {"devs"}}).allowed);
  EXPECT_TRUE(Check("GET", "/api/v1/namespaces/team/pods", UserInfo{"alice", "", {}}).allowed);
  EXPECT_FALSE(Check("GET", "/api/v1/namespaces/team/pods", UserInfo{"carol", "", {}}).allowed);
  EXPECT_TRUE(
      Check("GET", "/api/v1/namespaces/team/pods", ServiceAccountUser("team", "local")).allowed);
  EXPECT_FALSE(
      Check("GET", "/api/v1/namespaces/team/pods", ServiceAccountUser("x", "local")).allowed);
}

TEST_F(AuthorizeTest, AMissingRoleIsTheDenialReason) {
  objects_.Add(R"({"kind": "RoleBinding", "metadata": {"name": "dangling", "namespace": "team"},
    "roleRef": {"kind": "Role", "name": "gone"},
    "subjects": [{"kind": "User", "name": "dave"}]})");
  objects_.Add(R"({"kind": "ClusterRoleBinding", "metadata": {"name": "dangling"},
    "roleRef": {"kind": "ClusterRole", "name": "gone"},
    "subjects": [{"kind": "User", "name": "dave"}]})");
  Decision d = Check("GET", "/api/v1/namespaces/team/pods", UserInfo{"dave", "", {}});
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.reason,
            "RBAC: [clusterrole.rbac.authorization.k8s.io \"gone\" not found, "
            "role.rbac.authorization.k8s.io \"gone\" not found]");
  EXPECT_EQ(Check("GET", "/api/v1/nodes", UserInfo{"dave", "", {}}).reason,
            "RBAC: clusterrole.rbac.authorization.k8s.io \"gone\" not found");
}

TEST_F(AuthorizeTest, AMissingRoleTwiceIsOneDenialReason) {
  for (const char* name : {"dangling-1", "dangling-2"}) {
    objects_.Add(R"({"kind": "RoleBinding", "metadata": {"name": ")" + std::string(name) +
                 R"(", "namespace": "team"}, "roleRef": {"kind": "Role", "name": "gone"},
      "subjects": [{"kind": "User", "name": "dave"}]})");
  }
  Decision d = Check("GET", "/api/v1/namespaces/team/pods", UserInfo{"dave", "", {}});
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.reason, "RBAC: role.rbac.authorization.k8s.io \"gone\" not found");
}

TEST(AggregateMessageTest, LikeUtilErrorsNewAggregate) {
  EXPECT_EQ(AggregateMessage({}), "");
  EXPECT_EQ(AggregateMessage({"a"}), "a");
  EXPECT_EQ(AggregateMessage({"a", "a"}), "a");
  EXPECT_EQ(AggregateMessage({"a", "b", "a"}), "[a, b]");
}

TEST_F(AuthorizeTest, AggregatedClusterRolesCollectTheSelectedRules) {
  objects_.Add(R"({"kind": "ClusterRole", "metadata": {"name": "agg"},
    "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"agg": "yes"}}]},
    "rules": []})");
  objects_.Add(R"({"kind": "ClusterRole", "metadata": {"name": "part",
      "labels": {"agg": "yes"}},
    "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]})");
  objects_.Add(R"({"kind": "ClusterRoleBinding", "metadata": {"name": "agg"},
    "roleRef": {"kind": "ClusterRole", "name": "agg"},
    "subjects": [{"kind": "User", "name": "erin"}]})");
  EXPECT_TRUE(Check("GET", "/api/v1/namespaces/a/secrets/s", UserInfo{"erin", "", {}}).allowed);
  EXPECT_FALSE(Check("GET", "/api/v1/namespaces/a/secrets", UserInfo{"erin", "", {}}).allowed);
}

TEST_F(AuthorizeTest, BootstrapPolicyLetsEveryoneAuthenticatedDiscover) {
  FakeObjects boot;
  for (const auto& r : BootstrapClusterRoles()) boot.Add(r.dump());
  for (const auto& b : BootstrapClusterRoleBindings()) boot.Add(b.dump());
  UserInfo sa = ServiceAccountUser("ns", "op");
  for (const char* p : {"/api", "/api/v1", "/apis", "/apis/apps/v1", "/version", "/openapi/v3",
                        "/openapi/v3/apis/apps/v1", "/healthz"}) {
    EXPECT_TRUE(Authorize(boot, As(Req("GET", p), sa)).allowed) << p;
  }
  EXPECT_FALSE(Authorize(boot, As(Req("GET", "/api/v1/pods"), sa)).allowed);
  EXPECT_FALSE(Authorize(boot, As(Req("GET", "/metrics"), sa)).allowed);
  EXPECT_TRUE(
      Authorize(boot, As(Req("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"), sa))
          .allowed);
  UserInfo anonymous{kAnonymousUser, "", {kAllUnauthenticated}};
  EXPECT_TRUE(Authorize(boot, As(Req("GET", "/version"), anonymous)).allowed);
  EXPECT_FALSE(Authorize(boot, As(Req("GET", "/api"), anonymous)).allowed);
  UserInfo master{"m", "", {kSystemMasters}};
  EXPECT_TRUE(Authorize(boot, As(Req("DELETE", "/api/v1/nodes"), master)).allowed);
}

// --- The 403 ---

TEST(ForbiddenTest, MessagesLikeTheRealServer) {
  UserInfo sa = ServiceAccountUser("ns", "sa");
  ApiError list =
      AuthorizationForbiddenError(As(Req("GET", "/api/v1/namespaces/default/pods"), sa), "");
  EXPECT_EQ(list.code(), 403);
  EXPECT_EQ(list.reason(), "Forbidden");
  EXPECT_EQ(list.message(),
            "pods is forbidden: User \"system:serviceaccount:ns:sa\" cannot list resource \"pods\" "
            "in API group \"\" in the namespace \"default\"");
  EXPECT_EQ(list.details(), json({{"kind", "pods"}}));

  ApiError named =
      AuthorizationForbiddenError(As(Req("GET", "/api/v1/namespaces/default/pods/p"), sa), "");
  EXPECT_EQ(named.message(),
            "pods \"p\" is forbidden: User \"system:serviceaccount:ns:sa\" cannot get resource "
            "\"pods\" in API group \"\" in the namespace \"default\"");
  EXPECT_EQ(named.details(), json({{"kind", "pods"}, {"name", "p"}}));

  ApiError cluster = AuthorizationForbiddenError(As(Req("GET", "/api/v1/nodes"), sa), "");
  EXPECT_EQ(cluster.message(),
            "nodes is forbidden: User \"system:serviceaccount:ns:sa\" cannot list resource "
            "\"nodes\" in API group \"\" at the cluster scope");

  ApiError status = AuthorizationForbiddenError(
      As(Req("PUT", "/apis/spawnpoint.dev/v1alpha1/namespaces/x/trainingjobs/j/status"), sa), "");
  EXPECT_EQ(status.message(),
            "trainingjobs.spawnpoint.dev \"j\" is forbidden: User "
            "\"system:serviceaccount:ns:sa\" cannot update resource \"trainingjobs/status\" in API "
            "group \"spawnpoint.dev\" in the namespace \"x\"");
  EXPECT_EQ(status.details(),
            json({{"kind", "trainingjobs"}, {"group", "spawnpoint.dev"}, {"name", "j"}}));

  ApiError path = AuthorizationForbiddenError(As(Req("GET", "/metrics"), sa), "");
  EXPECT_EQ(path.message(),
            "forbidden: User \"system:serviceaccount:ns:sa\" cannot get path \"/metrics\"");
  EXPECT_EQ(path.details(), json::object());

  ApiError reason =
      AuthorizationForbiddenError(As(Req("GET", "/api/v1/namespaces/default/pods"), sa),
                                  "RBAC: role.rbac.authorization.k8s.io \"r\" not found");
  EXPECT_THAT(reason.message(),
              HasSubstr("in the namespace \"default\": RBAC: role.rbac.authorization.k8s.io "
                        "\"r\" not found"));
  ApiError html = AuthorizationForbiddenError(As(Req("GET", "/<b>"), sa), "");
  EXPECT_THAT(html.message(), HasSubstr("path \"/&lt;b&gt;\""));
}

// --- Tokens ---

TEST(TokensTest, AdminServiceAccountsExpiryAndAudience) {
  Tokens tokens;
  auto now = std::chrono::system_clock::now();
  EXPECT_EQ(tokens.Find(kAdminToken, now).kind, Tokens::Kind::kAdmin);
  EXPECT_EQ(tokens.Find("nope", now).kind, Tokens::Kind::kUnknown);
  EXPECT_EQ(tokens.Find("", now).kind, Tokens::Kind::kUnknown);

  std::string forever = tokens.Issue("ns", "op", "uid-1", std::chrono::seconds(0), {});
  EXPECT_EQ(std::count(forever.begin(), forever.end(), '.'), 2) << "JWT-shaped";
  auto found = tokens.Find(forever, now + std::chrono::hours(24 * 365));
  ASSERT_EQ(found.kind, Tokens::Kind::kServiceAccount);
  EXPECT_EQ(found.sa.ns, "ns");
  EXPECT_EQ(found.sa.name, "op");
  EXPECT_EQ(found.sa.uid, "uid-1");

  std::string hour = tokens.Issue("ns", "op", "uid-1", std::chrono::seconds(3600), {});
  EXPECT_NE(hour, forever);
  EXPECT_EQ(tokens.Find(hour, now).kind, Tokens::Kind::kServiceAccount);
  auto expired = tokens.Find(hour, now + std::chrono::seconds(3601));
  EXPECT_EQ(expired.kind, Tokens::Kind::kUnknown);
  EXPECT_EQ(expired.error, "token has expired");

  std::string vault = tokens.Issue("ns", "op", "uid-1", std::chrono::seconds(600), {"vault"});
  EXPECT_EQ(tokens.Find(vault, now).kind, Tokens::Kind::kUnknown);
  std::string both =
      tokens.Issue("ns", "op", "uid-1", std::chrono::seconds(600), {"vault", kApiAudience});
  EXPECT_EQ(tokens.Find(both, now).kind, Tokens::Kind::kServiceAccount);

  EXPECT_EQ(BearerToken("Bearer abc"), "abc");
  EXPECT_EQ(BearerToken("bearer  abc "), "abc");
  EXPECT_EQ(BearerToken("Basic abc"), "");
}

// --- Review bodies ---

std::string Varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
  return out;
}
std::string Bytes(int field, const std::string& bytes) {
  return Varint(static_cast<uint64_t>(field) << 3 | 2) + Varint(bytes.size()) + bytes;
}
std::string Int(int field, uint64_t v) {
  return Varint(static_cast<uint64_t>(field) << 3) + Varint(v);
}
// "k8s\0" + runtime.Unknown{typeMeta, raw}, as client-go encodes it.
std::string Envelope(const std::string& api_version, const std::string& kind,
                     const std::string& raw) {
  return std::string("k8s\0", 4) + Bytes(1, Bytes(1, api_version) + Bytes(2, kind)) +
         Bytes(2, raw) + Bytes(3, "") + Bytes(4, "");
}

TEST(ReviewBodyTest, ProtobufSelfSubjectAccessReview) {
  std::string attrs = Bytes(1, "default") + Bytes(2, "list") + Bytes(3, "") + Bytes(4, "") +
                      Bytes(5, "pods") + Bytes(6, "") + Bytes(7, "");
  std::string raw = Bytes(1, Bytes(1, "") + Bytes(2, "")) + Bytes(2, Bytes(1, attrs)) +
                    Bytes(3, Int(1, 0) + Bytes(2, ""));
  auto body =
      DecodeReviewBody(ReviewKind::kSelfSubjectAccessReview, "application/vnd.kubernetes.protobuf",
                       Envelope("authorization.k8s.io/v1", "SelfSubjectAccessReview", raw));
  ASSERT_TRUE(body.ok()) << body.status().message();
  json ra = (*body)["spec"]["resourceAttributes"];
  EXPECT_EQ(ra["namespace"], "default");
  EXPECT_EQ(ra["verb"], "list");
  EXPECT_EQ(ra["resource"], "pods");
  auto a = AttributesFromReviewSpec((*body)["spec"]);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->resource_request);
  EXPECT_EQ(a->verb, "list");
  EXPECT_EQ(a->resource, "pods");
  EXPECT_EQ(a->ns, "default");
}

TEST(ReviewBodyTest, ProtobufTokenRequestAndSubjectAccessReview) {
  std::string spec = Bytes(1, "aud1") + Bytes(1, "aud2") + Int(4, 7200);
  auto tr = DecodeReviewBody(
      ReviewKind::kTokenRequest, "application/vnd.kubernetes.protobuf",
      Envelope("authentication.k8s.io/v1", "TokenRequest", Bytes(1, "") + Bytes(2, spec)));
  ASSERT_TRUE(tr.ok()) << tr.status().message();
  EXPECT_EQ((*tr)["spec"]["expirationSeconds"], 7200);
  EXPECT_EQ((*tr)["spec"]["audiences"], json({"aud1", "aud2"}));

  std::string sar = Bytes(2, Bytes(1, "/version") + Bytes(2, "get")) + Bytes(3, "bob") +
                    Bytes(4, "devs") + Bytes(4, "ops");
  auto r =
      DecodeReviewBody(ReviewKind::kSubjectAccessReview, "application/vnd.kubernetes.protobuf",
                       Envelope("authorization.k8s.io/v1", "SubjectAccessReview", Bytes(2, sar)));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)["spec"]["user"], "bob");
  EXPECT_EQ((*r)["spec"]["groups"], json({"devs", "ops"}));
  auto a = AttributesFromReviewSpec((*r)["spec"]);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->resource_request);
  EXPECT_EQ(a->path, "/version");
}

TEST(ReviewBodyTest, JsonAndErrors) {
  auto j =
      DecodeReviewBody(ReviewKind::kSelfSubjectAccessReview, "application/json",
                       R"({"spec": {"nonResourceAttributes": {"path": "/x", "verb": "get"}}})");
  ASSERT_TRUE(j.ok());
  EXPECT_EQ((*j)["spec"]["nonResourceAttributes"]["path"], "/x");
  EXPECT_TRUE(DecodeReviewBody(ReviewKind::kSelfSubjectReview, "application/json", "").ok());
  EXPECT_FALSE(DecodeReviewBody(ReviewKind::kTokenRequest, "application/json", "{").ok());
  EXPECT_FALSE(
      DecodeReviewBody(ReviewKind::kTokenRequest, "application/vnd.kubernetes.protobuf", "nope")
          .ok());
  EXPECT_FALSE(DecodeReviewBody(ReviewKind::kTokenRequest, "application/vnd.kubernetes.protobuf",
                                std::string("k8s\0", 4) + "\x12\x7f")
                   .ok())
      << "truncated";
  EXPECT_FALSE(AttributesFromReviewSpec(json::object()).ok());
  EXPECT_FALSE(AttributesFromReviewSpec({{"resourceAttributes", json::object()},
                                         {"nonResourceAttributes", json::object()}})
                   .ok());
}

}  // namespace
}  // namespace spawnpoint::kubetest
