"""Isolation by default (issue 41), as the real helm 3 or helm 4 renders the chart
(charts/spawnpoint) with `helm template`:

- NetworkPolicyTest: the rendered NetworkPolicies, evaluated by a small NetworkPolicy
  evaluator (below: podSelector, namespaceSelector, ports with endPort and named ports, for
  ingress) on pods of two teams, the operator and Prometheus: a team-b pod cannot reach a
  team-a agent's port, every other port stays open; the port is the one the rendered
  Deployment passes the operator (--agent-status-port), which the operator puts on the pods
  (operator/reconciler/children.cc). Enforcement needs a network plugin, which this machine
  has not; the real API server accepting the objects is
  tests/cluster/test_isolation_on_real_server.py.
- PodMonitorTest: a real Prometheus scrapes, with a scrape configuration made from the
  rendered PodMonitor's endpoint (its relabelings translated field by field, not copied by
  hand), a target that a file_sd file places in namespace team-b for job resnet-b; the target
  serves series labelled namespace="team-a", job="other". The stored series must say team-b
  and resnet-b.
- AdmissionPolicyTest: the ValidatingAdmissionPolicy's namespaces and user, and the chart's
  refusals (watchNamespace in a protected namespace, a Prometheus selector of every
  namespace, a cluster without the API). The policy enforced by the real API server is
  tests/cluster/test_isolation_on_real_server.py.

    python3 isolation_test.py --source-dir REPO --helm helm3 [unittest args]
"""

import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse
import urllib.request

import yaml

import helm_chart
from helm_chart import NS, RELEASE, chart, refusal, render

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import ports  # noqa: E402  (tests/support/ports.py)

JOB_LABEL = "spawnpoint.dev/job-name"


def of_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def one(docs, kind):
    found = of_kind(docs, kind)
    if len(found) != 1:
        raise AssertionError("expected one %s, got %d" % (kind, len(found)))
    return found[0]


def operator_deployment(docs):
    """The operator's Deployment (the status watchdog has one of its own)."""
    found = [d for d in of_kind(docs, "Deployment")
             if d["metadata"]["labels"].get("app.kubernetes.io/component") == "operator"]
    if len(found) != 1:
        raise AssertionError("expected one operator Deployment, got %d" % len(found))
    return found[0]


def agent_port_of(deployment):
    """The --agent-status-port the Deployment passes the operator: the port it gives the
    agent-status container port of every training pod (children.cc BuildPod)."""
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    found = [a.split("=", 1)[1] for a in args if a.startswith("--agent-status-port=")]
    if len(found) != 1:
        raise AssertionError("the Deployment passes --agent-status-port %d times: %s"
                             % (len(found), args))
    return int(found[0])


# ---- a NetworkPolicy evaluator (networking.k8s.io/v1, ingress) ------------------------------
#
# A pod is isolated for ingress when a NetworkPolicy of its namespace selects it (podSelector)
# with Ingress among its policyTypes (absent: Ingress, plus Egress when it has egress rules).
# An isolated pod takes a connection that some rule of some selecting policy allows: a rule
# allows it when one of its `from` peers matches the source (none: every source) and one of its
# `ports` matches the destination port and protocol (none: every port). A peer with only a
# podSelector means pods of the policy's namespace; with only a namespaceSelector every pod of
# the selected namespaces; with both, the selected pods of the selected namespaces. A port entry
# without `port` is every port of its protocol (default TCP); with `endPort`, the range; a
# named port matches the destination container port of that name.

class Pod(object):
    def __init__(self, namespace, labels=None, ports=()):
        self.namespace = namespace
        self.labels = dict(labels or {})
        self.ports = list(ports)  # (name, number, protocol)


