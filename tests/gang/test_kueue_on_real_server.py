"""Kueue v0.19 admits plain-pod groups whole on the real control plane (issue 40): scripts/
cluster.sh up --kueue (the real Kueue, its pod webhook on loopback, scripts/gang.sh), two
local nodes of 2 `nvidia.com/gpu` each. A ClusterQueue with a quota of 4 GPUs, a
ResourceFlavor and a LocalQueue; two groups of 3 pods x 1 GPU (label
kueue.x-k8s.io/queue-name and kueue.x-k8s.io/pod-group-name, annotation
kueue.x-k8s.io/pod-group-total-count). Every assertion is on what Kueue wrote: the gate,
finalizer and label its webhook put on each pod, the Workloads' conditions, the gate it
removes; so without Kueue (or with its webhook not called) every one fails.

    python3 test_kueue_on_real_server.py --source-dir REPO [unittest args]
"""

import os
import tempfile
import unittest

import gang_fixture
from gang_fixture import condition, gates

GATE = "kueue.x-k8s.io/admission"
FINALIZER = "kueue.x-k8s.io/managed"
NS = "team"
DEADLINE_S = 180  # Kueue reconciles and the local node starts python3 on a loaded machine


def args():
    return gang_fixture.cluster_fixture.ARGS


def group(name, count, release, queue="team-queue", gpus=1):
    """`count` pods of group `name`, each asking for `gpus` GPUs; each runs until the file
    `release` exists (the test's signal to finish), then exits 0."""
    script = ("import os, sys, time\n"
              "while not os.path.exists(sys.argv[1]):\n"
              "    time.sleep(0.1)\n")
    pods = []
    for i in range(count):
        pods.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "%s-%d" % (name, i), "namespace": NS,
                         "labels": {"kueue.x-k8s.io/queue-name": queue,
                                    "kueue.x-k8s.io/pod-group-name": name},
                         "annotations": {"kueue.x-k8s.io/pod-group-total-count": str(count)}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
                     "containers": [{"name": "main", "image": "none",
                                     "command": ["python3", "-c", script, release],
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}})
    return pods


