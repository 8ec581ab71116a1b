// kube-test-server with --authorization rbac, over real HTTP: bearer tokens and 401s,
// every verb allowed only once a Role grants it, Role vs ClusterRole bindings,
// resourceNames, subresources, watch refusal, the exact 403 Status, impersonation, the
// TokenRequest and access-review APIs, and the request log's user and decision.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/apiserver/test_server.h"

namespace spawnpoint::kubetest::testing {
namespace {

using std::chrono::seconds;
using ::testing::HasSubstr;
using json = nlohmann::json;

const std::string kTeamCms = "/api/v1/namespaces/team/configmaps";
const std::string kTeamPods = "/api/v1/namespaces/team/pods";
const std::string kRbacV1 = "/apis/rbac.authorization.k8s.io/v1";
const std::string kOp = "system:serviceaccount:team:op";

json Named(const std::string& kind, const std::string& api_version, const std::string& name,
           const std::string& ns = "") {
  json meta = {{"name", name}};
  if (!ns.empty()) meta["namespace"] = ns;
  return {{"apiVersion", api_version}, {"kind", kind}, {"metadata", meta}};
}

json PolicyRule(std::vector<std::string> groups, std::vector<std::string> resources,
                std::vector<std::string> verbs, std::vector<std::string> names = {}) {
  json r = {{"apiGroups", groups}, {"resources", resources}, {"verbs", verbs}};
  if (!names.empty()) r["resourceNames"] = names;
  return r;
}

json OpSubject() { return {{"kind", "ServiceAccount"}, {"name", "op"}, {"namespace", "team"}}; }

class RbacServerTest : public ::testing::Test {
 protected:
  void SetUp() override { Start({"--authorization", "rbac"}); }

  void Start(std::vector<std::string> args) {
    server_ = std::make_unique<KubeTestServer>(std::move(args));
    ASSERT_TRUE(server_->ok()) << server_->error();
    Admin("POST", "/api/v1/namespaces", Named("Namespace", "v1", "team"));
    Admin("POST", "/api/v1/namespaces/team/serviceaccounts",
          Named("ServiceAccount", "v1", "op", "team"));
    auto token = server_->ServiceAccountToken("team", "op");
    ASSERT_TRUE(token.ok()) << token.status().message();
    token_ = *token;
  }

  // As the admin token, expecting success.
  json Admin(const std::string& method, const std::string& target, const json& body = nullptr) {
    auto r = server_->CallAs(kAdminToken, method, target, body.is_null() ? "" : body.dump());
    EXPECT_LT(r.code, 300) << method << " " << target << ": " << r.body;
    return r.Json();
  }

  HttpResponse Op(const std::string& method, const std::string& target,
                  const std::string& body = "",
                  const std::string& content_type = "application/json") {
    return server_->CallAs(token_, method, target, body, content_type);
  }

  // A Role in "team" with one rule, bound to op.
  void Grant(const std::string& name, const json& rule) {
    json role = Named("Role", "rbac.authorization.k8s.io/v1", name, "team");
    role["rules"] = json::array({rule});
    Admin("POST", kRbacV1 + "/namespaces/team/roles", role);
    json binding = Named("RoleBinding", "rbac.authorization.k8s.io/v1", name, "team");
    binding["roleRef"] = {
        {"apiGroup", "rbac.authorization.k8s.io"}, {"kind", "Role"}, {"name", name}};
    binding["subjects"] = json::array({OpSubject()});
    Admin("POST", kRbacV1 + "/namespaces/team/rolebindings", binding);
  }

  void GrantCluster(const std::string& name, const json& rule) {
    json role = Named("ClusterRole", "rbac.authorization.k8s.io/v1", name);
    role["rules"] = json::array({rule});
    Admin("POST", kRbacV1 + "/clusterroles", role);
    json binding = Named("ClusterRoleBinding", "rbac.authorization.k8s.io/v1", name);
    binding["roleRef"] = {
        {"apiGroup", "rbac.authorization.k8s.io"}, {"kind", "ClusterRole"}, {"name", name}};
    binding["subjects"] = json::array({OpSubject()});
    Admin("POST", kRbacV1 + "/clusterrolebindings", binding);
  }

