"""The Helm chart (charts/spawnpoint) with a real helm (3.17 or 4.1, .tools/bin/helm3 or
helm4) against the real control plane (issue 23): `install` (helm 4 with
its default server-side apply) whose NOTES' example job applies as it stands; the operator
started with the installed Deployment's arguments and only the installed ServiceAccount's
token (a TokenRequest token, as a pod mounts), reconciling the example 2-node job to
Succeeded on local_node.py's nodes in two namespaces while the real API server enforces the
chart's RBAC (the audit log must show no request of the operator's refused); `upgrade` with
changed values, `rollback`, `list`/`status`/`history`; `uninstall`, after which the CRD and
the TrainingJobs stay, as the chart's README says; then a namespace-scoped install watching
two namespaces (watchNamespaces: [team-a, team-b], a Role and RoleBinding in each and no
ClusterRole) whose operator runs a job to Succeeded in each, never touches a job in a third
namespace (no status, no pod, no request of its own there), and may not read or write pods
elsewhere (`kubectl auth can-i` as its ServiceAccount: no in team-c and kube-system).

The Deployment's own pods cannot run here (the local node runs commands, not images): the
chart is installed with a node selector no node has, so they stay Pending and the operator
runs beside the cluster as a process, with their arguments and their credentials.

    python3 test_helm_on_real_server.py --source-dir REPO --build-dir BUILD --helm helm3
"""

import base64
import json
import os
import re
import unittest

import cluster_fixture

NS = "spawnpoint-system"
RELEASE = "spawnpoint"
SA_USER = "system:serviceaccount:%s:%s" % (NS, RELEASE)
DEADLINE_S = 300
# The flags of the rendered Deployment the test replaces with its own (cluster_fixture).
LOCAL_FLAGS = ("--metrics-addr", "--health-addr", "--agent-status-port", "--utilisation-interval")


def args():
    return cluster_fixture.ARGS


def monitoring_crd(kind):
    """A prometheus-operator CRD of `kind` with a schema that takes anything."""
    plural = kind.lower() + "s"
    return json.dumps({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": plural + ".monitoring.coreos.com"},
        "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                 "names": {"kind": kind, "listKind": kind + "List", "plural": plural,
                           "singular": kind.lower()},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                     "openAPIV3Schema": {"type": "object",
                                         "x-kubernetes-preserve-unknown-fields": True}}}]}})


class HelmOnRealServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = cluster_fixture.Cluster(args().source_dir, args().tools_bin, nodes=2)
        cls.chart = os.path.join(args().source_dir, "charts", "spawnpoint")
        cls.helm_major = 4 if args().helm.endswith("4") else 3

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    # ---- helpers -------------------------------------------------------------------------

    def helm(self, *argv):
        """helm ARGS (the test's helm) that must succeed: its output."""
        return self.cluster.helm(args().helm, *argv)

    def kubectl(self, *argv, ok=True, kubeconfig=None):
        if kubeconfig:
            argv = ("--kubeconfig", kubeconfig) + argv
        code, out = self.cluster.kubectl(*argv)
        if ok:
            self.assertEqual(code, 0, "kubectl %s:\n%s" % (" ".join(argv), out))
        return code, out

    def kubectl_json(self, *argv):
        return json.loads(self.kubectl(*(argv + ("-o", "json")))[1])

    def wait(self, what, condition, deadline_s=DEADLINE_S, log="operator"):
        if cluster_fixture.wait_until(condition, deadline_s):
            return
        self.fail("%s not within %d s\n%s:\n%s" % (
            what, deadline_s, log, self.cluster.log(log)[-3000:]))

    def manifest_docs(self):
        """The installed release's manifest, as helm keeps it."""
        import yaml
        return [d for d in yaml.safe_load_all(self.helm("get", "manifest", RELEASE,
                                                        "-n", NS)) if d]

    def deployment_args(self):
        """The installed Deployment's arguments, LOCAL_FLAGS left out, and its status-token key
        file (a mounted Secret) a file here holding the installed Secret's key."""
        # The operator's: the status watchdog's Deployment runs the same image with its own
        # arguments (templates/status-watchdog.yaml).
        deployments = [d for d in self.manifest_docs() if d["kind"] == "Deployment" and
                       d["metadata"]["labels"].get("app.kubernetes.io/component") == "operator"]
        self.assertEqual(len(deployments), 1)
        pod = deployments[0]["spec"]["template"]["spec"]
        container = pod["containers"][0]
        out = []
        for a in container.get("args", []):
            if a.startswith(LOCAL_FLAGS):
                continue
            if a.startswith("--status-token-key-file="):
                path = a.split("=", 1)[1]
                mount = [m for m in container["volumeMounts"]
                         if path.startswith(m["mountPath"] + "/")]
                self.assertEqual(len(mount), 1, "the key file %s is a mounted volume" % path)
                volume = [v for v in pod["volumes"] if v["name"] == mount[0]["name"]][0]
                secret = json.loads(self.cluster.kubectl(
                    "get", "secret", "-n", NS, volume["secret"]["secretName"], "-o", "json")[1])
                key = base64.b64decode(secret["data"][path.rsplit("/", 1)[1]])
                self.assertGreaterEqual(len(key), 32, "the chart's status-token key")
                local = os.path.join(self.cluster.dir, "status-token-key")
                with open(local, "wb") as f:
                    f.write(key)
                a = "--status-token-key-file=" + local
            out.append(a)
        return out

    def start_installed_operator(self, name):
        """The operator with the installed Deployment's arguments and the installed
        ServiceAccount's token only."""
        kubeconfig = self.cluster.service_account_kubeconfig(NS, RELEASE)
        return self.cluster.start_operator(args().build_dir, kubeconfig=kubeconfig,
                                           args=self.deployment_args(), name=name, crd=False)

    def stop(self, proc):
        proc.terminate()
        proc.wait(timeout=30)

    def run_example_job(self, namespace, name, log):
        self.apply_example_job(namespace, name)
        self.wait_succeeded(namespace, name, log)

    def apply_example_job(self, namespace, name):
        with open(os.path.join(args().source_dir, "examples", "local-cluster.yaml")) as f:
            manifest = f.read().replace("build/bin/",
                                        os.path.join(args().build_dir, "bin") + "/")
        manifest = manifest.replace("name: local-cluster", "name: " + name, 1)
        # Its own rendezvous port: the cluster tests run side by side on one loopback.
        manifest = re.sub(r"port: \d+", "port: %d" % cluster_fixture.free_port(), manifest, 1)
        self.assertIn("port: ", manifest)
        code, out = self.cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=manifest)
        self.assertEqual(code, 0, out)

    def wait_succeeded(self, namespace, name, log):
        def phase():
            return self.kubectl_json("get", "tj", name, "-n", namespace).get(
                "status", {}).get("phase")
        self.wait("%s/%s Succeeded" % (namespace, name),
                  lambda: phase() in ("Succeeded", "Failed"), log=log)
        self.assertEqual(phase(), "Succeeded",
                         json.dumps(self.kubectl_json("get", "tj", name, "-n", namespace)))

    def operator_events(self):
        """The audit log's events of the operator's requests: its ServiceAccount's, not the
        test's own kubectl checks made with the same token."""
        return [e for e in self.cluster.audit_events()
                if e.get("user", {}).get("username") == SA_USER and
                not e.get("userAgent", "").startswith("kubectl")]

    def denials(self):
        """The operator's requests the API server refused, one per line."""
        return ["%s %s -> %d" % (e.get("verb"), e.get("requestURI"),
                                 e["responseStatus"]["code"])
                for e in self.operator_events()
                if e.get("responseStatus", {}).get("code") in (401, 403)]

    def operator_requests(self):
        return len(self.operator_events())

    def can_i(self, *argv):
        """`kubectl auth can-i --as=<the operator> ARGV`: "yes" or "no"."""
        code, out = self.cluster.kubectl("auth", "can-i", "--as=" + SA_USER, *argv)
        answer = out.strip().splitlines()[-1] if out.strip() else ""
        self.assertIn(answer, ("yes", "no"), out)
        return answer

    # ---- the test --------------------------------------------------------------------------

    def test_lint_install_run_upgrade_rollback_uninstall(self):
        values = os.path.join(self.chart, "ci")
        for namespace in ("ml", "other"):
            self.kubectl("create", "namespace", namespace)

        # install: two replicas, so leader election (and its Lease rules) is on.
        out = self.helm("install", RELEASE, self.chart, "-n", NS, "--create-namespace",
                        "--set", "replicaCount=2", *cluster_fixture.PARK_PODS)
        self.assertIn("STATUS: deployed", out)
        self.assertIn("kubectl -n spawnpoint-system rollout status deployment/spawnpoint", out)
        self.cluster.wait_established("trainingjobs.spawnpoint.dev")
        # The NOTES' example job applies as it stands (server-side dry run: it would need an
        # image to run).
        notes = re.search(r"<<'EOF'\n(.*?)\nEOF\n", out, re.S)
        self.assertIsNotNone(notes, out)
        code, applied = self.cluster.kubectl("apply", "--dry-run=server", "-n", "default",
                                             "-f", "-", stdin=notes.group(1))
        self.assertEqual(code, 0, applied + "\n" + notes.group(1))
        self.assertIn("trainingjob.spawnpoint.dev/hello-ddp created (server dry run)", applied)

        # helm 4 installs with server-side apply (its default), helm 3 with a client-side
        # three-way merge: the managed fields say which.
        deployment = self.kubectl_json("get", "deployment", RELEASE, "-n", NS,
                                       "--show-managed-fields")
        operations = {(m["manager"], m["operation"])
                      for m in deployment["metadata"]["managedFields"]}
        self.assertIn(("helm", "Apply") if self.helm_major == 4 else ("helm", "Update"),
                      operations)

        # Every document of the all-on values is valid for the real server (the monitors'
        # kinds served by a stand-in prometheus-operator CRD, as a cluster with
        # kube-prometheus-stack has them).
        for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
            self.cluster.kubectl("apply", "-f", "-", stdin=monitoring_crd(kind))
            self.cluster.wait_established("%ss.monitoring.coreos.com" % kind.lower())
        self.kubectl("create", "namespace", "monitoring")
        rendered = self.helm("template", RELEASE, self.chart, "-n", NS, "--values",
                             os.path.join(values, "all-on-values.yaml"),
                             "--api-versions", "monitoring.coreos.com/v1")
        code, out = self.cluster.kubectl("apply", "--dry-run=server", "-f", "-",
                                         stdin=rendered)
        self.assertEqual(code, 0, out)
        for kind in ("servicemonitor", "podmonitor", "prometheusrule", "configmap", "deployment"):
            self.assertIn(kind, out)

        releases = json.loads(self.helm("list", "-n", NS, "-o", "json"))
        self.assertEqual([(r["name"], r["status"], str(r["revision"])) for r in releases],
                         [(RELEASE, "deployed", "1")])
        self.assertIn("STATUS: deployed", self.helm("status", RELEASE, "-n", NS))

        # The operator as the installed Deployment runs it: its arguments, its token.
        operator = self.start_installed_operator("operator-cluster")
        self.run_example_job("default", "helm-default", "operator-cluster")
        self.run_example_job("ml", "helm-ml", "operator-cluster")
        self.assertEqual(self.denials(), [],
                         "the operator needed a permission the chart does not grant")
        self.assertGreater(self.operator_requests(), 10,
                           "the server saw the operator as its ServiceAccount")
        self.assertIn("became the leader", self.cluster.log("operator-cluster"))
        # The rules are enforced, and grant nothing beyond what the operator uses.
        sa = self.cluster.service_account_kubeconfig(NS, RELEASE)
        for forbidden in (("get", "secrets", "-A"), ("get", "nodes")):
            code, out = self.kubectl(*forbidden, ok=False, kubeconfig=sa)
            self.assertNotEqual(code, 0, out)
            self.assertIn("Forbidden", out)
        self.stop(operator)

        # upgrade with changed values, then back. The status-token key stays: the running
        # jobs' agents hold tokens derived from it.
        key = self.kubectl_json("get", "secret", RELEASE + "-status-token-key", "-n", NS)["data"]
        self.helm("upgrade", RELEASE, self.chart, "-n", NS, "--reuse-values",
                  "--set", "operator.logLevel=debug")
        self.assertIn("--log-level=debug", self.deployment_args())
        self.assertEqual(self.kubectl_json("get", "secret", RELEASE + "-status-token-key", "-n",
                                           NS)["data"], key, "the upgrade kept the key")
        self.helm("rollback", RELEASE, "1", "-n", NS)
        self.assertIn("--log-level=info", self.deployment_args())
        history = json.loads(self.helm("history", RELEASE, "-n", NS, "-o", "json"))
        self.assertEqual([(h["revision"], h["status"]) for h in history],
                         [(1, "superseded"), (2, "superseded"), (3, "deployed")])
        self.assertIn("Rollback to 1", history[-1]["description"])

        # uninstall: the release's objects go; the CRD and the jobs stay.
        self.helm("uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "120s")
        self.assertEqual(json.loads(self.helm("list", "-n", NS, "-o", "json")), [])
        code, out = self.kubectl("get", "deployment", RELEASE, "-n", NS, ok=False)
        self.assertNotEqual(code, 0, out)
        self.kubectl("get", "crd", "trainingjobs.spawnpoint.dev")
        self.kubectl("get", "tj", "helm-default", "-n", "default")

        # A namespace-scoped install watching two namespaces: a Role and RoleBinding in each,
        # no ClusterRole; its operator handles team-a and team-b and may not look elsewhere.
        teams = ("team-a", "team-b")
        for namespace in teams + ("team-c",):
            self.kubectl("create", "namespace", namespace)
        self.helm("install", RELEASE, self.chart, "-n", NS, "--set", "rbac.scope=namespace",
                  "--set", "watchNamespaces={%s}" % ",".join(teams), *cluster_fixture.PARK_PODS)
        docs = self.manifest_docs()
        self.assertEqual([d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRole"], [],
                         "namespace scope makes no ClusterRole")
        self.assertNotIn("ClusterRoleBinding", {d["kind"] for d in docs})
        for kind in ("Role", "RoleBinding"):
            self.assertEqual(sorted(d["metadata"]["namespace"] for d in docs
                                    if d["kind"] == kind and d["metadata"]["name"] == RELEASE),
                             list(teams), kind)
        self.assertIn("--namespace=team-a,team-b", self.deployment_args())
        # A job in a namespace not watched, there before the operator starts.
        self.apply_example_job("team-c", "helm-unwatched")
        before = len(self.operator_events())
        operator = self.start_installed_operator("operator-namespaced")
        # One after the other: the local nodes' pods share this machine's ports.
        for namespace in teams:
            self.run_example_job(namespace, "helm-" + namespace, "operator-namespaced")
        self.assertEqual(self.denials(), [],
                         "the operator needed a permission the chart does not grant")
        # Its requests on jobs, pods, services, secrets and events were all in team-a or
        # team-b: one watch per namespace, none across the cluster, none in team-c.
        elsewhere = ["%s %s" % (e.get("verb"), e.get("requestURI"))
                     for e in self.operator_events()[before:]
                     if e.get("objectRef", {}).get("resource") in (
                         "trainingjobs", "pods", "services", "secrets", "events") and
                     e["objectRef"].get("namespace") not in teams]
        self.assertEqual(elsewhere, [], "requests outside the watched namespaces")
        self.assertGreater(len(self.operator_events()) - before, 10)
        # The unwatched job: never seen, so no status, no pod.
        unwatched = self.kubectl_json("get", "tj", "helm-unwatched", "-n", "team-c")
        self.assertNotIn("status", unwatched, json.dumps(unwatched))
        self.assertEqual(self.kubectl_json("get", "pods", "-n", "team-c")["items"], [])
        self.assertNotIn("team-c", self.cluster.log("operator-namespaced"))
        code, out = self.kubectl("get", "pods", "-n", "default", ok=False,
                                 kubeconfig=self.cluster.service_account_kubeconfig(NS, RELEASE))
        self.assertNotEqual(code, 0, "no rights outside the watched namespaces")
        self.assertIn("Forbidden", out)
        for namespace in teams:
            for verb in ("list", "watch", "create", "delete"):
                self.assertEqual(self.can_i(verb, "pods", "-n", namespace), "yes",
                                 (verb, namespace))
        for namespace in ("team-c", "kube-system", NS):
            for verb in ("get", "list", "watch", "create", "delete"):
                for resource in ("pods", "services", "trainingjobs.spawnpoint.dev"):
                    self.assertEqual(self.can_i(verb, resource, "-n", namespace), "no",
                                     (verb, resource, namespace))
            self.assertEqual(self.can_i("create", "secrets", "-n", namespace), "no", namespace)
        self.assertEqual(self.can_i("list", "pods", "--all-namespaces"), "no")
        self.stop(operator)
        self.helm("uninstall", RELEASE, "-n", NS)

if __name__ == "__main__":
    cluster_fixture.main(build_dir=True, required=("--helm",))
