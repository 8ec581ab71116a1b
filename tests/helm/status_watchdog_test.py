"""The status watchdog (issue 41), as the real helm 3 or helm 4 renders the chart
(charts/spawnpoint) with `helm template`:

- its Deployment runs `spawnpoint-operator status-watchdog` from the operator's image with the
  Lease the operator elects its leader with (--lease-namespace, --lease-name), the operator's
  watched namespaces, --stale-after, --interval and its pod's name as --identity, under its own
  ServiceAccount, as locked down as the operator's pod;
- its RBAC is exactly the verbs it uses (templates/status-watchdog.yaml): get on the one
  Lease, in the release namespace; list on TrainingJobs, patch on their status, create on
  events, in a ClusterRole (cluster scope) or a Role in each watched namespace (namespace
  scope, then nothing cluster-wide for it);
- it follows leader election (none without it), and the chart refuses it switched on
  without leader election, and a staleAfter not longer than leaderElection.leaseDuration;
- no selector of the operator's (its Deployment, its metrics Service, the ServiceMonitor's
  Service, the NetworkPolicy's operator peer, the PodMonitor) takes the watchdog's pod.

    python3 status_watchdog_test.py --source-dir REPO --helm helm3 [unittest args]
"""

import unittest

import helm_chart
from helm_chart import NS, RELEASE, refusal, render
from isolation_test import Pod, ingress_allowed, selector_matches

WATCHDOG = RELEASE + "-status-watchdog"
TEAMS = ["team-a", "team-b"]


def of_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def component(docs, kind, name):
    """The documents of `kind` labelled app.kubernetes.io/component `name`."""
    return [d for d in of_kind(docs, kind)
            if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == name]


def named(docs, kind, name):
    found = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    if len(found) != 1:
        raise AssertionError("expected one %s %s, got %d" % (kind, name, len(found)))
    return found[0]


def watchdog(docs):
    found = component(docs, "Deployment", "status-watchdog")
    if len(found) != 1:
        raise AssertionError("expected one status-watchdog Deployment, got %d" % len(found))
    return found[0]


def operator(docs):
    found = component(docs, "Deployment", "operator")
    if len(found) != 1:
        raise AssertionError("expected one operator Deployment, got %d" % len(found))
    return found[0]


def container(deployment):
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, containers
    return containers[0]


def rules(role):
    """A Role's or ClusterRole's rules as {(group, resource, verb, resourceNames)}."""
    out = set()
    for rule in role.get("rules") or []:
        names = tuple(rule.get("resourceNames") or ())
        for group in rule.get("apiGroups") or []:
            for resource in rule.get("resources") or []:
                for verb in rule.get("verbs") or []:
                    out.add((group, resource, verb, names))
    return out


JOB_RULES = {("spawnpoint.dev", "trainingjobs", "list", ()),
             ("spawnpoint.dev", "trainingjobs/status", "patch", ()),
             ("", "events", "create", ())}


def lease_rules(lease):
    return {("coordination.k8s.io", "leases", "get", (lease,))}