  static std::string Denied(const std::string& verb, const std::string& resource,
                            const std::string& group, const std::string& ns) {
    return "User \"" + kOp + "\" cannot " + verb + " resource \"" + resource +
           "\" in API group \"" + group + "\"" +
           (ns.empty() ? " at the cluster scope" : " in the namespace \"" + ns + "\"");
  }

  std::unique_ptr<KubeTestServer> server_;
  std::string token_;
};

TEST_F(RbacServerTest, UnknownTokensAre401WithAStatus) {
  auto r = server_->CallAs("not-a-token", "GET", "/api/v1/namespaces");
  EXPECT_EQ(r.code, 401);
  EXPECT_EQ(r.Json(), json({{"kind", "Status"},
                            {"apiVersion", "v1"},
                            {"metadata", json::object()},
                            {"status", "Failure"},
                            {"message", "Unauthorized"},
                            {"reason", "Unauthorized"},
                            {"code", 401}}));
  EXPECT_EQ(server_->CallAs("not-a-token", "GET", "/version").code, 401);
  EXPECT_EQ(server_->CallAs(kAdminToken, "GET", "/api/v1/nodes").code, 200);
  EXPECT_EQ(server_->Call("GET", "/api/v1/nodes").code, 200)
      << "no token at all: the superuser (kubectl sends none over http)";
  json log = server_->Requests()["requests"];
  json unauthorized;
  for (const auto& e : log) {
    if (e["code"] == 401) unauthorized = e;
  }
  EXPECT_EQ(unauthorized["allowed"], false);
  EXPECT_EQ(unauthorized["user"], "");
  EXPECT_EQ(unauthorized["reason"], "invalid bearer token");
}

TEST_F(RbacServerTest, NoTokenModes) {
  Start({"--authorization", "rbac", "--no-token", "reject"});
  EXPECT_EQ(server_->Call("GET", "/api/v1/nodes").code, 401);
  EXPECT_EQ(server_->Call("GET", "/version").code, 401);
  EXPECT_EQ(server_->CallAs(kAdminToken, "GET", "/api/v1/nodes").code, 200);
  EXPECT_EQ(server_->Call("GET", "/testing/info").Json()["noToken"], "reject")
      << "/testing/ needs no token";

  Start({"--authorization", "rbac", "--no-token", "anonymous"});
  EXPECT_EQ(server_->Call("GET", "/version").code, 200) << "system:public-info-viewer";
  auto api = server_->Call("GET", "/api");
  EXPECT_EQ(api.code, 403);
  EXPECT_EQ(api.Json()["message"], "forbidden: User \"system:anonymous\" cannot get path \"/api\"");
}

TEST_F(RbacServerTest, EveryAuthenticatedUserMayDiscover) {
  for (const char* p : {"/version", "/api", "/api/v1", "/apis", "/apis/rbac.authorization.k8s.io",
                        "/apis/rbac.authorization.k8s.io/v1", "/openapi/v3", "/openapi/v2",
                        "/healthz", "/readyz"}) {
    EXPECT_EQ(Op("GET", p).code, 200) << p;
  }
  auto other = Op("GET", "/metrics");
  EXPECT_EQ(other.code, 403);
  EXPECT_EQ(other.Json()["message"],
            "forbidden: User \"" + kOp + "\" cannot get path \"/metrics\"");
  EXPECT_EQ(other.Json()["details"], json::object());
  EXPECT_EQ(Op("POST", "/version", "{}").code, 403);
  EXPECT_EQ(Admin("GET", kRbacV1 + "/clusterroles/cluster-admin")["rules"][0]["verbs"], json({"*"}))
      << "the default roles exist";
}

TEST_F(RbacServerTest, EachVerbIsAllowedOnlyOnceGranted) {
  Admin("POST", kTeamCms, {{"metadata", {{"name", "c"}}}, {"data", {{"k", "v"}}}});
  Admin("POST", kTeamCms, {{"metadata", {{"name", "d"}}}});
  json current = Admin("GET", kTeamCms + "/c");
  struct Case {
    std::string verb, method, target, body, content_type, name;
    int code;
  };
  const std::vector<Case> cases = {
      {"get", "GET", kTeamCms + "/c", "", "", "c", 200},
      {"list", "GET", kTeamCms, "", "", "", 200},
      {"watch", "GET", kTeamCms + "?watch=true&timeoutSeconds=1", "", "", "", 200},
      {"create", "POST", kTeamCms, json{{"metadata", {{"name", "new"}}}}.dump(), "application/json",
       "", 201},
      {"update", "PUT", kTeamCms + "/c", current.dump(), "application/json", "c", 200},
      {"patch", "PATCH", kTeamCms + "/c", R"({"data":{"x":"1"}})", "application/merge-patch+json",
       "c", 200},
      {"delete", "DELETE", kTeamCms + "/c", "", "", "c", 200},
      {"deletecollection", "DELETE", kTeamCms, "", "", "", 200},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.verb);
    auto denied = Op(c.method, c.target, c.body,
                     c.content_type.empty() ? "application/json" : c.content_type);
    ASSERT_EQ(denied.code, 403) << denied.body;
    std::string subject = c.name.empty() ? "configmaps" : "configmaps \"" + c.name + "\"";
    EXPECT_EQ(denied.Json()["message"],
              subject + " is forbidden: " + Denied(c.verb, "configmaps", "", "team"));
    Grant("cm-" + c.verb, PolicyRule({""}, {"configmaps"}, {c.verb}));
    auto allowed = Op(c.method, c.target, c.body,
                      c.content_type.empty() ? "application/json" : c.content_type);
    EXPECT_EQ(allowed.code, c.code) << allowed.body;
  }
}

TEST_F(RbacServerTest, RoleBindingsOnlyInTheirNamespaceClusterBindingsEverywhere) {
  Grant("pods", PolicyRule({""}, {"pods"}, {"list"}));
  EXPECT_EQ(Op("GET", kTeamPods).code, 200);
  auto other = Op("GET", "/api/v1/namespaces/default/pods");
  EXPECT_EQ(other.code, 403);
  EXPECT_EQ(other.Json()["message"], "pods is forbidden: " + Denied("list", "pods", "", "default"));
  auto all = Op("GET", "/api/v1/pods");
  EXPECT_EQ(all.code, 403);
  EXPECT_EQ(all.Json()["message"], "pods is forbidden: " + Denied("list", "pods", "", ""));
  auto nodes = Op("GET", "/api/v1/nodes");
  EXPECT_EQ(nodes.Json()["message"], "nodes is forbidden: " + Denied("list", "nodes", "", ""));

  GrantCluster("all-pods", PolicyRule({""}, {"pods"}, {"list"}));
  EXPECT_EQ(Op("GET", "/api/v1/pods").code, 200);
  EXPECT_EQ(Op("GET", "/api/v1/namespaces/default/pods").code, 200);
  EXPECT_EQ(Op("GET", "/api/v1/nodes").code, 403);
}

TEST_F(RbacServerTest, ARoleBindingToAClusterRoleGrantsInItsNamespaceOnly) {
  json role = Named("ClusterRole", "rbac.authorization.k8s.io/v1", "cm-reader");
  role["rules"] = json::array({PolicyRule({""}, {"configmaps"}, {"get", "list"})});
  Admin("POST", kRbacV1 + "/clusterroles", role);
  json binding = Named("RoleBinding", "rbac.authorization.k8s.io/v1", "cm-reader", "team");
  binding["roleRef"] = {{"kind", "ClusterRole"}, {"name", "cm-reader"}};
  binding["subjects"] = json::array({{{"kind", "ServiceAccount"}, {"name", "op"}}});
  Admin("POST", kRbacV1 + "/namespaces/team/rolebindings", binding);
  EXPECT_EQ(Op("GET", kTeamCms).code, 200) << "subject namespace defaults to the binding's";
  EXPECT_EQ(Op("GET", "/api/v1/namespaces/default/configmaps").code, 403);
  EXPECT_EQ(Op("GET", "/api/v1/configmaps").code, 403);
  json log = server_->Requests()["requests"];
  bool found = false;
  for (const auto& e : log) {
    if (e["user"] == kOp && e["allowed"] == true && e.value("resource", "") == "configmaps") {
      found = true;
      EXPECT_EQ(e["reason"],
                "RBAC: allowed by RoleBinding \"cm-reader/team\" of ClusterRole \"cm-reader\" to "
                "ServiceAccount \"op/team\"");
    }
  }
  EXPECT_TRUE(found);
}

TEST_F(RbacServerTest, ResourceNamesOnlyMatchNamedRequests) {
  const std::string leases = "/apis/coordination.k8s.io/v1/namespaces/team/leases";
  Grant("leader", PolicyRule({"coordination.k8s.io"}, {"leases"},
                             {"get", "list", "watch", "create", "update"}, {"leader"}));
  json lease = Named("Lease", "coordination.k8s.io/v1", "leader");
  auto create = Op("POST", leases, lease.dump());
  EXPECT_EQ(create.code, 403) << "a create has no name to match";
  EXPECT_EQ(create.Json()["message"],
            "leases.coordination.k8s.io is forbidden: " +
                Denied("create", "leases", "coordination.k8s.io", "team"));
  EXPECT_EQ(Op("GET", leases + "/leader").code, 404) << "allowed, not there yet";
  Admin("POST", leases, lease);
  Admin("POST", leases, Named("Lease", "coordination.k8s.io/v1", "other"));
  json got = Op("GET", leases + "/leader").Json();
  EXPECT_EQ(got["metadata"]["name"], "leader");
  EXPECT_EQ(Op("PUT", leases + "/leader", got.dump()).code, 200);
  auto other = Op("GET", leases + "/other");
  EXPECT_EQ(other.code, 403);
  EXPECT_EQ(other.Json()["message"], "leases.coordination.k8s.io \"other\" is forbidden: " +
                                         Denied("get", "leases", "coordination.k8s.io", "team"));
  EXPECT_EQ(other.Json()["details"],
            json({{"name", "other"}, {"group", "coordination.k8s.io"}, {"kind", "leases"}}));
  EXPECT_EQ(Op("GET", leases).code, 403) << "a list names nothing";
  auto one = Op("GET", leases + "?fieldSelector=metadata.name%3Dleader");
  EXPECT_EQ(one.code, 200) << "a list pinned to the name does";
  EXPECT_EQ(one.Json()["items"].size(), 1u);
}

TEST_F(RbacServerTest, SubresourcesNeedTheirOwnRules) {
  json crd = json::parse(R"({
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "trainingjobs.spawnpoint.dev"},
    "spec": {"group": "spawnpoint.dev", "scope": "Namespaced",
      "names": {"kind": "TrainingJob", "plural": "trainingjobs", "singular": "trainingjob"},
      "versions": [{"name": "v1alpha1", "served": true, "storage": true,
        "subresources": {"status": {}},
        "schema": {"openAPIV3Schema": {"type": "object",
          "x-kubernetes-preserve-unknown-fields": true}}}]}})");
  Admin("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd);
  const std::string jobs = "/apis/spawnpoint.dev/v1alpha1/namespaces/team/trainingjobs";
  json job = Named("TrainingJob", "spawnpoint.dev/v1alpha1", "j");
  job["spec"] = {{"nodes", 1}};
  Admin("POST", jobs, job);
  Grant("jobs", PolicyRule({"spawnpoint.dev"}, {"trainingjobs"}, {"get", "update", "patch"}));
  json current = Op("GET", jobs + "/j").Json();
  current["status"] = {{"phase", "Running"}};
  auto status = Op("PUT", jobs + "/j/status", current.dump());
  EXPECT_EQ(status.code, 403);
  EXPECT_EQ(status.Json()["message"],
            "trainingjobs.spawnpoint.dev \"j\" is forbidden: " +
                Denied("update", "trainingjobs/status", "spawnpoint.dev", "team"));
  Grant("jobs-status", PolicyRule({"spawnpoint.dev"}, {"trainingjobs/status"}, {"update"}));
  EXPECT_EQ(Op("PUT", jobs + "/j/status", current.dump()).code, 200);
  EXPECT_EQ(Op("PATCH", jobs + "/j/status", R"({"status":{"phase":"Done"}})",
               "application/merge-patch+json")
                .code,
            403);

  Admin("POST", kTeamPods,
        {{"metadata", {{"name", "p"}}},
         {"spec", {{"containers", {{{"name", "c"}, {"image", "busybox"}}}}}}});
  Grant("pods", PolicyRule({""}, {"pods"}, {"*"}));
  auto log = Op("GET", kTeamPods + "/p/log");
  EXPECT_EQ(log.code, 403);
  EXPECT_THAT(log.Json()["message"].get<std::string>(),
              HasSubstr("cannot get resource \"pods/log\""));
  Grant("all-status", PolicyRule({""}, {"*/status"}, {"patch"}));
  EXPECT_EQ(Op("PATCH", kTeamPods + "/p/status", R"({"status":{"message":"x"}})",
               "application/merge-patch+json")
                .code,
            200);
  Grant("pods-any-sub", PolicyRule({""}, {"pods/*"}, {"get"}));
  EXPECT_EQ(Op("GET", kTeamPods + "/p/log").code, 403) << "there is no resource/* wildcard";
}

