// The Helm chart (charts/spawnpoint), rendered by spawnpoint-chart-render the way `helm
// template` renders it: with default values and with every optional part on; its schema
// refusing wrong values with Helm's messages; every rendered document applied with the real
// kubectl to kube-test-server; and the operator, started with the Deployment's own arguments
// and only the rendered ServiceAccount's token, reconciling jobs while the server enforces
// the rendered RBAC rules (so a missing verb fails here, not in a user's cluster).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "api/yaml_to_json.h"
#include "tests/apiserver/rbac.h"
#include "tests/operator/harness.h"
#include "tests/support/test_process.h"

namespace spawnpoint::op::testing {
namespace {

using spawnpoint::testing::ReadFile;
using spawnpoint::testing::WriteFile;
using std::chrono::seconds;
using ::testing::HasSubstr;

constexpr const char* kNamespace = "spawnpoint-system";
constexpr const char* kRelease = "spawnpoint";

struct Rendered {
  int code = -1;
  std::string out;
  std::string err;
  std::vector<json> docs;
};

// Renders the chart as `helm template spawnpoint charts/spawnpoint -n spawnpoint-system
// --include-crds ARGS` would.
Rendered Render(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {RENDERER_BIN, "--namespace", kNamespace, "--include-crds"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back(kRelease);
  argv.push_back(CHART_DIR);
  TestProcess p(argv);
  Rendered r;
  r.code = p.Wait(seconds(60));
  r.out = p.Stdout();
  r.err = p.Stderr();
  if (r.code != 0) return r;
  // With --notes the rendered NOTES.txt follows the manifests.
  auto docs = api::ParseYamlStream(r.out.substr(0, r.out.find("\nNOTES:\n")), "rendered chart");
  if (!docs.ok()) {
    ADD_FAILURE() << docs.status().ToString();
    return r;
  }
  for (auto& d : *docs) {
    if (!d.value.is_null()) r.docs.push_back(std::move(d.value));
  }
  return r;
}

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

std::vector<std::string> Args(const json& deployment) {
  return deployment["spec"]["template"]["spec"]["containers"][0]["args"]
      .get<std::vector<std::string>>();
}

bool HasArg(const std::vector<std::string>& args, const std::string& arg) {
  return std::find(args.begin(), args.end(), arg) != args.end();
}

TEST(ChartTest, CrdInTheChartIsByteIdenticalToTheTopLevelCrd) {
  const std::string top = ReadFile(SOURCE_DIR "/crds/trainingjob.yaml");
  const std::string chart = ReadFile(CHART_DIR "/crds/trainingjob.yaml");
  ASSERT_FALSE(top.empty());
  EXPECT_TRUE(top == chart)
      << "charts/spawnpoint/crds/trainingjob.yaml differs from crds/trainingjob.yaml: run "
         "`make sync-chart-crds` (cp crds/trainingjob.yaml charts/spawnpoint/crds/)";
}

TEST(ChartTest, DefaultValuesRenderALeastPrivilegeOperator) {
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
  EXPECT_TRUE(OfKind(r, "ConfigMap").empty()) << "the dashboard is optional";

  const json deployment = One(r, "Deployment");
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
  EXPECT_EQ(pod["serviceAccountName"], One(r, "ServiceAccount")["metadata"]["name"]);

  // The metrics Service selects the operator's pods and exposes the metrics port.
  const json service = One(r, "Service");
  for (const auto& [k, v] : service["spec"]["selector"].items()) {
    EXPECT_EQ(deployment["spec"]["template"]["metadata"]["labels"].value(k, ""), v) << k;
  }
  EXPECT_EQ(service["spec"]["ports"][0]["name"], "metrics");

  // Cluster scope by default: the operator's ClusterRole never grants secrets, configmaps,
  // nodes or wildcards.
  for (const auto& role : OfKind(r, "ClusterRole")) {
    for (const auto& rule : role.value("rules", json::array())) {
      for (const auto& res : rule.value("resources", json::array())) {
        EXPECT_NE(res, "*") << role["metadata"]["name"];
        EXPECT_NE(res, "secrets") << role["metadata"]["name"];
      }
      for (const auto& verb : rule.value("verbs", json::array())) {
        EXPECT_NE(verb, "*") << role["metadata"]["name"];
      }
    }
  }
  EXPECT_EQ(OfKind(r, "ClusterRoleBinding").size(), 1u);
}

TEST(ChartTest, EveryOptionalPartOn) {
  Rendered r = Render({"--values", CHART_DIR "/ci/all-on-values.yaml", "--api-versions",
                       "monitoring.coreos.com/v1"});
  ASSERT_EQ(r.code, 0) << r.err;
  const json deployment = One(r, "Deployment");
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
  EXPECT_EQ(pm["spec"]["podMetricsEndpoints"][0]["honorLabels"], true);
  EXPECT_EQ(pm["spec"]["podMetricsEndpoints"][0]["port"], "agent-status");
  EXPECT_EQ(pm["metadata"]["labels"]["release"], "kube-prometheus-stack");

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

TEST(ChartTest, FullnameOverrideNamesEveryObject) {
  Rendered r = Render({"--set", "fullnameOverride=sp"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(One(r, "Deployment")["metadata"]["name"], "sp");
  EXPECT_EQ(One(r, "ServiceAccount")["metadata"]["name"], "sp");
}

TEST(ChartTest, ADigestPinnedImageKeepsValidLabels) {
  Rendered r = Render({"--set", "image.tag=0.1.0@sha256:0123abcd"});
  ASSERT_EQ(r.code, 0) << r.err;
  const json deployment = One(r, "Deployment");
  EXPECT_EQ(deployment["spec"]["template"]["spec"]["containers"][0]["image"],
            "ghcr.io/spawnpoint/operator:0.1.0@sha256:0123abcd");
  EXPECT_EQ(deployment["metadata"]["labels"]["app.kubernetes.io/version"], "0.1.0")
      << "a label value cannot hold '@' or ':'";
}

TEST(ChartTest, MonitorsNeedThePrometheusOperator) {
  Rendered r = Render({"--set", "metrics.serviceMonitor.enabled=true"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("metrics.serviceMonitor.enabled is true but this cluster does not "
                               "serve monitoring.coreos.com/v1"));
  Rendered with = Render({"--set", "agentMetrics.podMonitor.enabled=true", "--api-versions",
                          "monitoring.coreos.com/v1"});
  EXPECT_EQ(with.code, 0) << with.err;
  EXPECT_EQ(OfKind(with, "PodMonitor").size(), 1u);
}

TEST(ChartTest, NeverBindsTheOperatorsRulesToTheDefaultServiceAccount) {
  Rendered r = Render({"--set", "serviceAccount.create=false"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("serviceAccount.name is empty"));
  Rendered named =
      Render({"--set", "serviceAccount.create=false", "--set", "serviceAccount.name=ops"});
  ASSERT_EQ(named.code, 0) << named.err;
  EXPECT_TRUE(OfKind(named, "ServiceAccount").empty());
  EXPECT_EQ(One(named, "ClusterRoleBinding")["subjects"][0]["name"], "ops");
}

TEST(ChartTest, NamespaceScopeCreatesNoClusterScopedObjectsButTheCrd) {
  Rendered r = Render({"--values", CHART_DIR "/ci/namespace-scope-values.yaml", "--set",
                       "rbac.aggregateToDefaultRoles=true"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(OfKind(r, "ClusterRole").empty());
  EXPECT_TRUE(OfKind(r, "ClusterRoleBinding").empty());
  for (const auto& role : OfKind(r, "Role")) {
    const std::string ns = role["metadata"]["namespace"];
    EXPECT_TRUE(ns == "ml" || ns == kNamespace) << ns;
  }
  EXPECT_TRUE(HasArg(Args(One(r, "Deployment")), "--namespace=ml"));
}

TEST(ChartTest, SchemaRejectsWrongValuesWithHelmsMessages) {
  Rendered wrong_type = Render({"--set", "replicaCount=two"});
  EXPECT_EQ(wrong_type.code, 1);
  EXPECT_THAT(wrong_type.err, HasSubstr("values don't meet the specifications of the schema"));
  EXPECT_THAT(wrong_type.err,
              HasSubstr("replicaCount: Invalid type. Expected: integer, given: string"));
  EXPECT_EQ(wrong_type.out, "") << "nothing is rendered from invalid values";

  Rendered bad_enum = Render({"--set", "rbac.scope=everywhere"});
  EXPECT_EQ(bad_enum.code, 1);
  EXPECT_THAT(bad_enum.err, HasSubstr("rbac.scope"));
  EXPECT_THAT(bad_enum.err, HasSubstr("cluster"));

  Rendered typo = Render({"--set", "replicaCont=2"});
  EXPECT_EQ(typo.code, 1);
  EXPECT_THAT(typo.err, HasSubstr("replicaCont"));

  Rendered no_namespace = Render({"--set", "rbac.scope=namespace"});
  EXPECT_EQ(no_namespace.code, 1);
  EXPECT_THAT(no_namespace.err, HasSubstr("watchNamespace"));
}

// ---- Applied to kube-test-server with kubectl ------------------------------------------

// A prometheus-operator CRD the optional monitors need, as a cluster with
// kube-prometheus-stack has it (the schema trimmed to "anything goes").
json MonitoringCrd(const std::string& kind, const std::string& plural) {
  std::string singular = plural.substr(0, plural.size() - 1);
  return {
      {"apiVersion", "apiextensions.k8s.io/v1"},
      {"kind", "CustomResourceDefinition"},
      {"metadata", {{"name", plural + ".monitoring.coreos.com"}}},
      {"spec",
       {{"group", "monitoring.coreos.com"},
        {"names",
         {{"kind", kind}, {"listKind", kind + "List"}, {"plural", plural}, {"singular", singular}}},
        {"scope", "Namespaced"},
        {"versions", json::array({{{"name", "v1"},
                                   {"served", true},
                                   {"storage", true},
                                   {"schema",
                                    {{"openAPIV3Schema",
                                      {{"type", "object"},
                                       {"x-kubernetes-preserve-unknown-fields", true}}}}}}})}}}};
}

// A cluster with the namespaces `helm install --create-namespace` and the values expect.
class ChartClusterTest : public ::testing::Test {
 protected:
  void StartCluster(std::vector<std::string> server_args) {
    h_ = std::make_unique<OperatorHarness>(std::move(server_args));
    ASSERT_TRUE(h_->ok()) << h_->error();
    for (const char* ns : {kNamespace, "ml", "monitoring"}) {
      // (`kubectl create namespace` sends protobuf, which the test server does not speak.)
      ASSERT_TRUE(
          h_->Apply({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}}));
    }
    ASSERT_TRUE(h_->Apply(MonitoringCrd("ServiceMonitor", "servicemonitors")));
    ASSERT_TRUE(h_->Apply(MonitoringCrd("PodMonitor", "podmonitors")));
  }

  // kubectl apply of the rendered chart, as the cluster admin.
  void Install(const Rendered& rendered) {
    ASSERT_EQ(rendered.code, 0) << rendered.err;
    const std::string file = h_->dir() + "/rendered-" + std::to_string(installs_++) + ".yaml";
    WriteFile(file, rendered.out);
    auto r = h_->Kubectl({"apply", "-f", file});
    ASSERT_EQ(r.code, 0) << r.err << "\n" << r.out;
  }

  // A kubeconfig for ServiceAccount ns/name: its token (what the operator sends, as from a
  // mounted token) and `as:` it (what kubectl sends to a plain-http server).
  std::string ServiceAccountKubeconfig(const std::string& ns, const std::string& name) {
    const std::string path = h_->dir() + "/sa-" + ns + "-" + name + ".kubeconfig";
    Status written = h_->server().WriteServiceAccountKubeconfig(ns, name, path);
    EXPECT_TRUE(written.ok()) << written.ToString();
    return path;
  }

  // The operator with the rendered Deployment's arguments (its listen addresses moved to
  // free loopback ports) and the ServiceAccount's credentials only.
  void StartRenderedOperator(const Rendered& rendered, const std::string& identity = "op-0") {
    const json deployment = One(rendered, "Deployment");
    ASSERT_TRUE(deployment.is_object());
    const std::string sa = deployment["spec"]["template"]["spec"]["serviceAccountName"];
    std::vector<std::string> extra;
    for (const std::string& arg : Args(deployment)) {
      if (arg.rfind("--metrics-addr", 0) == 0 || arg.rfind("--health-addr", 0) == 0) continue;
      extra.push_back(arg);
    }
    extra.push_back("--kubeconfig");
    extra.push_back(ServiceAccountKubeconfig(kNamespace, sa));
    user_ = kubetest::ServiceAccountUserName(kNamespace, sa);
    h_->StartOperator(extra, identity);
  }

  // Runs one job in `ns` to Succeeded through the operator.
  void RunJobToSuccess(const std::string& ns, const std::string& name) {
    json job = TestJob(name);
    job["metadata"]["namespace"] = ns;
    ASSERT_TRUE(h_->Apply(job));
    ASSERT_TRUE(h_->WaitFor([&] { return h_->Pods(name, ns).size() == 2; }, seconds(30)))
        << Denials() << h_->Log();
    ASSERT_TRUE(h_->WaitPhase(name, "Running", seconds(30), ns))
        << h_->Phase(name, ns) << Denials() << h_->Log();
    for (const auto& pod : h_->Pods(name, ns)) h_->SucceedPod(pod["metadata"]["name"], ns);
    ASSERT_TRUE(h_->WaitPhase(name, "Succeeded", seconds(30), ns))
        << h_->Phase(name, ns) << Denials() << h_->Log();
  }
  // The operator's requests the server refused, one per line.
  std::string Denials() {
    std::string out;
    for (const auto& req : h_->server().Requests().value("requests", json::array())) {
      if (req.value("user", "") != user_) continue;
      if (req.value("code", 0) == 403 || req.value("code", 0) == 401) {
        out += "\n  " + req.value("verb", "") + " " + req.value("path", "") + " -> " +
               std::to_string(req.value("code", 0));
      }
    }
    return out;
  }
  int OperatorRequests() {
    int n = 0;
    for (const auto& req : h_->server().Requests().value("requests", json::array())) {
      if (req.value("user", "") == user_) ++n;
    }
    return n;
  }

  std::unique_ptr<OperatorHarness> h_;
  std::string user_;
  int installs_ = 0;
};

TEST_F(ChartClusterTest, EveryRenderedDocumentAppliesWithKubectl) {
  StartCluster({"--simulate-nodes", "2"});
  for (const std::string values :
       {"", CHART_DIR "/ci/all-on-values.yaml", CHART_DIR "/ci/namespace-scope-values.yaml"}) {
    SCOPED_TRACE(values.empty() ? "default values" : values);
    Rendered r =
        Render(values.empty() ? std::vector<std::string>{}
                              : std::vector<std::string>{"--values", values, "--api-versions",
                                                         "monitoring.coreos.com/v1"});
    Install(r);
    // Every document is now stored where the chart meant it to be.
    for (const auto& d : r.docs) {
      const std::string kind = d["kind"], name = d["metadata"]["name"];
      std::vector<std::string> args = {"get", kind, name, "-o", "name"};
      if (d["metadata"].contains("namespace")) {
        args.push_back("-n");
        args.push_back(d["metadata"]["namespace"]);
      }
      auto got = h_->Kubectl(args);
      EXPECT_EQ(got.code, 0) << kind << "/" << name << ": " << got.err;
    }
  }
}

// NOTES.txt tells the user what to apply next; what it shows must apply as it stands.
TEST_F(ChartClusterTest, TheJobInTheNotesIsAValidTrainingJob) {
  StartCluster({"--simulate-nodes", "2"});
  Rendered r = Render({"--notes"});
  ASSERT_EQ(r.code, 0) << r.err;
  const size_t notes = r.out.find("\nNOTES:\n");
  ASSERT_NE(notes, std::string::npos) << r.out;
  const std::string text = r.out.substr(notes);
  EXPECT_THAT(text, HasSubstr("kubectl -n spawnpoint-system rollout status deployment/spawnpoint"));
  const std::string open = "<<'EOF'\n", close = "\nEOF\n";
  const size_t begin = text.find(open);
  ASSERT_NE(begin, std::string::npos) << text;
  const size_t end = text.find(close, begin);
  ASSERT_NE(end, std::string::npos) << text;
  const std::string job = text.substr(begin + open.size(), end - begin - open.size());
  const std::string file = h_->dir() + "/notes-job.yaml";
  WriteFile(file, job);
  auto applied = h_->Kubectl({"apply", "-n", "default", "-f", file});
  EXPECT_EQ(applied.code, 0) << applied.err << "\n" << job;
  EXPECT_THAT(applied.out, HasSubstr("trainingjob.spawnpoint.dev/hello-ddp created"));
}

TEST_F(ChartClusterTest, OperatorReconcilesWithOnlyTheRenderedClusterRbac) {
  StartCluster({"--simulate-nodes", "2", "--authorization", "rbac"});
  // Two replicas, leader election on: the Lease rules are exercised too.
  Rendered r = Render({"--set", "replicaCount=2"});
  Install(r);
  StartRenderedOperator(r);
  RunJobToSuccess("default", "rbac-cluster");
  RunJobToSuccess("ml", "rbac-other-namespace");
  EXPECT_GT(OperatorRequests(), 10) << "the server saw the operator as its ServiceAccount";
  EXPECT_EQ(Denials(), "") << "the operator needed a permission the chart does not grant";
  EXPECT_THAT(h_->Log(), HasSubstr("became the leader"));

  // The rules are enforced, and grant nothing beyond what the operator uses.
  const std::string kc = ServiceAccountKubeconfig(kNamespace, "spawnpoint");
  auto secrets = h_->Kubectl({"--kubeconfig", kc, "get", "secrets", "-A"});
  EXPECT_NE(secrets.code, 0);
  EXPECT_THAT(secrets.err, HasSubstr("Forbidden"));
  auto nodes = h_->Kubectl({"--kubeconfig", kc, "get", "nodes"});
  EXPECT_NE(nodes.code, 0);
}

TEST_F(ChartClusterTest, NamespaceScopedOperatorReconcilesOnlyItsNamespace) {
  StartCluster({"--simulate-nodes", "2", "--authorization", "rbac"});
  Rendered r = Render({"--values", CHART_DIR "/ci/namespace-scope-values.yaml"});
  Install(r);
  EXPECT_TRUE(OfKind(r, "ClusterRoleBinding").empty()) << "namespace scope binds no cluster role";
  StartRenderedOperator(r);
  RunJobToSuccess("ml", "rbac-namespaced");
  EXPECT_EQ(Denials(), "") << "the operator needed a permission the chart does not grant";
  const std::string kc = ServiceAccountKubeconfig(kNamespace, "spawnpoint");
  auto pods = h_->Kubectl({"--kubeconfig", kc, "get", "pods", "-n", "default"});
  EXPECT_NE(pods.code, 0) << "no rights outside the watched namespace";
  EXPECT_THAT(pods.err, HasSubstr("Forbidden"));
}

}  // namespace
}  // namespace spawnpoint::op::testing
