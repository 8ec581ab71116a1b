"""Isolation by default (issue 41) on the real control plane: the chart installed with a real
helm (4.1 or 3.17), its objects as the real API server takes them.

- The operator's ServiceAccount, with the installed ClusterRole (rbac.scope: cluster) and its
  own TokenRequest token, is refused by the chart's ValidatingAdmissionPolicy any create or
  delete of pods, and any create of services and secrets, in kube-system and in the release
  namespace, with the policy's message naming the namespace; in a team's namespace the same
  requests go through. RBAC alone cannot say this: `kubectl auth can-i` says yes to creating
  pods in kube-system (the ClusterRole holds everywhere), and the policy is what refuses.
- `kubectl auth can-i --as=system:serviceaccount:...` is "no" for every verb the operator
  must not have (pods/log, pods/exec, reading secrets, nodes, namespaces, configmaps,
  deployments, ...) and "yes" for what it uses (templates/rbac.yaml).
- The NetworkPolicies the chart makes in the teams' namespaces are stored as rendered (endPort
  kept), and those of the edge ports (1, 2, 65534, 65535) and of helm 3's and helm 4's renderings
  are valid for the server (`kubectl apply --dry-run=server`). They are not enforced here: that
  needs a network plugin; their meaning is tests/helm/isolation_test.py.
- The status watchdog's ServiceAccount: `kubectl auth can-i` is "yes" for exactly what it uses
  (get the operator's Lease by name, list TrainingJobs, patch their status, create events)
  and "no" for the rest (get, watch or update TrainingJobs, other Leases, any write to its
  Lease, pods, secrets).
- NOTES.txt says when no NetworkPolicy was made (every namespace watched, none listed).

    python3 test_isolation_on_real_server.py --source-dir REPO --helm helm4
"""

import json
import os
import unittest

import cluster_fixture
from cluster_fixture import wait_until

NS = "spawnpoint-system"
RELEASE = "spawnpoint"
SA_USER = "system:serviceaccount:%s:%s" % (NS, RELEASE)
WATCHDOG_USER = "system:serviceaccount:%s:%s-status-watchdog" % (NS, RELEASE)
TEAMS = ("team-a", "team-b")
POLICY = RELEASE + "-protected-namespaces"


def args():
    return cluster_fixture.ARGS


def pod(name):
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                       "spec": {"automountServiceAccountToken": False,
                                "containers": [{"name": "c", "image": "example.invalid/x"}]}})


def service(name):
    return json.dumps({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                       "spec": {"clusterIP": "None", "ports": [{"port": 1}]}})


def secret(name):
    return json.dumps({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
                       "stringData": {"token": "x"}})


def event(name, namespace):
    return json.dumps({"apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
                       "involvedObject": {"kind": "Pod", "name": "x", "namespace": namespace},
                       "reason": "Test",
                       "message": "m", "type": "Normal"})


class IsolationOnRealServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # No node and no operator: nothing here runs a job.
        cls.cluster = cluster_fixture.Cluster(args().source_dir, args().tools_bin)
        cls.chart = os.path.join(args().source_dir, "charts", "spawnpoint")
        try:
            for namespace in TEAMS + ("monitoring",):
                cls.kubectl_ok("create", "namespace", namespace)
            cls.notes = cls.cluster.install_chart(
                args().helm, RELEASE, NS,
                "--set", "networkPolicy.namespaces={%s}" % ",".join(TEAMS))
            cls.sa = cls.cluster.service_account_kubeconfig(NS, RELEASE)
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    # ---- helpers ---------------------------------------------------------------------------

    @classmethod
    def kubectl_ok(cls, *argv, stdin=None):
        return cluster_fixture.kubectl_ok(cls.cluster, *argv, stdin=stdin)

    def as_operator(self, *argv, stdin=None):
        """kubectl as the operator: its ServiceAccount's own token."""
        return self.cluster.kubectl("--kubeconfig", self.sa, *argv, stdin=stdin)

    def refused(self, verb, kind, namespace, body=None, name=None):
        """The operator's `verb` (create or delete) refused by the policy: its message."""
        argv = (verb, "-n", namespace) + (("-f", "-") if body else (kind, name))
        code, out = self.as_operator(*argv, stdin=body)
        self.assertNotEqual(code, 0, "%s %s in %s went through: %s" % (verb, kind, namespace, out))
        self.assertIn('ValidatingAdmissionPolicy \'%s\' with binding \'%s\' denied request'
                      % (POLICY, POLICY), out)
        self.assertIn("spawnpoint: the operator may not %s %s in namespace %s, which is "
                      "protected" % (verb, kind, namespace), out)
        return out

    def can_i(self, *argv, user=SA_USER):
        """`kubectl auth can-i --as=<the operator, or user> ARGV`: "yes" or "no" (its last
        line; a warning may come first, e.g. for a kind the server does not serve)."""
        code, out = self.cluster.kubectl("auth", "can-i", "--as=" + user, *argv)
        answer = out.strip().splitlines()[-1] if out.strip() else ""
        self.assertIn(answer, ("yes", "no"), out)
        self.assertEqual(code, 0 if answer == "yes" else 1, out)
        return answer

    def wait_enforced(self):
        """The API server learns new admission policies through an informer: poll (with a
        server dry run, which runs admission and stores nothing) until it refuses."""
        def refuses():
            code, out = self.as_operator("create", "--dry-run=server", "-n", "kube-system",
                                         "-f", "-", stdin=pod("probe"))
            return code != 0 and POLICY in out
        self.assertTrue(wait_until(refuses, 60), "the admission policy was not enforced in 60 s")

    # ---- the tests -------------------------------------------------------------------------

    def test_the_policy_type_checks(self):
        """The server type-checks the policy's CEL against pods, services and secrets."""
        def checked():
            code, out = self.cluster.kubectl("get", "validatingadmissionpolicy", POLICY,
                                             "-o", "json")
            return code == 0 and "typeChecking" in json.loads(out).get("status", {})
        self.assertTrue(wait_until(checked, 60), "no typeChecking status in 60 s")
        status = json.loads(self.kubectl_ok("get", "validatingadmissionpolicy", POLICY,
                                            "-o", "json"))["status"]
        self.assertEqual(status["typeChecking"].get("expressionWarnings", []), [])

    def test_no_writes_in_kube_system_or_the_release_namespace(self):
        self.wait_enforced()
        for namespace in ("kube-system", NS):
            self.refused("create", "pods", namespace, body=pod("intruder"))
            self.refused("create", "services", namespace, body=service("intruder"))
            self.refused("create", "secrets", namespace, body=secret("intruder"))
            # RBAC says yes: the ClusterRole holds in every namespace. The policy refuses.
            self.assertEqual(self.can_i("create", "pods", "-n", namespace), "yes")
        # Deleting what is there: the admin's pod in kube-system stays.
        self.kubectl_ok("create", "-n", "kube-system", "-f", "-", stdin=pod("victim"))
        self.refused("delete", "pods", "kube-system", name="victim")
        self.kubectl_ok("get", "pod", "victim", "-n", "kube-system")
        self.kubectl_ok("delete", "pod", "victim", "-n", "kube-system", "--wait=false")
        # Not matched: events (a refused job's FailedCreate event reports the refusal) and the
        # operator's Lease in the release namespace.
        code, out = self.as_operator("create", "-n", "kube-system", "-f", "-",
                                     stdin=event("spawnpoint-test", "kube-system"))
        self.assertEqual(code, 0, out)
        code, out = self.as_operator("create", "-n", NS, "-f", "-", stdin=json.dumps({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": RELEASE}, "spec": {"holderIdentity": "test"}}))
        self.assertEqual(code, 0, out)

    def test_writes_in_a_team_namespace_go_through(self):
        self.wait_enforced()
        # The ServiceAccount admission plugin needs the namespace's default ServiceAccount,
        # which the controller manager makes shortly after the namespace.
        self.assertTrue(wait_until(lambda: self.cluster.kubectl(
            "get", "serviceaccount", "default", "-n", "team-a")[0] == 0, 60))
        for body, kind in ((pod("worker"), "pod"), (service("worker"), "service"),
                           (secret("worker-gang"), "secret")):
            code, out = self.as_operator("create", "-n", "team-a", "-f", "-", stdin=body)
            self.assertEqual(code, 0, out)
        for kind, name in (("pod", "worker"), ("service", "worker")):
            code, out = self.as_operator("delete", kind, name, "-n", "team-a", "--wait=false")
            self.assertEqual(code, 0, out)
        # Others than the operator are not its concern: the admin creates in kube-system.
        self.kubectl_ok("create", "-n", "kube-system", "--dry-run=server", "-f", "-",
                        stdin=pod("admin-pod"))

    def test_auth_can_i_as_the_operator(self):
        team = ("-n", "team-a")
        forbidden = [
            ("get", "pods", "--subresource=log") + team,
            ("create", "pods", "--subresource=exec") + team,
            ("get", "pods") + team,
            ("update", "pods") + team,
            ("patch", "pods") + team,
            ("get", "secrets") + team,
            ("list", "secrets") + team,
            ("watch", "secrets") + team,
            ("delete", "secrets") + team,
            ("get", "secrets", "-n", "kube-system"),
            ("get", "nodes"),
            ("list", "nodes"),
            ("list", "namespaces"),
            ("create", "namespaces"),
            ("get", "configmaps") + team,
            ("create", "configmaps") + team,
            ("create", "deployments.apps") + team,
            ("list", "deployments.apps") + team,
            ("create", "trainingjobs.spawnpoint.dev") + team,
            ("update", "trainingjobs.spawnpoint.dev") + team,
            ("create", "podgroups.scheduling.volcano.sh") + team,
            ("update", "leases.coordination.k8s.io/someone-else", "-n", NS),
            ("create", "leases.coordination.k8s.io") + team,
            ("create", "clusterroles.rbac.authorization.k8s.io"),
            ("create", "rolebindings.rbac.authorization.k8s.io") + team,
            ("get", "resourcequotas") + team,
            ("update", "resourcequotas") + team,
            ("delete", "resourcequotas") + team,
        ]
        allowed = [
            ("list", "pods") + team, ("watch", "pods") + team, ("create", "pods") + team,
            ("delete", "pods") + team,
            ("list", "services") + team, ("watch", "services") + team,
            ("create", "services") + team, ("delete", "services") + team,
            ("create", "secrets") + team,
            ("list", "resourcequotas") + team, ("watch", "resourcequotas") + team,
            ("create", "events") + team,
            ("get", "trainingjobs.spawnpoint.dev") + team,
            ("list", "trainingjobs.spawnpoint.dev") + team,
            ("watch", "trainingjobs.spawnpoint.dev") + team,
            ("delete", "trainingjobs.spawnpoint.dev") + team,
            ("update", "trainingjobs.spawnpoint.dev", "--subresource=status") + team,
            ("update", "trainingjobs.spawnpoint.dev", "--subresource=finalizers") + team,
            ("create", "leases.coordination.k8s.io", "-n", NS),
            ("get", "leases.coordination.k8s.io/" + RELEASE, "-n", NS),
            ("update", "leases.coordination.k8s.io/" + RELEASE, "-n", NS),
        ]
        wrong = ["%s: %s" % (" ".join(a), "yes") for a in forbidden if self.can_i(*a) != "no"]
        wrong += ["%s: %s" % (" ".join(a), "no") for a in allowed if self.can_i(*a) != "yes"]
        self.assertEqual(wrong, [])

    def test_auth_can_i_as_the_status_watchdog(self):
        """The status watchdog's ServiceAccount (templates/status-watchdog.yaml): the operator's
        Lease, read; TrainingJobs listed (never read one by one or watched), their status
        patched; events created. Nothing else."""
        team = ("-n", "team-a")
        tj = "trainingjobs.spawnpoint.dev"
        lease = "leases.coordination.k8s.io"
        allowed = [
            ("get", "%s/%s" % (lease, RELEASE), "-n", NS),
            ("list", tj) + team,
            ("list", tj, "-n", "team-b"),
            ("list", tj, "--all-namespaces"),  # cluster scope: one list when all are watched
            ("patch", tj, "--subresource=status") + team,
            ("create", "events") + team,
        ]
        forbidden = [
            # TrainingJobs: list only, and only the status is written, by a patch.
            ("get", tj) + team,
            ("watch", tj) + team,
            ("create", tj) + team,
            ("update", tj) + team,
            ("patch", tj) + team,
            ("delete", tj) + team,
            ("update", tj, "--subresource=status") + team,
            ("get", tj, "--subresource=status") + team,
            # The Lease: read, that one, there.
            ("update", "%s/%s" % (lease, RELEASE), "-n", NS),
            ("patch", "%s/%s" % (lease, RELEASE), "-n", NS),
            ("delete", "%s/%s" % (lease, RELEASE), "-n", NS),
            ("create", lease, "-n", NS),
            ("list", lease, "-n", NS),
            ("watch", lease, "-n", NS),
            ("get", "%s/someone-else" % lease, "-n", NS),
            ("get", "%s/%s" % (lease, RELEASE), "-n", "team-a"),
            ("get", "%s/%s" % (lease, RELEASE), "-n", "kube-node-lease"),
            # Events: created only.
            ("get", "events") + team,
            ("list", "events") + team,
            ("patch", "events") + team,
            # Nothing of the operator's.
            ("create", "pods") + team,
            ("delete", "pods") + team,
            ("list", "pods") + team,
            ("get", "pods", "--subresource=log") + team,
            ("create", "services") + team,
            ("get", "secrets") + team,
            ("list", "secrets") + team,
            ("create", "secrets") + team,
            ("get", "secrets", "-n", NS),
            ("get", "configmaps") + team,
            ("get", "nodes"),
            ("list", "namespaces"),
            ("update", tj, "--subresource=finalizers") + team,
            ("create", "rolebindings.rbac.authorization.k8s.io") + team,
        ]
        wrong = ["%s: %s" % (" ".join(a), "yes") for a in forbidden
                 if self.can_i(*a, user=WATCHDOG_USER) != "no"]
        wrong += ["%s: %s" % (" ".join(a), "no") for a in allowed
                  if self.can_i(*a, user=WATCHDOG_USER) != "yes"]
        self.assertEqual(wrong, [])
        self.assertIn("The status watchdog: Deployment %s-status-watchdog" % RELEASE, self.notes)

    def test_network_policies_as_the_server_stores_them(self):
        manifest = [d for d in self.manifest() if d["kind"] == "NetworkPolicy"]
        self.assertEqual(sorted(d["metadata"]["namespace"] for d in manifest), list(TEAMS))
        for rendered in manifest:
            stored = json.loads(self.kubectl_ok(
                "get", "networkpolicy", rendered["metadata"]["name"], "-n",
                rendered["metadata"]["namespace"], "-o", "json"))
            self.assertEqual(stored["spec"], rendered["spec"])
        self.assertIn("NetworkPolicy %s-agent-status in team-a, team-b" % RELEASE, self.notes)
        self.assertNotIn("no NetworkPolicy was made", self.notes)

    def test_every_rendering_is_valid_for_the_server(self):
        for helm in ("helm3", "helm4"):
            for port in (1, 2, 9400, 65534, 65535):
                rendered = self.cluster.helm(
                    helm, "template", RELEASE, self.chart, "-n", NS,
                    "--set", "networkPolicy.namespaces={team-a}",
                    "--set", "operator.agentStatusPort=%d" % port,
                    "--set", "rbac.protectedNamespaces={kube-system,kube-public}",
                    "--show-only", "templates/networkpolicy.yaml",
                    "--show-only", "templates/admissionpolicy.yaml")
                code, out = self.cluster.kubectl("apply", "--dry-run=server", "-f", "-",
                                                 stdin=rendered)
                self.assertEqual(code, 0, "%s, port %d:\n%s" % (helm, port, out))
                self.assertIn("networkpolicy.networking.k8s.io/%s-agent-status" % RELEASE, out)
                self.assertIn("validatingadmissionpolicy.admissionregistration.k8s.io/" + POLICY,
                              out)

    def test_notes_say_when_no_network_policy_was_made(self):
        out = self.cluster.helm(args().helm, "install", "other", self.chart, "-n", "monitoring",
                                "--dry-run=server", *cluster_fixture.PARK_PODS)
        self.assertIn("WARNING: no NetworkPolicy was made", out)
        self.assertIn("--set 'networkPolicy.namespaces={team-a,team-b}'", out)

    def manifest(self):
        import yaml
        out = self.cluster.helm(args().helm, "get", "manifest", RELEASE, "-n", NS)
        return [d for d in yaml.safe_load_all(out) if d]


if __name__ == "__main__":
    cluster_fixture.main(required=("--helm",))
