"""The kubectl acceptance suite on the real control plane (issue 23), run once with the
oldest kubectl we claim (.tools/bin/kubectl, 1.32) and once with the newest
(.tools/bin/kubectl-1.35): what a user types against our CRD must work with both. Apply and
re-apply, the printer columns by short name, `get -w` seeing an update, patch, label
selectors and delete, `explain`, `describe`, a 422 in kubectl's usual words, strict and
warn field validation, `apply --server-side` with a second field manager's conflicting apply
refused naming the field and taken with `--force-conflicts`, `wait --for=condition=` on a
status written through the status subresource; and RBAC as a ServiceAccount sees it: `auth
can-i`, `auth whoami`, `create token`, and a Forbidden for what its Role does not grant.

    python3 test_kubectl_on_real_server.py --source-dir REPO --kubectl kubectl-1.35
"""

import json
import os
import subprocess
import time
import unittest

import cluster_fixture

CLUSTER = {}

JOB = """\
apiVersion: spawnpoint.dev/v1alpha1
kind: TrainingJob
metadata: {name: %(name)s, namespace: %(ns)s}
spec:
  nodes: %(nodes)d
  procsPerNode: 2
  template: {spec: {containers: [{name: trainer, image: example.invalid/trainer}]}}
"""


def args():
    return cluster_fixture.ARGS


def setUpModule():
    CLUSTER["cluster"] = cluster_fixture.Cluster(args().source_dir, args().tools_bin,
                                                 kubectl=args().kubectl)
    CLUSTER["cluster"].apply_crd()


def tearDownModule():
    if "cluster" in CLUSTER:
        CLUSTER["cluster"].stop()