def selector_matches(selector, labels):
    """A metav1.LabelSelector against labels; {} matches everything."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        if op == "In":
            ok = key in labels and labels[key] in values
        elif op == "NotIn":
            ok = key not in labels or labels[key] not in values
        elif op == "Exists":
            ok = key in labels
        elif op == "DoesNotExist":
            ok = key not in labels
        else:
            raise ValueError("unknown selector operator %r" % op)
        if not ok:
            return False
    unknown = set(selector) - {"matchLabels", "matchExpressions"}
    if unknown:
        raise ValueError("unknown selector fields %s" % sorted(unknown))
    return True


def policy_types(policy):
    spec = policy["spec"]
    if "policyTypes" in spec:
        return spec["policyTypes"]
    return ["Ingress"] + (["Egress"] if spec.get("egress") else [])


def peer_matches(peer, policy_namespace, source, namespace_labels):
    if "ipBlock" in peer:
        raise ValueError("ipBlock peers are not evaluated here: %s" % peer)
    if "podSelector" not in peer and "namespaceSelector" not in peer:
        raise ValueError("a peer with neither selector: %s" % peer)
    if "namespaceSelector" in peer:
        if not selector_matches(peer["namespaceSelector"], namespace_labels[source.namespace]):
            return False
    elif source.namespace != policy_namespace:
        return False
    return selector_matches(peer.get("podSelector") or {}, source.labels)


def port_matches(entry, destination, protocol, port):
    if entry.get("protocol", "TCP") != protocol:
        return False
    if "port" not in entry:
        return True
    wanted = entry["port"]
    if isinstance(wanted, str):
        if "endPort" in entry:
            raise ValueError("endPort with a named port: %s" % entry)
        return any(name == wanted and number == port and proto == protocol
                   for name, number, proto in destination.ports)
    if "endPort" in entry:
        if entry["endPort"] < wanted:
            raise ValueError("endPort below port: %s" % entry)
        return wanted <= port <= entry["endPort"]
    return port == wanted


def ingress_allowed(policies, namespace_labels, source, destination, protocol, port):
    """Whether `source` may open a `protocol` connection to `destination`'s `port`."""
    selecting = [p for p in policies
                 if p["metadata"]["namespace"] == destination.namespace and
                 "Ingress" in policy_types(p) and
                 selector_matches(p["spec"]["podSelector"], destination.labels)]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress") or []:
            peers = rule.get("from") or []
            if peers and not any(peer_matches(peer, policy["metadata"]["namespace"], source,
                                              namespace_labels) for peer in peers):
                continue
            entries = rule.get("ports") or []
            if entries and not any(port_matches(e, destination, protocol, port)
                                   for e in entries):
                continue
            return True
    return False


class EvaluatorTest(unittest.TestCase):
    """The evaluator itself, on policies whose answers the Kubernetes documentation gives."""

    def test_the_documented_semantics(self):
        labels = {"a": {"kubernetes.io/metadata.name": "a"},
                  "b": {"kubernetes.io/metadata.name": "b", "team": "x"}}
        web = Pod("a", {"app": "web"}, [("http", 8080, "TCP")])
        other = Pod("a", {"app": "db"})
        outside = Pod("b", {"app": "web"})
        deny_all = {"metadata": {"namespace": "a"},
                    "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}
        self.assertFalse(ingress_allowed([deny_all], labels, other, web, "TCP", 8080))
        self.assertTrue(ingress_allowed([deny_all], labels, web, outside, "TCP", 8080),
                        "a policy of namespace a does not isolate pods of b")
        same_ns = {"metadata": {"namespace": "a"}, "spec": {
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{"from": [{"podSelector": {}}], "ports": [{"port": "http"}]}]}}
        self.assertTrue(ingress_allowed([same_ns], labels, other, web, "TCP", 8080))
        self.assertFalse(ingress_allowed([same_ns], labels, outside, web, "TCP", 8080))
        self.assertFalse(ingress_allowed([same_ns], labels, other, web, "TCP", 8081))
        self.assertFalse(ingress_allowed([same_ns], labels, other, web, "UDP", 8080))
        both = {"metadata": {"namespace": "a"}, "spec": {
            "podSelector": {},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "x"}},
                                   "podSelector": {"matchLabels": {"app": "db"}}}],
                         "ports": [{"port": 100, "endPort": 200}]}]}}
        self.assertFalse(ingress_allowed([both], labels, outside, web, "TCP", 150),
                         "namespace and pod selectors in one peer: both must match")
        self.assertTrue(ingress_allowed([both], labels, Pod("b", {"app": "db"}), web, "TCP", 200))
        self.assertFalse(ingress_allowed([both], labels, Pod("b", {"app": "db"}), web, "TCP", 201))
        # Policies add up: a second one that allows everything from anywhere wins.
        open_all = {"metadata": {"namespace": "a"},
                    "spec": {"podSelector": {}, "ingress": [{}]}}
        self.assertTrue(ingress_allowed([deny_all, open_all], labels, outside, web, "SCTP", 9))