TEST_F(RbacServerTest, AWatchIsRefusedBeforeItStreams) {
  auto r = HttpCall(server_->port(), "GET", kTeamCms + "?watch=true", "",
                    {{"Authorization", "Bearer " + token_}}, seconds(5));
  EXPECT_EQ(r.code, 403);
  EXPECT_EQ(r.headers["content-type"], "application/json");
  EXPECT_EQ(r.Json()["message"],
            "configmaps is forbidden: " + Denied("watch", "configmaps", "", "team"));
  auto legacy = Op("GET", "/api/v1/watch/namespaces/team/configmaps");
  EXPECT_EQ(legacy.code, 403);
  json log = server_->Requests()["requests"];
  for (const auto& e : log) {
    if (e["verb"] == "watch") {
      EXPECT_EQ(e["code"], 403);
      EXPECT_EQ(e["allowed"], false);
      EXPECT_EQ(e["user"], kOp);
    }
  }
}

TEST_F(RbacServerTest, TheForbiddenStatusIsTheRealOne) {
  Admin("POST", kTeamCms, {{"metadata", {{"name", "c"}}}});
  auto r = Op("GET", kTeamCms + "/c");
  EXPECT_EQ(r.code, 403);
  EXPECT_EQ(r.Json(), json({{"kind", "Status"},
                            {"apiVersion", "v1"},
                            {"metadata", json::object()},
                            {"status", "Failure"},
                            {"message", "configmaps \"c\" is forbidden: " +
                                            Denied("get", "configmaps", "", "team")},
                            {"reason", "Forbidden"},
                            {"details", {{"name", "c"}, {"kind", "configmaps"}}},
                            {"code", 403}}));
  // A binding to a role that is not there is the reason, as in the real server.
  json binding = Named("RoleBinding", "rbac.authorization.k8s.io/v1", "dangling", "team");
  binding["roleRef"] = {{"kind", "Role"}, {"name", "missing"}};
  binding["subjects"] = json::array({OpSubject()});
  Admin("POST", kRbacV1 + "/namespaces/team/rolebindings", binding);
  EXPECT_EQ(Op("GET", kTeamCms + "/c").Json()["message"],
            "configmaps \"c\" is forbidden: " + Denied("get", "configmaps", "", "team") +
                ": RBAC: role.rbac.authorization.k8s.io \"missing\" not found");
}