class KubectlOnRealServerTest(unittest.TestCase):
    count = 0

    def setUp(self):
        KubectlOnRealServerTest.count += 1
        self.ns = "kubectl-%d" % KubectlOnRealServerTest.count
        self.ok("create", "namespace", self.ns)

    def kubectl(self, *argv, stdin=None):
        return CLUSTER["cluster"].kubectl(*argv, stdin=stdin)

    def ok(self, *argv, stdin=None):
        code, out = self.kubectl(*argv, stdin=stdin)
        self.assertEqual(code, 0, "kubectl %s:\n%s" % (" ".join(argv), out))
        return out

    def fails(self, *argv, stdin=None):
        code, out = self.kubectl(*argv, stdin=stdin)
        self.assertNotEqual(code, 0, "kubectl %s succeeded:\n%s" % (" ".join(argv), out))
        return out

    def job(self, name, nodes=2):
        return JOB % {"name": name, "ns": self.ns, "nodes": nodes}

    def test_the_client_is_the_one_asked_for(self):
        out = self.ok("version", "-o", "json")
        # (kubectl 1.32 adds a version-skew warning after the document)
        client = json.JSONDecoder().raw_decode(out[out.index("{"):])[0]["clientVersion"]
        want = "35" if args().kubectl.endswith("1.35") else "32"
        self.assertEqual(client["minor"], want, out)

    def test_apply_reapply_columns_by_short_name_patch_select_delete(self):
        self.assertEqual(self.ok("apply", "-f", "-", stdin=self.job("a")).strip(),
                         "trainingjob.spawnpoint.dev/a created")
        self.assertEqual(self.ok("apply", "-f", "-", stdin=self.job("a")).strip(),
                         "trainingjob.spawnpoint.dev/a unchanged")
        lines = self.ok("get", "tj", "-n", self.ns).splitlines()
        self.assertEqual(lines[0].split(), ["NAME", "PHASE", "NODES", "GPUS", "RESTARTS",
                                            "GPU-UTIL", "DATA-STALL", "STALLED", "UPDATED",
                                            "STALE", "AGE"])
        self.assertEqual(lines[1].split()[:2], ["a", "2"])
        self.ok("patch", "tj", "a", "-n", self.ns, "--type", "merge", "-p",
                '{"metadata":{"labels":{"team":"ml"}},"spec":{"nodes":3}}')
        self.assertEqual(self.ok("get", "tj", "-n", self.ns, "-l", "team=ml", "-o",
                                 "name").strip(), "trainingjob.spawnpoint.dev/a")
        self.assertEqual(self.ok("get", "tj", "a", "-n", self.ns, "-o",
                                 "jsonpath={.spec.nodes}"), "3")
        self.assertEqual(self.ok("get", "tj", "-n", self.ns, "-l", "team=other").strip(),
                         "No resources found in %s namespace." % self.ns)
        self.assertIn('"a" deleted', self.ok("delete", "tj", "a", "-n", self.ns))
        self.assertIn("NotFound", self.fails("get", "tj", "a", "-n", self.ns))

    def test_get_watch_sees_an_update(self):
        self.ok("apply", "-f", "-", stdin=self.job("watched"))
        cluster = CLUSTER["cluster"]
        watch = subprocess.Popen(
            [os.path.join(cluster.tools, args().kubectl), "--kubeconfig", cluster.kubeconfig,
             "get", "tj", "-n", self.ns, "-w", "-o", "custom-columns=NAME:.metadata.name,"
             "NODES:.spec.nodes", "--no-headers"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
            env=dict(os.environ, HOME=cluster.home))
        try:
            self.assertEqual(watch.stdout.readline().split(), ["watched", "2"])
            self.ok("patch", "tj", "watched", "-n", self.ns, "--type", "merge", "-p",
                    '{"spec":{"nodes":4}}')
            self.assertEqual(watch.stdout.readline().split(), ["watched", "4"])
        finally:
            watch.kill()
            watch.wait()

    def test_explain_and_describe(self):
        out = self.ok("explain", "tj.spec.loader.pythonPool")
        self.assertRegex(out, r"KIND:\s+TrainingJob")
        self.assertIn("FIELD: pythonPool <boolean>", out)
        out = self.ok("explain", "tj.spec.restartPolicy.mode")
        self.assertIn("FIELD: mode <string>", out)
        self.assertRegex(out, r"ENUM:\s+InPlace\s+Recreate")
        self.assertIn("InPlace (default): the pods stay", out)
        self.ok("apply", "-f", "-", stdin=self.job("described"))
        out = self.ok("describe", "tj", "described", "-n", self.ns)
        for pattern in (r"Name:\s+described\n", r"Kind:\s+TrainingJob\n", r"\n  Nodes:\s+2\n",
                        r"\n  Procs Per Node:\s+2\n", r"Preload Modules:\n\s+torch\n\s+__main__\n"):
            self.assertRegex(out, pattern)

    def test_invalid_and_unknown_fields(self):
        out = self.fails("apply", "-f", "-", stdin=self.job("bad", nodes=0))
        self.assertIn('The TrainingJob "bad" is invalid', out)
        self.assertIn("spec.nodes: Invalid value: 0: spec.nodes in body should be greater "
                      "than or equal to 1", out)
        typo = self.job("typo").replace("procsPerNode", "procsPerNod")
        out = self.fails("apply", "-f", "-", stdin=typo)
        self.assertIn('unknown field "spec.procsPerNod"', out)
        out = self.ok("apply", "--validate=warn", "-f", "-", stdin=typo)
        self.assertIn('Warning: unknown field "spec.procsPerNod"', out)
        self.assertIn("trainingjob.spawnpoint.dev/typo created", out)

    def test_server_side_apply_conflicts_name_the_field(self):
        out = self.ok("apply", "--server-side", "-f", "-", stdin=self.job("ssa"))
        self.assertIn("trainingjob.spawnpoint.dev/ssa serverside-applied", out)
        other = self.job("ssa", nodes=5)
        out = self.fails("apply", "--server-side", "--field-manager", "platform-team", "-f",
                         "-", stdin=other)
        self.assertIn("conflict", out.lower())
        self.assertIn(".spec.nodes", out)
        self.assertIn("kubectl", out)  # the manager that owns it
        self.assertEqual(self.ok("get", "tj", "ssa", "-n", self.ns, "-o",
                                 "jsonpath={.spec.nodes}"), "2", "a conflict changes nothing")
        out = self.ok("apply", "--server-side", "--field-manager", "platform-team",
                      "--force-conflicts", "-f", "-", stdin=other)
        self.assertIn("serverside-applied", out)
        self.assertEqual(self.ok("get", "tj", "ssa", "-n", self.ns, "-o",
                                 "jsonpath={.spec.nodes}"), "5")

    def test_wait_for_a_condition_written_through_the_status_subresource(self):
        self.ok("apply", "-f", "-", stdin=self.job("waited"))
        cluster = CLUSTER["cluster"]
        wait = subprocess.Popen(
            [os.path.join(cluster.tools, args().kubectl), "--kubeconfig", cluster.kubeconfig,
             "wait", "tj/waited", "-n", self.ns, "--for=condition=Succeeded", "--timeout=120s"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
            env=dict(os.environ, HOME=cluster.home))
        try:
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            self.ok("patch", "tj", "waited", "-n", self.ns, "--subresource=status", "--type",
                    "merge", "-p", json.dumps({"status": {"phase": "Succeeded", "conditions": [{
                        "type": "Succeeded", "status": "True", "reason": "AllRanksSucceeded",
                        "message": "done", "lastTransitionTime": now}]}}))
            out, _ = wait.communicate(timeout=150)
        finally:
            if wait.poll() is None:
                wait.kill()
                wait.wait()
        self.assertEqual(wait.returncode, 0, out)
        self.assertIn("trainingjob.spawnpoint.dev/waited condition met", out)

    def test_a_service_accounts_rights_are_what_its_role_grants(self):
        ns = self.ns
        self.ok("create", "serviceaccount", "reader", "-n", ns)
        self.ok("create", "role", "tj-reader", "-n", ns, "--verb=get,list,watch",
                "--resource=trainingjobs.spawnpoint.dev")
        self.ok("create", "rolebinding", "tj-reader", "-n", ns, "--role=tj-reader",
                "--serviceaccount=%s:reader" % ns)
        self.ok("apply", "-f", "-", stdin=self.job("guarded"))
        user = "system:serviceaccount:%s:reader" % ns
        self.assertEqual(self.ok("auth", "can-i", "list", "tj", "-n", ns, "--as", user).strip(),
                         "yes")
        code, out = self.kubectl("auth", "can-i", "delete", "tj", "-n", ns, "--as", user)
        self.assertEqual((code, out.strip()), (1, "no"))
        kubeconfig = CLUSTER["cluster"].service_account_kubeconfig(ns, "reader")
        out = self.ok("--kubeconfig", kubeconfig, "auth", "whoami")
        self.assertIn(user, out)
        self.assertEqual(self.ok("--kubeconfig", kubeconfig, "get", "tj", "guarded", "-n", ns,
                                 "-o", "name").strip(), "trainingjob.spawnpoint.dev/guarded")
        out = self.fails("--kubeconfig", kubeconfig, "delete", "tj", "guarded", "-n", ns)
        self.assertIn("Forbidden", out)
        self.assertIn('cannot delete resource "trainingjobs"', out)
        out = self.fails("create", "token", "nobody", "-n", ns)
        self.assertIn('serviceaccounts "nobody" not found', out)


if __name__ == "__main__":
    cluster_fixture.main(required=("--kubectl",))