# ---- the chart's NetworkPolicy ------------------------------------------------------------------

TEAMS = ["team-a", "team-b"]
RENDEZVOUS = 29500


class NetworkPolicyTest(unittest.TestCase):
    """The rendered NetworkPolicies of the chart with the teams' namespaces listed."""

    @classmethod
    def setUpClass(cls):
        cls.docs = render("--set", "networkPolicy.namespaces={%s}" % ",".join(TEAMS))
        cls.policies = of_kind(cls.docs, "NetworkPolicy")
        deployment = operator_deployment(cls.docs)
        cls.port = agent_port_of(deployment)
        cls.namespace_labels = {
            ns: {"kubernetes.io/metadata.name": ns}
            for ns in TEAMS + [NS, "monitoring", "kube-system"]}
        # The operator's pods as the Deployment makes them.
        cls.operator = Pod(NS, deployment["spec"]["template"]["metadata"]["labels"])
        cls.prometheus = Pod("monitoring", {"app.kubernetes.io/name": "prometheus",
                                            "prometheus": "k8s"})

    def training_pod(self, namespace, job, node=0, port=None):
        """A pod as the operator makes it (children.cc BuildPod): the job's labels, the
        rendezvous, agent-status and gang ports."""
        return Pod(namespace, {JOB_LABEL: job, "spawnpoint.dev/node-rank": str(node)},
                   [("rendezvous", RENDEZVOUS, "TCP"), ("agent-status", port or self.port, "TCP"),
                    ("gang", RENDEZVOUS + 1, "TCP")])

    def allowed(self, source, destination, port, protocol="TCP", policies=None):
        return ingress_allowed(self.policies if policies is None else policies,
                               self.namespace_labels, source, destination, protocol, port)

    def test_one_policy_in_each_listed_namespace(self):
        self.assertEqual(sorted(p["metadata"]["namespace"] for p in self.policies), TEAMS)
        for policy in self.policies:
            self.assertEqual(policy["apiVersion"], "networking.k8s.io/v1")
            self.assertEqual(policy["spec"]["podSelector"],
                             {"matchExpressions": [{"key": JOB_LABEL, "operator": "Exists"}]})

    def test_another_team_cannot_reach_the_agent_port(self):
        agent = self.training_pod("team-a", "resnet")
        for source in (self.training_pod("team-b", "other"), Pod("team-b"),
                       Pod("kube-system", {"k8s-app": "kube-dns"}),
                       # The operator's labels, but not in the release namespace.
                       Pod("team-b", self.operator.labels),
                       # Prometheus' labels, but not in Prometheus' namespace.
                       Pod("team-b", self.prometheus.labels),
                       # Prometheus' namespace, but not Prometheus.
                       Pod("monitoring", {"app.kubernetes.io/name": "grafana"})):
            self.assertFalse(self.allowed(source, agent, self.port),
                             "%s %s reached the agent" % (source.namespace, source.labels))

    def test_every_other_port_stays_open(self):
        agent = self.training_pod("team-a", "resnet")
        intruder = Pod("team-b", {"app": "anything"})
        for port in (1, RENDEZVOUS, RENDEZVOUS + 1, self.port - 1, self.port + 1, 65535):
            self.assertTrue(self.allowed(intruder, agent, port), "TCP %d" % port)
        for protocol in ("UDP", "SCTP"):
            for port in (1, RENDEZVOUS, self.port, 65535):
                self.assertTrue(self.allowed(intruder, agent, port, protocol),
                                "%s %d" % (protocol, port))

    def test_the_operator_and_prometheus_reach_the_agent_port(self):
        for team in TEAMS:
            agent = self.training_pod(team, "resnet")
            self.assertTrue(self.allowed(self.operator, agent, self.port), team)
            self.assertTrue(self.allowed(self.prometheus, agent, self.port), team)

    def test_pods_of_the_same_namespace_and_job_do_not(self):
        # Nothing of a job reads another pod's agent (the operator reads /status, the gang has
        # its own port): not let in unless networkPolicy.extraFrom says so.
        agent = self.training_pod("team-a", "resnet", node=0)
        peer = self.training_pod("team-a", "resnet", node=1)
        neighbour = self.training_pod("team-a", "other")
        self.assertFalse(self.allowed(peer, agent, self.port))
        self.assertFalse(self.allowed(neighbour, agent, self.port))
        self.assertTrue(self.allowed(peer, agent, RENDEZVOUS), "the rendezvous stays open")
        self.assertTrue(self.allowed(peer, agent, RENDEZVOUS + 1), "the gang port stays open")
        docs = render("--set", "networkPolicy.namespaces={team-a}", "--set-json",
                      'networkPolicy.extraFrom=[{"podSelector": {"matchExpressions": '
                      '[{"key": "%s", "operator": "Exists"}]}}]' % JOB_LABEL)
        widened = of_kind(docs, "NetworkPolicy")
        self.assertTrue(self.allowed(peer, agent, self.port, policies=widened))
        self.assertFalse(self.allowed(self.training_pod("team-b", "x"), agent, self.port,
                                      policies=widened), "extraFrom's pods: same namespace only")

    def test_pods_that_are_not_training_pods_are_not_selected(self):
        notebook = Pod("team-a", {"app": "notebook"}, [("http", self.port, "TCP")])
        self.assertTrue(self.allowed(Pod("team-b"), notebook, self.port))

    def test_the_policy_closes_the_port_the_operator_gives_the_agents(self):
        self.assertEqual(self.port, 9400, "the default operator.agentStatusPort")
        for port in (9555, 1, 65535):
            docs = render("--set", "networkPolicy.namespaces={team-a}",
                          "--set", "operator.agentStatusPort=%d" % port)
            self.assertEqual(agent_port_of(operator_deployment(docs)), port)
            policies = of_kind(docs, "NetworkPolicy")
            agent = self.training_pod("team-a", "resnet", port=port)
            intruder = Pod("team-b")
            self.assertFalse(ingress_allowed(policies, self.namespace_labels, intruder, agent,
                                             "TCP", port), port)
            self.assertTrue(ingress_allowed(policies, self.namespace_labels, self.operator,
                                            agent, "TCP", port), port)
            for other in (1, 9400, 65535):
                if other != port:
                    self.assertTrue(ingress_allowed(policies, self.namespace_labels, intruder,
                                                    agent, "TCP", other), (port, other))

    def test_which_namespaces_get_a_policy(self):
        self.assertEqual(of_kind(render(), "NetworkPolicy"), [],
                         "every namespace watched and none listed: none (NOTES.txt says so)")
        watched = of_kind(render("--set", "watchNamespace=ml"), "NetworkPolicy")
        self.assertEqual([p["metadata"]["namespace"] for p in watched], ["ml"])
        scoped = of_kind(render("--set", "rbac.scope=namespace", "--set", "watchNamespace=ml"),
                         "NetworkPolicy")
        self.assertEqual([p["metadata"]["namespace"] for p in scoped], ["ml"])
        off = render("--set", "watchNamespace=ml", "--set", "networkPolicy.enabled=false")
        self.assertEqual(of_kind(off, "NetworkPolicy"), [])
        for scope in ("namespace", "cluster"):
            listed = of_kind(render("--set", "rbac.scope=" + scope,
                                    "--set", "watchNamespaces={team-a,team-b}"), "NetworkPolicy")
            self.assertEqual(sorted(p["metadata"]["namespace"] for p in listed),
                             ["team-a", "team-b"], scope)

    def test_prometheus_selectors_follow_the_values(self):
        docs = render("--set", "networkPolicy.namespaces={team-a}",
                      "--set", "networkPolicy.prometheus.namespaceSelector.matchLabels."
                               "kubernetes\\.io/metadata\\.name=observability")
        policies = of_kind(docs, "NetworkPolicy")
        agent = self.training_pod("team-a", "resnet")
        namespace_labels = dict(self.namespace_labels,
                                observability={"kubernetes.io/metadata.name": "observability"})
        moved = Pod("observability", self.prometheus.labels)
        for source, expected in ((moved, True), (self.prometheus, False)):
            self.assertEqual(ingress_allowed(policies, namespace_labels, source, agent, "TCP",
                                             self.port), expected, source.namespace)

    def test_a_prometheus_selector_of_every_namespace_is_refused(self):
        err = refusal("--set", "networkPolicy.prometheus.namespaceSelector.matchLabels=null")
        self.assertIn("networkPolicy.prometheus.namespaceSelector is empty", err)