TEST_F(RbacServerTest, TokensDieWithTheirServiceAccount) {
  EXPECT_EQ(Op("GET", "/version").code, 200);
  Admin("DELETE", "/api/v1/namespaces/team/serviceaccounts/op");
  EXPECT_EQ(Op("GET", "/version").code, 401);
  Admin("POST", "/api/v1/namespaces/team/serviceaccounts",
        Named("ServiceAccount", "v1", "op", "team"));
  EXPECT_EQ(Op("GET", "/version").code, 401) << "a new ServiceAccount has a new uid";
  auto fresh = server_->ServiceAccountToken("team", "op");
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(server_->CallAs(*fresh, "GET", "/version").code, 200);
  auto missing = server_->ServiceAccountToken("team", "nobody");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(server_->Call("POST", "/testing/serviceaccount-token", "{}").code, 400);
}

TEST_F(RbacServerTest, TokenRequestApi) {
  const std::string url = "/api/v1/namespaces/team/serviceaccounts/op/token";
  json tr = Admin("POST", url,
                  {{"apiVersion", "authentication.k8s.io/v1"},
                   {"kind", "TokenRequest"},
                   {"spec", {{"expirationSeconds", 3600}}}});
  EXPECT_EQ(tr["kind"], "TokenRequest");
  EXPECT_EQ(tr["spec"]["expirationSeconds"], 3600);
  std::string token = tr["status"]["token"];
  EXPECT_FALSE(tr["status"]["expirationTimestamp"].get<std::string>().empty());
  auto whoami = server_->CallAs(token, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                R"({"apiVersion":"authentication.k8s.io/v1",
                                    "kind":"SelfSubjectReview"})");
  EXPECT_EQ(whoami.code, 201) << whoami.body;
  EXPECT_EQ(whoami.Json()["status"]["userInfo"]["username"], kOp);
  EXPECT_EQ(
      whoami.Json()["status"]["userInfo"]["groups"],
      json({"system:serviceaccounts", "system:serviceaccounts:team", "system:authenticated"}));

  auto short_lived =
      server_->CallAs(kAdminToken, "POST", url, R"({"spec":{"expirationSeconds":60}})");
  EXPECT_EQ(short_lived.code, 422);
  EXPECT_EQ(short_lived.Json()["message"],
            "TokenRequest.authentication.k8s.io \"op\" is invalid: spec.expirationSeconds: "
            "Invalid value: 60: may not specify a duration less than 10 minutes");
  EXPECT_EQ(
      server_->CallAs(kAdminToken, "POST", "/api/v1/namespaces/team/serviceaccounts/x/token", "{}")
          .code,
      404);
  auto own = Op("POST", url, "{}");
  EXPECT_EQ(own.code, 403);
  EXPECT_EQ(own.Json()["message"], "serviceaccounts \"op\" is forbidden: " +
                                       Denied("create", "serviceaccounts/token", "", "team"));
}

