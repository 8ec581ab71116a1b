// The Helm chart (charts/spawnpoint) as the real helm 3 and helm 4 (.tools/bin/helm3, helm4;
// scripts/install-tools.sh) render it with `helm template`: default values, every optional
// part on, the overrides users reach for, and wrong values refused with each helm's own
// schema messages. Installing, upgrading and uninstalling it on the real control plane, with
// the operator under the installed RBAC, is tests/cluster/test_helm_on_real_server.py.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "api/yaml_to_json.h"
#include "tests/support/test_process.h"

namespace spawnpoint::chart_test {
namespace {

using spawnpoint::testing::ReadFile;
using std::chrono::seconds;
using ::testing::HasSubstr;

constexpr const char* kNamespace = "spawnpoint-system";
constexpr const char* kRelease = "spawnpoint";

using json = nlohmann::json;
using spawnpoint::testing::TestProcess;

struct Rendered {
  int code = -1;
  std::string out;
  std::string err;
  std::vector<json> docs;
};

// helm's home, cache and configuration in the test's temporary directory.
std::map<std::string, std::string> HelmEnv() {
  const std::string home = ::testing::TempDir() + "/helm-home";
  return {{"HOME", home},
          {"HELM_CACHE_HOME", home + "/cache"},
          {"HELM_CONFIG_HOME", home + "/config"},
          {"HELM_DATA_HOME", home + "/data"}};
}

// `helm template spawnpoint charts/spawnpoint -n spawnpoint-system --include-crds ARGS` with
// `helm` (helm3 or helm4 in the tools folder).
Rendered RenderWith(const std::string& helm, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {std::string(TOOLS_BIN) + "/" + helm,
                                   "template",
                                   kRelease,
                                   CHART_DIR,
                                   "--namespace",
                                   kNamespace,
                                   "--include-crds"};
  argv.insert(argv.end(), args.begin(), args.end());
  TestProcess p(argv, HelmEnv());
  Rendered r;
  r.code = p.Wait(seconds(120));
  r.out = p.Stdout();
  r.err = p.Stderr();
  if (r.code != 0) return r;
  auto docs = api::ParseYamlStream(r.out, "rendered chart");
  if (!docs.ok()) {
    ADD_FAILURE() << docs.status().ToString();
    return r;
  }
  for (auto& d : *docs) {
    if (!d.value.is_null()) r.docs.push_back(std::move(d.value));
  }
  return r;
}

// Each rendering test runs with helm 3 and with helm 4.
class ChartTest : public ::testing::TestWithParam<std::string> {
 protected:
  Rendered Render(const std::vector<std::string>& args) { return RenderWith(GetParam(), args); }
  bool Helm4() const { return GetParam() == "helm4"; }
};

INSTANTIATE_TEST_SUITE_P(Helm, ChartTest, ::testing::Values("helm3", "helm4"),
                         [](const auto& info) { return info.param; });

std::vector<json> OfKind(const Rendered& r, const std::string& kind) {
  std::vector<json> out;
  for (const auto& d : r.docs) {
    if (d.value("kind", "") == kind) out.push_back(d);
  }
  return out;
}

json One(const Rendered& r, const std::string& kind) {
  auto all = OfKind(r, kind);
  EXPECT_EQ(all.size(), 1u) << "expected one " << kind;
  return all.empty() ? json() : all[0];
}

// The documents of `kind` labelled app.kubernetes.io/component `component`: the operator's
// ("operator") apart from the status watchdog's ("status-watchdog"), which has a Deployment,
// ServiceAccount and bindings of its own (tests/helm/status_watchdog_test.py).
std::vector<json> OfComponent(const Rendered& r, const std::string& kind,
                              const std::string& component) {
  std::vector<json> out;
  for (const auto& d : OfKind(r, kind)) {
    const json labels = d["metadata"].value("labels", json::object());
    if (labels.value("app.kubernetes.io/component", "") == component) out.push_back(d);
  }
  return out;
}

json Operator(const Rendered& r, const std::string& kind) {
  auto all = OfComponent(r, kind, "operator");
  EXPECT_EQ(all.size(), 1u) << "expected one " << kind << " of the operator";
  return all.empty() ? json() : all[0];
}

std::vector<std::string> Args(const json& deployment) {
  return deployment["spec"]["template"]["spec"]["containers"][0]["args"]
      .get<std::vector<std::string>>();
}

bool HasArg(const std::vector<std::string>& args, const std::string& arg) {
  return std::find(args.begin(), args.end(), arg) != args.end();
}

TEST(ChartCrdTest, CrdInTheChartIsByteIdenticalToTheTopLevelCrd) {
  const std::string top = ReadFile(SOURCE_DIR "/crds/trainingjob.yaml");
  const std::string chart = ReadFile(CHART_DIR "/crds/trainingjob.yaml");
  ASSERT_FALSE(top.empty());
  EXPECT_TRUE(top == chart)
      << "charts/spawnpoint/crds/trainingjob.yaml differs from crds/trainingjob.yaml: run "
         "`make sync-chart-crds` (cp crds/trainingjob.yaml charts/spawnpoint/crds/)";
}

TEST_P(ChartTest, DefaultValuesRenderALeastPrivilegeOperator) {
  Rendered r = Render({});
  ASSERT_EQ(r.code, 0) << r.err;
  // The chart's own objects carry the standard labels (the CRD comes verbatim from crds/).
  for (const auto& d : r.docs) {
    if (d["kind"] == "CustomResourceDefinition") continue;
    const json labels = d["metadata"].value("labels", json::object());
    for (const char* key :
         {"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
          "app.kubernetes.io/managed-by", "helm.sh/chart"}) {
      EXPECT_TRUE(labels.contains(key)) << d["kind"] << " " << d["metadata"]["name"] << ": " << key;
    }
    EXPECT_EQ(labels.value("app.kubernetes.io/managed-by", ""), "Helm");
  }
  EXPECT_EQ(OfKind(r, "CustomResourceDefinition").size(), 1u);
  EXPECT_TRUE(OfKind(r, "ServiceMonitor").empty());
  EXPECT_TRUE(OfKind(r, "PodMonitor").empty());
  EXPECT_TRUE(OfKind(r, "PrometheusRule").empty()) << "the alerts are optional";
  EXPECT_TRUE(OfKind(r, "ConfigMap").empty()) << "the dashboard is optional";

  const json deployment = Operator(r, "Deployment");
  ASSERT_TRUE(deployment.is_object());
  EXPECT_EQ(deployment["metadata"]["namespace"], kNamespace);
  EXPECT_EQ(deployment["spec"]["replicas"], 1);
  const json pod = deployment["spec"]["template"]["spec"];
  const json container = pod["containers"][0];
  const json sc = container["securityContext"];
  EXPECT_EQ(sc["readOnlyRootFilesystem"], true);
  EXPECT_EQ(sc["allowPrivilegeEscalation"], false);
  EXPECT_EQ(sc["capabilities"]["drop"], json::array({"ALL"}));
  EXPECT_EQ(sc.value("privileged", false), false);
  const json psc = pod.value("securityContext", json::object());
  EXPECT_TRUE(sc.value("runAsNonRoot", false) || psc.value("runAsNonRoot", false));
  EXPECT_NE(sc.value("runAsUser", psc.value("runAsUser", 0)), 0);
  EXPECT_EQ(container["livenessProbe"]["httpGet"]["path"], "/healthz");
  EXPECT_EQ(container["readinessProbe"]["httpGet"]["path"], "/readyz");
  const auto args = Args(deployment);
  // On with one replica too: a rolling upgrade then never has two operators acting.
  EXPECT_TRUE(HasArg(args, "--leader-elect"));
  EXPECT_EQ(deployment["spec"]["strategy"]["type"], "RollingUpdate");
  EXPECT_TRUE(HasArg(args, "--agent-image=ghcr.io/spawnpoint/agent:0.1.0") ||
              HasArg(args, "--agent-image=ghcr.io/spawnpoint/agent:v0.1.0"))
      << ::testing::PrintToString(args);
  EXPECT_EQ(pod["serviceAccountName"], Operator(r, "ServiceAccount")["metadata"]["name"]);

  // The metrics Service selects the operator's pods and exposes the metrics port.
  const json service = One(r, "Service");
  for (const auto& [k, v] : service["spec"]["selector"].items()) {
    EXPECT_EQ(deployment["spec"]["template"]["metadata"]["labels"].value(k, ""), v) << k;
  }
  EXPECT_EQ(service["spec"]["ports"][0]["name"], "metrics");

  // Cluster scope by default: the operator's ClusterRole never grants configmaps, nodes or
  // wildcards, and of secrets only create (the gang tokens of in-place jobs), in a rule of
  // their own: no secret is readable.
  int secret_rules = 0;
  for (const auto& role : OfKind(r, "ClusterRole")) {
    for (const auto& rule : role.value("rules", json::array())) {
      for (const auto& res : rule.value("resources", json::array())) {
        EXPECT_NE(res, "*") << role["metadata"]["name"];
        if (res != "secrets") continue;
        ++secret_rules;
        EXPECT_EQ(rule["resources"], json::array({"secrets"})) << role["metadata"]["name"];
        EXPECT_EQ(rule["verbs"], json::array({"create"})) << role["metadata"]["name"];
      }
      for (const auto& verb : rule.value("verbs", json::array())) {
        EXPECT_NE(verb, "*") << role["metadata"]["name"];
      }
    }
  }
  EXPECT_EQ(secret_rules, 1);
  EXPECT_EQ(OfComponent(r, "ClusterRoleBinding", "operator").size(), 1u);
}

TEST_P(ChartTest, EveryOptionalPartOn) {
  Rendered r = Render({"--values", CHART_DIR "/ci/all-on-values.yaml", "--api-versions",
                       "monitoring.coreos.com/v1"});
  ASSERT_EQ(r.code, 0) << r.err;
  const json deployment = Operator(r, "Deployment");
  ASSERT_TRUE(deployment.is_object());
  EXPECT_EQ(deployment["spec"]["replicas"], 2);
  const auto args = Args(deployment);
  EXPECT_TRUE(HasArg(args, "--leader-elect")) << "two replicas elect a leader";
  EXPECT_TRUE(HasArg(args, std::string("--leader-elect-namespace=") + kNamespace));
  EXPECT_TRUE(HasArg(args, "--namespace=ml"));
  EXPECT_TRUE(HasArg(args, "--resync-period=10m"));
  const json pod = deployment["spec"]["template"]["spec"];
  EXPECT_EQ(pod["imagePullSecrets"], json::array({{{"name", "regcred"}}}));
  EXPECT_EQ(pod["nodeSelector"]["kubernetes.io/os"], "linux");
  EXPECT_EQ(pod["tolerations"][0]["key"], "dedicated");
  EXPECT_TRUE(pod["affinity"].contains("podAntiAffinity"));
  EXPECT_EQ(pod["priorityClassName"], "system-cluster-critical");

  const json sm = One(r, "ServiceMonitor");
  ASSERT_TRUE(sm.is_object());
  EXPECT_EQ(sm["apiVersion"], "monitoring.coreos.com/v1");
  EXPECT_EQ(sm["spec"]["endpoints"][0]["honorLabels"], true);
  EXPECT_EQ(sm["spec"]["endpoints"][0]["port"], "metrics");
  const json pm = One(r, "PodMonitor");
  ASSERT_TRUE(pm.is_object());
  // The agents run in tenants' pods: their series' namespace and job come from the pod
  // (tests/helm/isolation_test.py runs the relabelings in a real Prometheus).
  EXPECT_FALSE(pm["spec"]["podMetricsEndpoints"][0].contains("honorLabels"));
  EXPECT_EQ(pm["spec"]["podMetricsEndpoints"][0]["port"], "agent-status");
  EXPECT_EQ(pm["metadata"]["labels"]["release"], "kube-prometheus-stack");
  // The alerts, run by promtool in tests/helm/alerts_test.py.
  const json rule = One(r, "PrometheusRule");
  ASSERT_TRUE(rule.is_object());
  EXPECT_EQ(rule["metadata"]["labels"]["release"], "kube-prometheus-stack");
  EXPECT_EQ(rule["spec"]["groups"][0]["rules"].size(), 5u);

  const json dashboard = One(r, "ConfigMap");
  ASSERT_TRUE(dashboard.is_object());
  EXPECT_EQ(dashboard["metadata"]["namespace"], "monitoring");
  EXPECT_EQ(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
  ASSERT_EQ(dashboard["data"].size(), 1u);
  EXPECT_EQ(json::parse(dashboard["data"].begin().value().get<std::string>()),
            json::parse(ReadFile(CHART_DIR "/dashboards/spawnpoint.json")));

  // Leader election's Lease lives in the release namespace, granted there only.
  bool lease_role = false;
  for (const auto& role : OfKind(r, "Role")) {
    for (const auto& rule : role.value("rules", json::array())) {
      if (rule.value("resources", json::array()).dump().find("leases") != std::string::npos) {
        lease_role = true;
        EXPECT_EQ(role["metadata"]["namespace"], kNamespace);
      }
    }
  }
  EXPECT_TRUE(lease_role);
}

TEST_P(ChartTest, FullnameOverrideNamesEveryObject) {
  Rendered r = Render({"--set", "fullnameOverride=sp"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(Operator(r, "Deployment")["metadata"]["name"], "sp");
  EXPECT_EQ(Operator(r, "ServiceAccount")["metadata"]["name"], "sp");
  for (const char* kind : {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"}) {
    const auto watchdog = OfComponent(r, kind, "status-watchdog");
    ASSERT_EQ(watchdog.size(), 1u) << kind;
    EXPECT_EQ(watchdog[0]["metadata"]["name"], "sp-status-watchdog") << kind;
  }
}

TEST_P(ChartTest, ADigestPinnedImageKeepsValidLabels) {
  Rendered r = Render({"--set", "image.tag=0.1.0@sha256:0123abcd"});
  ASSERT_EQ(r.code, 0) << r.err;
  const json deployment = Operator(r, "Deployment");
  EXPECT_EQ(deployment["spec"]["template"]["spec"]["containers"][0]["image"],
            "ghcr.io/spawnpoint/operator:0.1.0@sha256:0123abcd");
  EXPECT_EQ(deployment["metadata"]["labels"]["app.kubernetes.io/version"], "0.1.0")
      << "a label value cannot hold '@' or ':'";
}

TEST_P(ChartTest, MonitorsNeedThePrometheusOperator) {
  Rendered r = Render({"--set", "metrics.serviceMonitor.enabled=true"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("metrics.serviceMonitor.enabled is true but this cluster does not "
                               "serve monitoring.coreos.com/v1"));
  Rendered with = Render({"--set", "agentMetrics.podMonitor.enabled=true", "--api-versions",
                          "monitoring.coreos.com/v1"});
  EXPECT_EQ(with.code, 0) << with.err;
  EXPECT_EQ(OfKind(with, "PodMonitor").size(), 1u);
}

TEST_P(ChartTest, NeverBindsTheOperatorsRulesToTheDefaultServiceAccount) {
  Rendered r = Render({"--set", "serviceAccount.create=false"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("serviceAccount.name is empty"));
  Rendered named =
      Render({"--set", "serviceAccount.create=false", "--set", "serviceAccount.name=ops"});
  ASSERT_EQ(named.code, 0) << named.err;
  EXPECT_TRUE(OfComponent(named, "ServiceAccount", "operator").empty());
  EXPECT_EQ(Operator(named, "ClusterRoleBinding")["subjects"][0]["name"], "ops");
}

// Volcano PodGroups (issue 40): create and delete, in a rule of their own, only when asked.
TEST_P(ChartTest, PodGroupRulesOnlyWithVolcano) {
  auto podgroup_rules = [](const Rendered& r, const char* kind) {
    std::vector<json> out;
    for (const auto& role : OfKind(r, kind)) {
      for (const auto& rule : role.value("rules", json::array())) {
        if (rule.value("resources", json::array()).dump().find("podgroups") != std::string::npos) {
          out.push_back(rule);
        }
      }
    }
    return out;
  };
  Rendered off = Render({});
  ASSERT_EQ(off.code, 0) << off.err;
  EXPECT_TRUE(podgroup_rules(off, "ClusterRole").empty());
  for (const auto& [values, kind] : {std::pair<std::vector<std::string>, const char*>{
                                         {"--set", "scheduling.volcano=true"}, "ClusterRole"},
                                     {{"--values", CHART_DIR "/ci/namespace-scope-values.yaml",
                                       "--set", "scheduling.volcano=true"},
                                      "Role"}}) {
    Rendered on = Render(values);
    ASSERT_EQ(on.code, 0) << on.err;
    const std::vector<json> rules = podgroup_rules(on, kind);
    ASSERT_EQ(rules.size(), 1u) << kind;
    EXPECT_EQ(rules[0]["apiGroups"], json::array({"scheduling.volcano.sh"}));
    EXPECT_EQ(rules[0]["resources"], json::array({"podgroups"}));
    EXPECT_EQ(rules[0]["verbs"], json::array({"create", "delete"}));
  }
}

// Kueue (issue 40): patch on pods and get on Workloads, only when asked; nothing else gains a
// verb.
TEST_P(ChartTest, KueueRulesOnlyWithKueue) {
  auto verbs_of = [](const Rendered& r, const char* kind) {
    std::map<std::string, std::set<std::string>> out;  // "group/resource" -> verbs
    for (const auto& role : OfKind(r, kind)) {
      for (const auto& rule : role.value("rules", json::array())) {
        for (const auto& g : rule.value("apiGroups", json::array())) {
          for (const auto& res : rule.value("resources", json::array())) {
            for (const auto& v : rule.value("verbs", json::array())) {
              out[g.get<std::string>() + "/" + res.get<std::string>()].insert(v);
            }
          }
        }
      }
    }
    return out;
  };
  Rendered off = Render({});
  ASSERT_EQ(off.code, 0) << off.err;
  auto before = verbs_of(off, "ClusterRole");
  EXPECT_FALSE(before["/pods"].count("patch"));
  EXPECT_FALSE(before.count("kueue.x-k8s.io/workloads"));
  for (const auto& [values, kind] : {std::pair<std::vector<std::string>, const char*>{
                                         {"--set", "scheduling.kueue=true"}, "ClusterRole"},
                                     {{"--values", CHART_DIR "/ci/namespace-scope-values.yaml",
                                       "--set", "scheduling.kueue=true"},
                                      "Role"}}) {
    Rendered on = Render(values);
    ASSERT_EQ(on.code, 0) << on.err;
    auto after = verbs_of(on, kind);
    EXPECT_EQ(after["kueue.x-k8s.io/workloads"], std::set<std::string>{"get"}) << kind;
    EXPECT_TRUE(after["/pods"].count("patch")) << kind;
    // Nothing else changed: the same verbs on everything but those two.
    after["/pods"].erase("patch");
    after.erase("kueue.x-k8s.io/workloads");
    Rendered plain = Render(
        std::string(kind) == "Role"
            ? std::vector<std::string>{"--values", CHART_DIR "/ci/namespace-scope-values.yaml"}
            : std::vector<std::string>{});
    EXPECT_EQ(after, verbs_of(plain, kind)) << kind;
  }
}

TEST_P(ChartTest, NamespaceScopeCreatesNoClusterScopedObjectsButTheCrd) {
  Rendered r = Render({"--values", CHART_DIR "/ci/namespace-scope-values.yaml", "--set",
                       "rbac.aggregateToDefaultRoles=true"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(OfKind(r, "ClusterRole").empty());
  EXPECT_TRUE(OfKind(r, "ClusterRoleBinding").empty());
  EXPECT_TRUE(OfKind(r, "ValidatingAdmissionPolicy").empty());
  EXPECT_TRUE(OfKind(r, "ValidatingAdmissionPolicyBinding").empty());
  for (const auto& role : OfKind(r, "Role")) {
    const std::string ns = role["metadata"]["namespace"];
    EXPECT_TRUE(ns == "ml" || ns == kNamespace) << ns;
  }
  EXPECT_TRUE(HasArg(Args(Operator(r, "Deployment")), "--namespace=ml"));
}

// The operator's rules of a Role or ClusterRole, as "group/resource verb" strings.
std::set<std::string> RulesOf(const json& role) {
  std::set<std::string> out;
  for (const auto& rule : role.value("rules", json::array())) {
    for (const auto& g : rule.value("apiGroups", json::array())) {
      for (const auto& res : rule.value("resources", json::array())) {
        for (const auto& v : rule.value("verbs", json::array())) {
          out.insert(g.get<std::string>() + "/" + res.get<std::string>() + " " +
                     v.get<std::string>());
        }
      }
    }
  }
  return out;
}

// watchNamespaces (issue 41): with namespace scope a Role and RoleBinding in each listed
// namespace, each with the rules a one-namespace install and the cluster-scope ClusterRole
// have, and no cluster-scoped object but the CRD (the aggregate ClusterRoles are cluster
// scope only); the operator is told the list.
TEST_P(ChartTest, NamespaceScopeGivesARoleInEachWatchedNamespace) {
  Rendered r = Render({"--set", "rbac.scope=namespace", "--set", "watchNamespaces={team-a,team-b}",
                       "--set", "rbac.aggregateToDefaultRoles=true"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(OfKind(r, "ClusterRole").empty());
  EXPECT_TRUE(OfKind(r, "ClusterRoleBinding").empty());
  EXPECT_TRUE(OfKind(r, "ValidatingAdmissionPolicy").empty());
  std::map<std::string, json> roles, bindings;  // by namespace, the operator's only
  for (const auto& role : OfKind(r, "Role")) {
    if (role["metadata"]["name"] == kRelease) roles[role["metadata"]["namespace"]] = role;
  }
  for (const auto& binding : OfKind(r, "RoleBinding")) {
    if (binding["metadata"]["name"] == kRelease) {
      bindings[binding["metadata"]["namespace"]] = binding;
    }
  }
  ASSERT_EQ(roles.size(), 2u);
  ASSERT_EQ(bindings.size(), 2u);
  Rendered one = Render({"--values", CHART_DIR "/ci/namespace-scope-values.yaml"});
  ASSERT_EQ(one.code, 0) << one.err;
  json one_role;
  for (const auto& role : OfKind(one, "Role")) {
    if (role["metadata"]["name"] == kRelease) one_role = role;
  }
  ASSERT_TRUE(one_role.is_object());
  Rendered cluster = Render({});
  ASSERT_EQ(cluster.code, 0) << cluster.err;
  json cluster_role;
  for (const auto& role : OfKind(cluster, "ClusterRole")) {
    if (role["metadata"]["name"] == kRelease) cluster_role = role;
  }
  for (const char* ns : {"team-a", "team-b"}) {
    ASSERT_TRUE(roles.count(ns)) << ns;
    EXPECT_EQ(RulesOf(roles[ns]), RulesOf(one_role)) << ns;
    EXPECT_EQ(RulesOf(roles[ns]), RulesOf(cluster_role)) << ns;
    ASSERT_TRUE(bindings.count(ns)) << ns;
    const json& binding = bindings[ns];
    EXPECT_EQ(
        binding["roleRef"],
        json({{"apiGroup", "rbac.authorization.k8s.io"}, {"kind", "Role"}, {"name", kRelease}}))
        << ns;
    EXPECT_EQ(
        binding["subjects"],
        json::array({{{"kind", "ServiceAccount"}, {"name", kRelease}, {"namespace", kNamespace}}}))
        << ns;
  }
  const auto args = Args(Operator(r, "Deployment"));
  EXPECT_TRUE(HasArg(args, "--namespace=team-a,team-b"));
  EXPECT_TRUE(HasArg(args, std::string("--leader-elect-namespace=") + kNamespace))
      << "the Lease stays in the release namespace";
  std::set<std::string> policies;
  for (const auto& p : OfKind(r, "NetworkPolicy")) policies.insert(p["metadata"]["namespace"]);
  EXPECT_EQ(policies, (std::set<std::string>{"team-a", "team-b"}));
}

// Cluster scope with a list: one ClusterRole and binding, the operator told the list; the one
// namespace shorthand still works; both at once is refused.
TEST_P(ChartTest, WatchNamespacesInClusterScopeAndTheShorthand) {
  Rendered r = Render({"--set", "watchNamespaces={team-a,team-b}", "--set",
                       "agentMetrics.podMonitor.enabled=true", "--api-versions",
                       "monitoring.coreos.com/v1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(OfComponent(r, "ClusterRoleBinding", "operator").size(), 1u);
  EXPECT_TRUE(HasArg(Args(Operator(r, "Deployment")), "--namespace=team-a,team-b"));
  EXPECT_EQ(One(r, "PodMonitor")["spec"]["namespaceSelector"],
            json({{"matchNames", {"team-a", "team-b"}}}));

  Rendered shorthand = Render({"--set", "watchNamespace=ml"});
  ASSERT_EQ(shorthand.code, 0) << shorthand.err;
  EXPECT_TRUE(HasArg(Args(Operator(shorthand, "Deployment")), "--namespace=ml"));
  Rendered all = Render({});
  ASSERT_EQ(all.code, 0) << all.err;
  for (const auto& arg : Args(Operator(all, "Deployment"))) {
    EXPECT_NE(arg.rfind("--namespace", 0), 0u) << "every namespace: no --namespace, got " << arg;
  }

  Rendered both = Render({"--set", "watchNamespace=ml", "--set", "watchNamespaces={team-a}"});
  EXPECT_EQ(both.code, 1);
  EXPECT_THAT(both.err, HasSubstr("watchNamespace (\"ml\") and watchNamespaces ([team-a]) are "
                                  "both set: give the namespaces in watchNamespaces only"));
  Rendered bad = Render({"--set", "watchNamespaces={team-a,Team_B}"});
  EXPECT_EQ(bad.code, 1);
  EXPECT_THAT(bad.err, HasSubstr(Helm4() ? "at '/watchNamespaces/1': 'Team_B' does not match"
                                         : "watchNamespaces.1: Does not match pattern"));
}

TEST_P(ChartTest, SchemaRejectsWrongValuesWithHelmsMessages) {
  // helm 3 checks values with gojsonschema, helm 4 with santhosh-tekuri/jsonschema: the same
  // refusals in each one's words.
  Rendered wrong_type = Render({"--set", "replicaCount=two"});
  EXPECT_EQ(wrong_type.code, 1);
  EXPECT_THAT(wrong_type.err, HasSubstr("values don't meet the specifications of the schema"));
  EXPECT_THAT(wrong_type.err,
              HasSubstr(Helm4() ? "at '/replicaCount': got string, want integer"
                                : "replicaCount: Invalid type. Expected: integer, given: string"));
  EXPECT_EQ(wrong_type.out, "") << "nothing is rendered from invalid values";

  Rendered bad_enum = Render({"--set", "rbac.scope=everywhere"});
  EXPECT_EQ(bad_enum.code, 1);
  EXPECT_THAT(bad_enum.err,
              HasSubstr(Helm4() ? "at '/rbac/scope': value must be one of 'cluster', 'namespace'"
                                : "rbac.scope: rbac.scope must be one of the following: "
                                  "\"cluster\", \"namespace\""));

  Rendered typo = Render({"--set", "replicaCont=2"});
  EXPECT_EQ(typo.code, 1);
  EXPECT_THAT(typo.err, HasSubstr(Helm4() ? "additional properties 'replicaCont' not allowed"
                                          : "Additional property replicaCont is not allowed"));

  // The chart's own check (templates/rbac.yaml), the same in both.
  Rendered no_namespace = Render({"--set", "rbac.scope=namespace"});
  EXPECT_EQ(no_namespace.code, 1);
  EXPECT_THAT(no_namespace.err,
              HasSubstr("rbac.scope=namespace gives the operator a Role in each watched "
                        "namespace only: list them (--set 'watchNamespaces={team-a,team-b}'"));
}

TEST_P(ChartTest, LintStrictPassesForEveryValuesFileInCi) {
  for (const std::string values :
       {"", CHART_DIR "/ci/all-on-values.yaml", CHART_DIR "/ci/namespace-scope-values.yaml"}) {
    std::vector<std::string> argv = {std::string(TOOLS_BIN) + "/" + GetParam(), "lint", "--strict",
                                     CHART_DIR};
    if (!values.empty()) {
      argv.push_back("--values");
      argv.push_back(values);
    }
    TestProcess p(argv, HelmEnv());
    EXPECT_EQ(p.Wait(seconds(120)), 0) << values << "\n" << p.Stdout() << p.Stderr();
    EXPECT_THAT(p.Stdout(), HasSubstr("1 chart(s) linted, 0 chart(s) failed")) << values;
  }
}

}  // namespace
}  // namespace spawnpoint::chart_test