# ---- the PodMonitor, through a real Prometheus ---------------------------------------------------

# Series an agent in team-b serves, claiming to be team-a's.
FORGED = """\
# TYPE spawnpoint_agent_info gauge
spawnpoint_agent_info{namespace="team-a",job="other",pod="forged",node_rank="0",gpu_backend="none"} 1
# TYPE spawnpoint_gpu_utilisation_ratio gauge
spawnpoint_gpu_utilisation_ratio{namespace="team-a",job="other",gpu="0",rank="0",pod="forged",container="forged"} 0.5
"""

# The PodMonitor's endpoint fields this test translates to Prometheus' scrape configuration; the
# test fails on any other, so that nothing the chart adds goes unchecked.
ENDPOINT_FIELDS = {"port", "path", "scheme", "interval", "scrapeTimeout", "honorLabels",
                   "relabelings", "metricRelabelings"}
RELABEL_FIELDS = {"sourceLabels": "source_labels", "separator": "separator",
                  "targetLabel": "target_label", "regex": "regex", "modulus": "modulus",
                  "replacement": "replacement", "action": "action"}


def relabel_configs(rules):
    out = []
    for rule in rules or []:
        unknown = set(rule) - set(RELABEL_FIELDS)
        if unknown:
            raise AssertionError("relabeling fields this test does not translate: %s"
                                 % sorted(unknown))
        out.append({RELABEL_FIELDS[k]: (v.lower() if k == "action" else v)
                    for k, v in rule.items()})
    return out