TEST_F(RbacServerTest, AccessReviews) {
  Grant("pods", PolicyRule({""}, {"pods"}, {"get", "list"}));
  auto ssar = [&](const json& attrs) {
    auto r = Op("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                json{{"apiVersion", "authorization.k8s.io/v1"},
                     {"kind", "SelfSubjectAccessReview"},
                     {"spec", attrs}}
                    .dump());
    EXPECT_EQ(r.code, 201) << r.body;
    return r.Json();
  };
  json yes = ssar(
      {{"resourceAttributes", {{"namespace", "team"}, {"verb", "list"}, {"resource", "pods"}}}});
  EXPECT_EQ(yes["kind"], "SelfSubjectAccessReview");
  EXPECT_EQ(yes["status"]["allowed"], true);
  EXPECT_EQ(yes["status"]["reason"],
            "RBAC: allowed by RoleBinding \"pods/team\" of Role \"pods\" to ServiceAccount "
            "\"op/team\"");
  json no = ssar(
      {{"resourceAttributes", {{"namespace", "team"}, {"verb", "delete"}, {"resource", "pods"}}}});
  EXPECT_EQ(no["status"], json({{"allowed", false}}));
  EXPECT_EQ(ssar({{"nonResourceAttributes",
                   {{"path", "/version"}, {"verb", "get"}}}})["status"]["allowed"],
            true);
  auto invalid =
      Op("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", R"({"spec":{}})");
  EXPECT_EQ(invalid.code, 422);
  EXPECT_THAT(invalid.Json()["message"].get<std::string>(),
              HasSubstr("exactly one of nonResourceAttributes or resourceAttributes"));

  auto rules = Op("POST", "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
                  R"({"spec":{"namespace":"team"}})");
  ASSERT_EQ(rules.code, 201) << rules.body;
  bool pods = false;
  const json rules_status = rules.Json()["status"];
  for (const auto& r : rules_status["resourceRules"]) {
    pods = pods || r["resources"] == json({"pods"});
  }
  EXPECT_TRUE(pods) << rules.body;
  EXPECT_EQ(rules.Json()["status"]["incomplete"], false);

  json sar = {
      {"spec",
       {{"user", kOp},
        {"groups", {"system:serviceaccounts"}},
        {"resourceAttributes", {{"namespace", "team"}, {"verb", "get"}, {"resource", "pods"}}}}}};
  EXPECT_EQ(
      Admin("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", sar)["status"]["allowed"],
      true);
  EXPECT_EQ(Op("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", sar.dump()).code, 403)
      << "reviews of others need a grant";
  json review =
      Admin("POST", "/apis/authentication.k8s.io/v1/tokenreviews", {{"spec", {{"token", token_}}}});
  EXPECT_EQ(review["status"]["authenticated"], true);
  EXPECT_EQ(review["status"]["user"]["username"], kOp);
}