class KueueOnRealServerTest(gang_fixture.GangTest):
    DEADLINE_S = DEADLINE_S
    LOGS = (("kueue", 4000), ("local-node", 2000))

    @classmethod
    def setUpClass(cls):
        cls.cluster = gang_fixture.GangCluster(args().source_dir, args().tools_bin, nodes=2,
                                               gpus=2, kueue=True)
        cls.tmp = tempfile.mkdtemp(prefix="spawnpoint-kueue-test-")
        try:
            cls.set_up_queues()
        except BaseException:
            cls.tearDownClass()  # unittest does not when setUpClass fails
            raise

    @classmethod
    def set_up_queues(cls):
        cls.cluster.gpu_queue(NS, quota=4, deadline_s=DEADLINE_S)



    def pods(self, name):
        listing = self.cluster.get("pods", "-n", NS, "-l", "kueue.x-k8s.io/pod-group-name=" + name)
        return sorted(listing["items"], key=lambda p: p["metadata"]["name"])

    def workload(self, name):
        """The Workload Kueue made for pod group `name` (named after the group)."""
        return self.cluster.get("workloads.kueue.x-k8s.io", "-n", NS, name)

    def assert_gated_by_webhook(self, made):
        for pod in made:
            meta = pod["metadata"]
            self.assertIn(GATE, gates(pod), meta["name"])
            self.assertIn(FINALIZER, meta.get("finalizers", []), meta["name"])
            self.assertEqual(meta["labels"].get("kueue.x-k8s.io/managed"), "true", meta["name"])
            self.assertNotIn("nodeName", pod["spec"], meta["name"])

    def test_second_group_waits_whole_until_the_first_succeeds(self):
        release_a = os.path.join(self.tmp, "release-a")
        release_b = os.path.join(self.tmp, "release-b")
        made = self.cluster.apply(group("group-a", 3, release_a))
        # Kueue's pod webhook gated each pod at creation (the object the server stored).
        self.assert_gated_by_webhook(made)
        self.wait("group-a's Workload Admitted", lambda: condition(
            self.workload("group-a"), "Admitted").get("status") == "True")
        made = self.cluster.apply(group("group-b", 3, release_b))
        self.assert_gated_by_webhook(made)

        # group-a: admitted, ungated by Kueue, bound by kube-scheduler, run by the node.
        self.wait("group-a's 3 pods Running, ungated, on nodes", lambda: [
            (p["status"].get("phase"), gates(p), bool(p["spec"].get("nodeName")))
            for p in self.pods("group-a")] == [("Running", [], True)] * 3)
        wl_a = self.workload("group-a")
        self.assertEqual(condition(wl_a, "QuotaReserved").get("status"), "True")
        self.assertEqual(wl_a["status"]["admission"]["clusterQueue"], "gpus")

        # group-b: Kueue looked at it and had no quota: QuotaReserved False, Pending, with
        # its reason; the pods keep the gate and no node (no GPU held).
        def b_pending():
            reserved = condition(self.workload("group-b"), "QuotaReserved")
            return reserved.get("status") == "False" and reserved.get("reason") == "Pending"
        self.wait("group-b's Workload QuotaReserved=False (Pending)", b_pending)
        wl_b = self.workload("group-b")
        reserved = condition(wl_b, "QuotaReserved")
        self.assertIn("insufficient", reserved.get("message", ""), reserved)
        self.assertNotEqual(condition(wl_b, "Admitted").get("status"), "True")
        for pod in self.pods("group-b"):
            self.assertIn(GATE, gates(pod), pod["metadata"]["name"])
            self.assertNotIn("nodeName", pod["spec"], pod["metadata"]["name"])
            self.assertEqual(pod["status"].get("phase"), "Pending")

        # group-a finishes: its Workload Finished, Kueue drops its finalizers, and group-b is
        # admitted, ungated, bound and run.
        open(release_a, "w").close()
        self.wait("group-a's pods Succeeded", lambda: [
            p["status"].get("phase") for p in self.pods("group-a")] == ["Succeeded"] * 3)
        self.wait("group-a's Workload Finished", lambda: condition(
            self.workload("group-a"), "Finished").get("status") == "True")
        self.wait("Kueue's finalizer off group-a's pods", lambda: all(
            FINALIZER not in p["metadata"].get("finalizers", []) for p in self.pods("group-a")))
        self.wait("group-b's Workload Admitted", lambda: condition(
            self.workload("group-b"), "Admitted").get("status") == "True")
        self.wait("group-b's 3 pods Running, ungated, on nodes", lambda: [
            (p["status"].get("phase"), gates(p), bool(p["spec"].get("nodeName")))
            for p in self.pods("group-b")] == [("Running", [], True)] * 3)
        open(release_b, "w").close()
        self.wait("group-b's pods Succeeded", lambda: [
            p["status"].get("phase") for p in self.pods("group-b")] == ["Succeeded"] * 3)

    def creation_event(self, namespace, name):
        """The API server's audit event of the creation of pod namespace/name, or None."""
        for event in self.cluster.audit_events():
            ref = event.get("objectRef", {})
            if (event.get("verb"), ref.get("resource"), ref.get("subresource"),
                    ref.get("namespace"), ref.get("name"), event.get("stage")) == (
                    "create", "pods", None, namespace, name, "ResponseComplete"):
                return event
        return None

    def mutating_webhooks_called(self, namespace, name):
        """The mutating webhooks the API server called for the creation of pod
        namespace/name, from its audit log (annotations mutation.webhook.admission.k8s.io/*:
        one per webhook called, mutated or not)."""
        import json
        annotations = self.creation_event(namespace, name).get("annotations") or {}
        return set(json.loads(value)["webhook"] for key, value in annotations.items()
                   if key.startswith("mutation.webhook.admission.k8s.io/"))

    def test_pods_without_a_queue_or_in_kube_system_are_not_gated(self):
        release = os.path.join(self.tmp, "release-plain")
        pods = []
        for name, namespace in (("plain", NS), ("system", "kube-system")):
            pod = group(name, 1, release)[0]
            pod["metadata"].update(namespace=namespace, labels={}, annotations={})
            del pod["spec"]["containers"][0]["resources"]
            pods.append(pod)
        made = self.cluster.apply(pods)
        for pod in made:
            self.assertEqual(gates(pod), [], pod["metadata"])
            self.assertNotIn(FINALIZER, pod["metadata"].get("finalizers", []))
        # Kueue's pod webhook was called for the pod in the test's namespace (and left it
        # alone: no queue name), not for kube-system's (the namespaceSelector).
        self.wait("the audit events of both creations", lambda: all(
            self.creation_event(ns, name) for ns, name in ((NS, "plain-0"),
                                                           ("kube-system", "system-0"))), 30)
        self.assertIn("mpod.kb.io", self.mutating_webhooks_called(NS, "plain-0"))
        self.assertNotIn("mpod.kb.io", self.mutating_webhooks_called("kube-system", "system-0"))
        self.wait("both pods Running", lambda: [
            self.cluster.get("pod", "-n", ns, name)["status"].get("phase")
            for ns, name in ((NS, "plain-0"), ("kube-system", "system-0"))] == ["Running"] * 2)
        open(release, "w").close()
        self.wait("both pods Succeeded", lambda: [
            self.cluster.get("pod", "-n", ns, name)["status"].get("phase")
            for ns, name in ((NS, "plain-0"), ("kube-system", "system-0"))] == ["Succeeded"] * 2)

if __name__ == "__main__":
    gang_fixture.main()