class DeploymentTest(unittest.TestCase):
    def test_the_default_render_runs_the_watchdog(self):
        docs = render()
        deployment = watchdog(docs)
        self.assertEqual(deployment["metadata"]["name"], WATCHDOG)
        self.assertEqual(deployment["metadata"]["namespace"], NS)
        self.assertEqual(deployment["spec"]["replicas"], 1)
        self.assertEqual(deployment["spec"]["strategy"], {"type": "Recreate"})
        c = container(deployment)
        self.assertEqual(c["image"], container(operator(docs))["image"])
        self.assertNotIn("command", c, "the image's entry point, spawnpoint-operator")
        self.assertEqual(c["args"], [
            "status-watchdog",
            "--lease-namespace=" + NS,
            "--lease-name=" + RELEASE,
            "--stale-after=45s",
            "--interval=5s",
            "--identity=$(POD_NAME)",
            "--log-level=info",
        ])
        self.assertIn({"name": "POD_NAME", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.name"}}}, c["env"])
        # The Lease the operator elects its leader with.
        operator_args = container(operator(docs))["args"]
        self.assertIn("--leader-elect-namespace=" + NS, operator_args)
        self.assertIn("--leader-elect-name=" + RELEASE, operator_args)
        pod = deployment["spec"]["template"]["spec"]
        self.assertEqual(pod["serviceAccountName"], WATCHDOG)
        self.assertIs(pod["automountServiceAccountToken"], True)
        self.assertNotIn("ports", c, "it serves nothing")
        account = named(docs, "ServiceAccount", WATCHDOG)
        self.assertEqual(account["metadata"]["namespace"], NS)
        self.assertEqual(account["metadata"]["labels"]["app.kubernetes.io/component"],
                         "status-watchdog")
        self.assertIn("requests", c["resources"])

    def test_as_locked_down_as_the_operator(self):
        docs = render("--values", helm_chart.chart() + "/ci/all-on-values.yaml",
                      "--api-versions", "monitoring.coreos.com/v1")
        ours, theirs = watchdog(docs), operator(docs)
        pod, operator_pod = ours["spec"]["template"]["spec"], theirs["spec"]["template"]["spec"]
        self.assertEqual(pod["securityContext"], operator_pod["securityContext"])
        self.assertEqual(container(ours)["securityContext"],
                         container(theirs)["securityContext"])
        self.assertIs(container(ours)["securityContext"]["readOnlyRootFilesystem"], True)
        self.assertEqual(container(ours)["securityContext"]["capabilities"], {"drop": ["ALL"]})
        self.assertEqual(pod["imagePullSecrets"], operator_pod["imagePullSecrets"])
        # The operator's placement, unless the watchdog has its own.
        self.assertEqual(pod["nodeSelector"], operator_pod["nodeSelector"])
        self.assertEqual(pod["tolerations"], operator_pod["tolerations"])
        self.assertEqual(container(ours)["args"][-1], "--log-level=debug")
        self.assertIn("--namespace=ml", container(ours)["args"])
        own = watchdog(render("--set", "statusWatchdog.nodeSelector.pool=system",
                              "--set", "nodeSelector.pool=gpu"))
        self.assertEqual(own["spec"]["template"]["spec"]["nodeSelector"], {"pool": "system"})

    def test_away_from_the_operators_pods(self):
        docs = render()
        term = watchdog(docs)["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
        self.assertEqual(term["topologyKey"], "kubernetes.io/hostname")
        operator_pod = operator(docs)["spec"]["template"]["metadata"]["labels"]
        watchdog_pod = watchdog(docs)["spec"]["template"]["metadata"]["labels"]
        self.assertTrue(selector_matches(term["labelSelector"], operator_pod))
        self.assertFalse(selector_matches(term["labelSelector"], watchdog_pod))
        own = render("--set-json", 'statusWatchdog.affinity={"nodeAffinity": {}}')
        self.assertEqual(watchdog(own)["spec"]["template"]["spec"]["affinity"],
                         {"nodeAffinity": {}})

    def test_the_watched_namespaces_and_the_values(self):
        docs = render("--set", "watchNamespaces={%s}" % ",".join(TEAMS),
                      "--set", "statusWatchdog.staleAfter=2m",
                      "--set", "statusWatchdog.interval=500ms",
                      "--set", "leaderElection.leaseName=my-lease")
        args = container(watchdog(docs))["args"]
        self.assertIn("--namespace=team-a,team-b", args)
        self.assertIn("--namespace=team-a,team-b", container(operator(docs))["args"])
        self.assertIn("--stale-after=2m", args)
        self.assertIn("--interval=500ms", args)
        self.assertIn("--lease-name=my-lease", args)
        self.assertIn("--leader-elect-name=my-lease", container(operator(docs))["args"])
        # Every namespace: no --namespace at all.
        self.assertEqual([a for a in container(watchdog(render()))["args"]
                          if a.startswith("--namespace")], [])

    def test_a_long_fullname_keeps_names_within_63_characters(self):
        long_name = "x" * 63
        docs = render("--set", "fullnameOverride=" + long_name)
        deployment = watchdog(docs)
        self.assertLessEqual(len(deployment["metadata"]["name"]), 63)
        self.assertTrue(deployment["metadata"]["name"].endswith("-status-watchdog"))
        for value in deployment["spec"]["template"]["metadata"]["labels"].values():
            self.assertLessEqual(len(value), 63, value)


class LeaderElectionTest(unittest.TestCase):
    def test_none_without_leader_election(self):
        docs = render("--set", "leaderElection.enabled=false")
        self.assertEqual(component(docs, "Deployment", "status-watchdog"), [])
        for kind in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole",
                     "ClusterRoleBinding"):
            self.assertEqual(component(docs, kind, "status-watchdog"), [], kind)
        self.assertEqual(len(component(docs, "Deployment", "operator")), 1)
        # Leader election left to replicaCount (null): none with one replica, one with two.
        self.assertEqual(component(render("--set", "leaderElection.enabled=null"),
                                   "Deployment", "status-watchdog"), [])
        self.assertEqual(len(component(render("--set", "leaderElection.enabled=null",
                                              "--set", "replicaCount=2"),
                                       "Deployment", "status-watchdog")), 1)

    def test_turned_off(self):
        docs = render("--set", "statusWatchdog.enabled=false")
        self.assertEqual(component(docs, "Deployment", "status-watchdog"), [])
        self.assertEqual(component(docs, "Role", "status-watchdog"), [])

    def test_refused_on_without_leader_election(self):
        err = refusal("--set", "leaderElection.enabled=false",
                      "--set", "statusWatchdog.enabled=true")
        self.assertIn("statusWatchdog.enabled is true but leader election is off "
                      "(leaderElection.enabled=false): the watchdog judges whether an operator "
                      "is writing statuses by the operator's Lease", err)

    def test_stale_after_must_be_longer_than_the_lease_duration(self):
        for stale, lease in (("15s", "15s"), ("10s", "15s"), ("15000ms", "15"),
                             ("0.25m", "15s"), ("1m", "1.5m"), ("59", "1m")):
            err = refusal("--set-string", "statusWatchdog.staleAfter=" + stale,
                          "--set-string", "leaderElection.leaseDuration=" + lease)
            self.assertIn("statusWatchdog.staleAfter (%s) must be longer than "
                          "leaderElection.leaseDuration (%s)" % (stale, lease), err)
        for stale, lease in (("16s", "15s"), ("15001ms", "15s"), ("0.26m", "15"),
                             ("1h", "59m"), ("61", "1m")):
            docs = render("--set-string", "statusWatchdog.staleAfter=" + stale,
                          "--set-string", "leaderElection.leaseDuration=" + lease)
            self.assertIn("--stale-after=" + stale, container(watchdog(docs))["args"])
        # Not checked when there is no watchdog.
        render("--set", "statusWatchdog.enabled=false", "--set", "statusWatchdog.staleAfter=1s")

    def test_stale_after_must_be_at_least_twice_the_interval(self):
        # As `spawnpoint-operator status-watchdog` refuses it (watchdog_options.cc): the chart
        # says so at install, not a pod failing on its flags.
        for stale, interval in (("45s", "30s"), ("20s", "10001ms"), ("1m", "0.6m")):
            err = refusal("--set-string", "statusWatchdog.staleAfter=" + stale,
                          "--set-string", "statusWatchdog.interval=" + interval)
            self.assertIn("statusWatchdog.staleAfter (%s) must be at least twice "
                          "statusWatchdog.interval (%s)" % (stale, interval), err)
        for stale, interval in (("45s", "22.5s"), ("20s", "10s"), ("1m", "30")):
            docs = render("--set-string", "statusWatchdog.staleAfter=" + stale,
                          "--set-string", "statusWatchdog.interval=" + interval)
            self.assertIn("--interval=" + interval, container(watchdog(docs))["args"])

    def test_the_schema_takes_durations_only(self):
        for key in ("staleAfter", "interval"):
            err = refusal("--set", "statusWatchdog.%s=soon" % key)
            self.assertIn(key, err)
            self.assertIn("values don't meet the specifications of the schema", err)
        self.assertIn("statusWatchdog.interval is 0",
                      refusal("--set-string", "statusWatchdog.interval=0"))
        err = refusal("--set", "statusWatchdog.replicas=2")
        self.assertIn("replicas", err)


class RbacTest(unittest.TestCase):
    def assert_lease_role(self, docs, lease=RELEASE):
        role = named(docs, "Role", WATCHDOG + "-lease")
        self.assertEqual(role["metadata"]["namespace"], NS)
        self.assertEqual(rules(role), lease_rules(lease))
        self.assert_binding(named(docs, "RoleBinding", WATCHDOG + "-lease"), "Role",
                            WATCHDOG + "-lease", NS)

    def assert_binding(self, binding, kind, role, namespace):
        self.assertEqual(binding["metadata"].get("namespace"), namespace)
        self.assertEqual(binding["roleRef"], {"apiGroup": "rbac.authorization.k8s.io",
                                              "kind": kind, "name": role})
        self.assertEqual(binding["subjects"], [{"kind": "ServiceAccount", "name": WATCHDOG,
                                                "namespace": NS}])

    def bound_to_the_watchdog(self, docs):
        """Every (kind, name, namespace) of a binding whose subject is the watchdog."""
        out = set()
        for kind in ("RoleBinding", "ClusterRoleBinding"):
            for b in of_kind(docs, kind):
                for s in b.get("subjects") or []:
                    if s.get("kind") == "ServiceAccount" and s["name"] == WATCHDOG:
                        out.add((b["roleRef"]["kind"], b["roleRef"]["name"],
                                 b["metadata"].get("namespace")))
        return out

    def test_cluster_scope(self):
        for values in ((), ("--set", "watchNamespaces={%s}" % ",".join(TEAMS))):
            docs = render(*values)
            role = named(docs, "ClusterRole", WATCHDOG)
            self.assertNotIn("namespace", role["metadata"])
            self.assertEqual(rules(role), JOB_RULES, values)
            self.assert_binding(named(docs, "ClusterRoleBinding", WATCHDOG), "ClusterRole",
                                WATCHDOG, None)
            self.assert_lease_role(docs)
            self.assertEqual(self.bound_to_the_watchdog(docs), {
                ("ClusterRole", WATCHDOG, None), ("Role", WATCHDOG + "-lease", NS)}, values)
            self.assertEqual(component(docs, "Role", "status-watchdog"),
                             [named(docs, "Role", WATCHDOG + "-lease")])

    def test_namespace_scope(self):
        docs = render("--set", "rbac.scope=namespace",
                      "--set", "watchNamespaces={%s}" % ",".join(TEAMS),
                      "--set", "leaderElection.leaseName=my-lease")
        self.assertEqual(component(docs, "ClusterRole", "status-watchdog"), [])
        self.assertEqual(component(docs, "ClusterRoleBinding", "status-watchdog"), [])
        self.assertEqual(of_kind(docs, "ClusterRole"), [], "nothing cluster-wide at all")
        roles = [r for r in of_kind(docs, "Role") if r["metadata"]["name"] == WATCHDOG]
        self.assertEqual(sorted(r["metadata"]["namespace"] for r in roles), TEAMS)
        for role in roles:
            self.assertEqual(rules(role), JOB_RULES, role["metadata"]["namespace"])
        for ns in TEAMS:
            binding = [b for b in of_kind(docs, "RoleBinding")
                       if b["metadata"]["name"] == WATCHDOG and b["metadata"]["namespace"] == ns]
            self.assertEqual(len(binding), 1, ns)
            self.assert_binding(binding[0], "Role", WATCHDOG, ns)
        self.assert_lease_role(docs, "my-lease")
        self.assertEqual(self.bound_to_the_watchdog(docs), {
            ("Role", WATCHDOG, "team-a"), ("Role", WATCHDOG, "team-b"),
            ("Role", WATCHDOG + "-lease", NS)})

    def test_the_operators_rules_do_not_reach_the_watchdog(self):
        docs = render()
        for kind in ("RoleBinding", "ClusterRoleBinding"):
            for b in of_kind(docs, kind):
                if b["metadata"]["name"].startswith(WATCHDOG):
                    continue
                self.assertNotIn(WATCHDOG, [s["name"] for s in b.get("subjects") or []],
                                 b["metadata"]["name"])

    def test_no_rbac_when_rbac_create_is_off(self):
        docs = render("--set", "rbac.create=false")
        self.assertEqual(len(component(docs, "Deployment", "status-watchdog")), 1)
        self.assertEqual(self.bound_to_the_watchdog(docs), set())
        self.assertEqual(component(docs, "Role", "status-watchdog"), [])
        self.assertEqual(component(docs, "ClusterRole", "status-watchdog"), [])


class SelectorTest(unittest.TestCase):
    """No selector of the operator's takes the watchdog's pod."""

    @classmethod
    def setUpClass(cls):
        cls.docs = render("--set", "networkPolicy.namespaces={%s}" % ",".join(TEAMS),
                          "--set", "metrics.serviceMonitor.enabled=true",
                          "--set", "agentMetrics.podMonitor.enabled=true",
                          "--api-versions", "monitoring.coreos.com/v1")
        cls.pod = watchdog(cls.docs)["spec"]["template"]["metadata"]["labels"]
        cls.operator_pod = operator(cls.docs)["spec"]["template"]["metadata"]["labels"]

    def test_the_deployments_select_their_own_pods_only(self):
        ours, theirs = watchdog(self.docs), operator(self.docs)
        self.assertTrue(selector_matches(ours["spec"]["selector"], self.pod))
        self.assertFalse(selector_matches(ours["spec"]["selector"], self.operator_pod))
        self.assertTrue(selector_matches(theirs["spec"]["selector"], self.operator_pod))
        self.assertFalse(selector_matches(theirs["spec"]["selector"], self.pod),
                         "the operator's Deployment (and `kubectl logs deployment/%s`) would "
                         "take the watchdog's pod" % RELEASE)
        self.assertEqual(self.pod["app.kubernetes.io/component"], "status-watchdog")
        self.assertEqual(self.pod["app.kubernetes.io/instance"], RELEASE)
        self.assertEqual(self.pod["app.kubernetes.io/part-of"], "spawnpoint")

    def test_the_metrics_service_and_monitors(self):
        for service in of_kind(self.docs, "Service"):
            selector = {"matchLabels": service["spec"]["selector"]}
            self.assertTrue(selector_matches(selector, self.operator_pod))
            self.assertFalse(selector_matches(selector, self.pod), service["metadata"]["name"])
        # The ServiceMonitor selects the metrics Service, not the watchdog's objects.
        sm = of_kind(self.docs, "ServiceMonitor")[0]
        for d in self.docs:
            if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == \
                    "status-watchdog":
                self.assertFalse(selector_matches(sm["spec"]["selector"],
                                                  d["metadata"]["labels"]), d["kind"])
        pm = of_kind(self.docs, "PodMonitor")[0]
        self.assertFalse(selector_matches(pm["spec"]["selector"], self.pod))

    def test_the_watchdog_cannot_reach_the_agents(self):
        policies = of_kind(self.docs, "NetworkPolicy")
        self.assertEqual(len(policies), 2)
        port = [int(a.split("=", 1)[1]) for a in container(operator(self.docs))["args"]
                if a.startswith("--agent-status-port=")][0]
        namespace_labels = {ns: {"kubernetes.io/metadata.name": ns}
                            for ns in TEAMS + [NS, "monitoring"]}
        agent = Pod("team-a", {"spawnpoint.dev/job-name": "resnet"},
                    [("agent-status", port, "TCP")])
        self.assertTrue(ingress_allowed(policies, namespace_labels, Pod(NS, self.operator_pod),
                                        agent, "TCP", port))
        self.assertFalse(ingress_allowed(policies, namespace_labels, Pod(NS, self.pod),
                                         agent, "TCP", port))


class NotesTest(unittest.TestCase):
    """NOTES.txt, which `helm template` does not render, from `helm install --dry-run=client`
    of helm 4 with either --helm: helm 3's asks the cluster for its version even so."""

    def notes(self, *values):
        saved = helm_chart.ARGS.helm
        helm_chart.ARGS.helm = "helm4"
        try:
            code, out, err = helm_chart.helm("install", RELEASE, helm_chart.chart(),
                                             "--namespace", NS, "--dry-run=client", *values)
        finally:
            helm_chart.ARGS.helm = saved
        self.assertEqual(code, 0, err)
        return out[out.index("NOTES:"):]

    def test_notes_list_the_watchdog(self):
        notes = self.notes()
        self.assertIn("The status watchdog: Deployment %s" % WATCHDOG, notes)
        self.assertIn("ClusterRole and ClusterRoleBinding %s (list TrainingJobs, patch their"
                      % WATCHDOG, notes)
        self.assertIn("Role and RoleBinding %s-lease in \"%s\" (get the Lease only)"
                      % (WATCHDOG, NS), notes)
        notes = self.notes("--set", "rbac.scope=namespace", "--set", "watchNamespace=ml")
        self.assertIn("Role and RoleBinding %s in ml (list TrainingJobs," % WATCHDOG, notes)
        self.assertNotIn("status watchdog",
                         self.notes("--set", "leaderElection.enabled=false"))


if __name__ == "__main__":
    helm_chart.main()