TEST_F(RbacServerTest, Impersonation) {
  auto as_op = HttpCall(server_->port(), "GET", kTeamCms, "", {{"Impersonate-User", kOp}});
  EXPECT_EQ(as_op.code, 403) << "the superuser may impersonate, then is the ServiceAccount";
  EXPECT_EQ(as_op.Json()["message"],
            "configmaps is forbidden: " + Denied("list", "configmaps", "", "team"));
  json binding = Named("RoleBinding", "rbac.authorization.k8s.io/v1", "devs", "team");
  json role = Named("Role", "rbac.authorization.k8s.io/v1", "devs", "team");
  role["rules"] = json::array({PolicyRule({""}, {"configmaps"}, {"list"})});
  Admin("POST", kRbacV1 + "/namespaces/team/roles", role);
  binding["roleRef"] = {{"kind", "Role"}, {"name", "devs"}};
  binding["subjects"] = json::array({{{"kind", "Group"}, {"name", "devs"}}});
  Admin("POST", kRbacV1 + "/namespaces/team/rolebindings", binding);
  auto bob = HttpCall(server_->port(), "GET", kTeamCms, "",
                      {{"Impersonate-User", "bob"},
                       {"Impersonate-Group", "ops"},
                       {"Impersonate-Group", "devs"},
                       {"Authorization", std::string("Bearer ") + kAdminToken}});
  EXPECT_EQ(bob.code, 200) << bob.body;
  json log = server_->Requests()["requests"];
  EXPECT_EQ(log.back()["user"], "bob");

  auto escalate = HttpCall(server_->port(), "GET", kTeamCms, "",
                           {{"Impersonate-User", "bob"}, {"Authorization", "Bearer " + token_}});
  EXPECT_EQ(escalate.code, 403);
  EXPECT_EQ(escalate.Json()["message"],
            "users \"bob\" is forbidden: User \"" + kOp +
                "\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope");
  auto sa = HttpCall(server_->port(), "GET", kTeamCms, "",
                     {{"Impersonate-User", "system:serviceaccount:kube-system:x"},
                      {"Authorization", "Bearer " + token_}});
  EXPECT_EQ(sa.Json()["message"], "serviceaccounts \"x\" is forbidden: User \"" + kOp +
                                      "\" cannot impersonate resource \"serviceaccounts\" in API "
                                      "group \"\" in the namespace \"kube-system\"");
}