def scrape_config(podmonitor, sd_file):
    """The scrape configuration the Prometheus Operator generates for the PodMonitor's first
    endpoint, on a file_sd target instead of Kubernetes discovery: its own target labels first
    (namespace, pod, container, and job "<namespace>/<name>" of the PodMonitor), then the
    endpoint's relabelings and metricRelabelings as the PodMonitor has them."""
    endpoints = podmonitor["spec"]["podMetricsEndpoints"]
    assert len(endpoints) == 1, endpoints
    ep = endpoints[0]
    unknown = set(ep) - ENDPOINT_FIELDS
    if unknown:
        raise AssertionError("PodMonitor endpoint fields this test does not translate: %s"
                             % sorted(unknown))
    meta = podmonitor["metadata"]
    operator_defaults = [
        {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": ep["port"],
         "action": "keep"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"target_label": "job", "replacement": "%s/%s" % (meta["namespace"], meta["name"])},
        {"target_label": "endpoint", "replacement": ep["port"]},
    ]
    return {
        "job_name": "podMonitor/%s/%s/0" % (meta["namespace"], meta["name"]),
        "honor_labels": bool(ep.get("honorLabels", False)),
        "metrics_path": ep.get("path", "/metrics"),
        "scheme": ep.get("scheme", "http"),
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "file_sd_configs": [{"files": [sd_file], "refresh_interval": "1s"}],
        "relabel_configs": operator_defaults + relabel_configs(ep.get("relabelings")),
        "metric_relabel_configs": relabel_configs(ep.get("metricRelabelings")),
    }