TEST(AuthorizationFlagsTest, BadValuesAreOneLineErrors) {
  spawnpoint::testing::TestProcess p({KUBE_TEST_SERVER_BIN, "--authorization", "abac"});
  EXPECT_EQ(p.Wait(seconds(10)), 2);
  EXPECT_EQ(p.Stderr(),
            "kube-test-server: --authorization: \"abac\" is not one of always-allow, rbac\n");
  spawnpoint::testing::TestProcess q({KUBE_TEST_SERVER_BIN, "--no-token", "maybe"});
  EXPECT_EQ(q.Wait(seconds(10)), 2);
}

TEST(AlwaysAllowTest, AnyTokenIsServedAndLogged) {
  KubeTestServer server;
  ASSERT_TRUE(server.ok()) << server.error();
  EXPECT_EQ(server.CallAs("garbage", "GET", "/api/v1/nodes").code, 200);
  EXPECT_EQ(server.CallAs(kAdminToken, "GET", "/api/v1/nodes").code, 200);
  EXPECT_EQ(server.Call("GET", "/api/v1/nodes").code, 200);
  json log = server.Requests()["requests"];
  ASSERT_EQ(log.size(), 3u);
  EXPECT_EQ(log[0]["user"], "system:anonymous");
  EXPECT_EQ(log[1]["user"], "kubernetes-admin");
  EXPECT_EQ(log[2]["user"], "system:unsecured");
  for (const auto& e : log) EXPECT_EQ(e["allowed"], true);
  EXPECT_EQ(server.Call("GET", "/testing/info").Json()["authorization"], "always-allow");
  EXPECT_EQ(
      server.Call("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles").Json()["items"].size(),
      0u)
      << "no default roles unless RBAC is on";
}

}  // namespace
}  // namespace spawnpoint::kubetest::testing