class _Exposition(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = FORGED.encode()
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def wait_until(condition, deadline_s):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


class PodMonitorTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.binary = shutil.which("prometheus")
        cls.tmp = tempfile.mkdtemp(prefix="spawnpoint-podmonitor-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def podmonitor(self, *values):
        return one(render("--set", "agentMetrics.podMonitor.enabled=true",
                          "--api-versions", "monitoring.coreos.com/v1", *values), "PodMonitor")

    def test_no_honor_labels_on_tenant_pods(self):
        ep = self.podmonitor()["spec"]["podMetricsEndpoints"][0]
        self.assertFalse(ep.get("honorLabels", False))
        self.assertIn("honorLabels", refusal("--set", "agentMetrics.podMonitor.honorLabels=true"),
                      "the value is gone: the schema names it")
        sm = one(render("--set", "metrics.serviceMonitor.enabled=true", "--api-versions",
                        "monitoring.coreos.com/v1"), "ServiceMonitor")
        self.assertTrue(sm["spec"]["endpoints"][0]["honorLabels"],
                        "the operator's own series keep theirs")

    def test_prometheus_stores_the_pods_namespace_and_job(self):
        self.assertIsNotNone(self.binary, "prometheus is not installed (Debian package "
                             "\"prometheus\", which scripts/install-deps.sh installs: make deps)")
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Exposition)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        target = "127.0.0.1:%d" % server.server_address[1]

        sd_file = os.path.join(self.tmp, "targets.json")
        with open(sd_file, "w") as f:
            json.dump([{"targets": [target], "labels": {
                "__meta_kubernetes_namespace": "team-b",
                "__meta_kubernetes_pod_name": "resnet-b-node-0",
                "__meta_kubernetes_pod_container_name": "trainer",
                "__meta_kubernetes_pod_container_port_name": "agent-status",
                "__meta_kubernetes_pod_phase": "Running",
                "__meta_kubernetes_pod_label_spawnpoint_dev_job_name": "resnet-b",
            }}], f)
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "scrape_configs": [scrape_config(self.podmonitor(), sd_file)]}
        config_file = os.path.join(self.tmp, "prometheus.yml")
        with open(config_file, "w") as f:
            yaml.safe_dump(config, f)
        code = subprocess.run(["promtool", "check", "config", config_file],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True)
        self.assertEqual(code.returncode, 0, code.stdout)

        port = self.start_prometheus(config_file)
        query = lambda q: self.query(port, q)  # noqa: E731
        self.assertTrue(wait_until(lambda: len(query("spawnpoint_agent_info")) == 1 and
                                   len(query("spawnpoint_gpu_utilisation_ratio")) == 1, 60),
                        "no series within 60 s:\n%s" % self.prometheus_log())
        for name in ("spawnpoint_agent_info", "spawnpoint_gpu_utilisation_ratio"):
            labels = query(name)[0]["metric"]
            self.assertEqual(labels["namespace"], "team-b", labels)
            self.assertEqual(labels["job"], "resnet-b", labels)
            self.assertEqual(labels["pod"], "resnet-b-node-0", labels)
            self.assertEqual([k for k in labels if k.startswith("exported_")], [], labels)
        self.assertEqual(query('{namespace="team-a"}'), [])
        self.assertEqual(query('{job="other"}'), [])
        # The dashboard's namespace variable (label_values(spawnpoint_agent_info, namespace))
        # and a panel's selector find the job.
        with open(os.path.join(chart(), "dashboards", "spawnpoint.json")) as f:
            dashboard = f.read()
        self.assertIn("label_values(spawnpoint_agent_info, namespace)", dashboard)
        self.assertEqual(self.label_values(port, "namespace", "spawnpoint_agent_info"),
                         ["team-b"])
        self.assertEqual(len(query('avg by (namespace, job) (spawnpoint_gpu_utilisation_ratio'
                                   '{namespace=~"team-b", job=~"resnet-b"})')), 1)

    # ---- helpers ---------------------------------------------------------------------------

    def start_prometheus(self, config_file):
        """Starts prometheus on a free port (tried again if another process takes it first)
        and waits for /-/ready: the port."""
        for _ in range(3):
            port = ports.free_port(1)
            log = open(os.path.join(self.tmp, "prometheus.log"), "w")
            proc = subprocess.Popen(
                [self.binary, "--config.file=" + config_file,
                 "--storage.tsdb.path=" + os.path.join(self.tmp, "data"),
                 "--web.listen-address=127.0.0.1:%d" % port, "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            log.close()
            self.addCleanup(self.stop, proc)

            def ready():
                if proc.poll() is not None:
                    return True
                try:
                    with urllib.request.urlopen("http://127.0.0.1:%d/-/ready" % port,
                                                timeout=1) as r:
                        return r.status == 200
                except OSError:
                    return False
            if wait_until(ready, 30) and proc.poll() is None:
                return port
        self.fail("prometheus did not start:\n%s" % self.prometheus_log())

    @staticmethod
    def stop(proc):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def prometheus_log(self):
        try:
            with open(os.path.join(self.tmp, "prometheus.log")) as f:
                return f.read()[-3000:]
        except OSError:
            return ""

    def get(self, port, path):
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=5) as r:
            answer = json.loads(r.read().decode())
        self.assertEqual(answer["status"], "success", answer)
        return answer["data"]

    def query(self, port, promql):
        return self.get(port, "/api/v1/query?" + urllib.parse.urlencode({"query": promql}))[
            "result"]

    def label_values(self, port, label, match):
        return self.get(port, "/api/v1/label/%s/values?%s" % (
            label, urllib.parse.urlencode({"match[]": match})))


# ---- the admission policy ----------------------------------------------------------------------

class AdmissionPolicyTest(unittest.TestCase):
    def policy(self, *values):
        docs = render(*values)
        return (one(docs, "ValidatingAdmissionPolicy"),
                one(docs, "ValidatingAdmissionPolicyBinding"))

    def protected_namespaces(self, policy):
        variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
        return re.findall(r"'([^']*)'", variables["protected"])

    def test_the_operator_may_not_write_in_kube_system_or_the_release_namespace(self):
        policy, binding = self.policy()
        self.assertEqual(policy["apiVersion"], "admissionregistration.k8s.io/v1")
        self.assertEqual(self.protected_namespaces(policy), [NS, "kube-system"])
        self.assertEqual(policy["spec"]["matchConditions"][0]["expression"],
                         "request.userInfo.username == 'system:serviceaccount:%s:%s'"
                         % (NS, RELEASE))
        resources = {(g, r) for rule in policy["spec"]["matchConstraints"]["resourceRules"]
                     for g in rule["apiGroups"] for r in rule["resources"]}
        self.assertEqual(resources, {("", "pods"), ("", "services"), ("", "secrets"),
                                     ("scheduling.volcano.sh", "podgroups")})
        for rule in policy["spec"]["matchConstraints"]["resourceRules"]:
            self.assertEqual(rule["operations"], ["CREATE", "UPDATE", "DELETE"])
        self.assertEqual(binding["spec"]["policyName"], policy["metadata"]["name"])
        self.assertEqual(binding["spec"]["validationActions"], ["Deny"])

    def test_the_list_and_the_service_account_follow_the_values(self):
        policy, _ = self.policy("--set", "rbac.protectedNamespaces={kube-system,kube-public}",
                                "--set", "serviceAccount.name=ops")
        self.assertEqual(self.protected_namespaces(policy), [NS, "kube-system", "kube-public"])
        self.assertIn("system:serviceaccount:%s:ops" % NS,
                      policy["spec"]["matchConditions"][0]["expression"])

    def test_not_made_in_namespace_scope_or_when_turned_off(self):
        for values in (("--set", "rbac.scope=namespace", "--set", "watchNamespace=ml"),
                       ("--set", "rbac.admissionPolicy=false")):
            docs = render(*values)
            self.assertEqual(of_kind(docs, "ValidatingAdmissionPolicy"), [], values)
            self.assertEqual(of_kind(docs, "ValidatingAdmissionPolicyBinding"), [], values)

    def test_refusals(self):
        for scope in ("namespace", "cluster"):
            self.assertIn('watchNamespace is "%s", the release namespace' % NS,
                          refusal("--set", "rbac.scope=" + scope, "--set", "watchNamespace=" + NS))
        self.assertIn('watchNamespace "kube-system" is one of rbac.protectedNamespaces',
                      refusal("--set", "watchNamespace=kube-system"))
        # Every namespace of watchNamespaces is checked, not only the first.
        for scope in ("namespace", "cluster"):
            self.assertIn('watchNamespaces holds "%s", the release namespace' % NS,
                          refusal("--set", "rbac.scope=" + scope,
                                  "--set", "watchNamespaces={team-a,%s}" % NS))
        self.assertIn('watchNamespaces holds "kube-system", one of rbac.protectedNamespaces '
                      '[kube-system]: the admission policy would refuse',
                      refusal("--set", "watchNamespaces={team-a,kube-system}"))
        # With namespace scope there is no admission policy: the Role itself would be the
        # write access to kube-system.
        self.assertIn('watchNamespaces holds "kube-system", one of rbac.protectedNamespaces '
                      '[kube-system]: with rbac.scope=namespace the operator would get a Role '
                      'there', refusal("--set", "rbac.scope=namespace",
                                       "--set", "watchNamespaces={team-a,kube-system}"))
        self.assertIn('watchNamespace "kube-system" is one of rbac.protectedNamespaces',
                      refusal("--set", "rbac.scope=namespace",
                              "--set", "watchNamespace=kube-system"))
        old = refusal("--kube-version", "1.29.0")
        self.assertIn("no admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy", old)
        self.assertIn("rbac.admissionPolicy=false", old)
        self.assertEqual(of_kind(render("--kube-version", "1.29.0", "--set",
                                        "rbac.admissionPolicy=false"),
                                 "ValidatingAdmissionPolicy"), [])
        self.assertIn("protectedNamespaces",
                      refusal("--set", "rbac.protectedNamespaces={Kube_System}"))


if __name__ == "__main__":
    helm_chart.main()
