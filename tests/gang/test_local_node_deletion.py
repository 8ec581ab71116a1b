"""The local node (tests/cluster/local_node.py) deletes pods as a kubelet does, finalizers
included (issue 40: Kueue puts kueue.x-k8s.io/managed on every pod it manages and takes it
off only once the pod is terminal). On the real control plane (scripts/cluster.sh), a pod
with a finalizer that is deleted:
- its process gets SIGTERM (and SIGKILL after deletionGracePeriodSeconds when it ignores it),
- the pod reports a terminal phase with the exit code, then the node's DELETE (grace 0),
- the API server keeps it, terminal, while the finalizer stays; it goes once it is removed,
- a condition another writer set (Kueue's TerminationTarget) survives the node's reports;
a bound pod deleted while its node was down is reported Failed, never run; and a pod with a
container that has no command (an image-only Deployment) stays Pending, never Failed, so its
ReplicaSet makes one pod, not one after another.

    python3 test_local_node_deletion.py --source-dir REPO [unittest args]
"""

import json
import os
import tempfile
import unittest

import gang_fixture
from gang_fixture import condition

NS = "default"
HOLD = "spawnpoint.dev/test-hold"
DEADLINE_S = 120

# Writes argv[1] once its SIGTERM handler is in place; on SIGTERM writes argv[2] and exits 7,
# or (argv[3] == "ignore") ignores it.
SCRIPT = """
import os, signal, sys, time
def term(signum, frame):
    open(sys.argv[2], "w").close()
    os._exit(7)
signal.signal(signal.SIGTERM, signal.SIG_IGN if sys.argv[3] == "ignore" else term)
open(sys.argv[1], "w").close()
while True:
    time.sleep(0.1)
"""


def args():
    return gang_fixture.cluster_fixture.ARGS


class LocalNodeDeletionTest(gang_fixture.GangTest):
    DEADLINE_S = DEADLINE_S
    POLL_S = 0.2
    LOGS = (("local-node", 3000),)

    @classmethod
    def setUpClass(cls):
        cls.cluster = gang_fixture.GangCluster(args().source_dir, args().tools_bin, nodes=1)
        cls.tmp = tempfile.mkdtemp(prefix="spawnpoint-deletion-test-")



    def pod(self, name, on_term="exit", node=None):
        started = os.path.join(self.tmp, name + ".started")
        termed = os.path.join(self.tmp, name + ".sigterm")
        spec = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 30,
                "containers": [{"name": "main", "image": "none",
                                "command": ["python3", "-c", SCRIPT, started, termed, on_term]}]}
        if node:
            spec["nodeName"] = node
        made = self.cluster.apply([{"apiVersion": "v1", "kind": "Pod",
                                    "metadata": {"name": name, "namespace": NS,
                                                 "finalizers": [HOLD]},
                                    "spec": spec}])[0]
        return made, started, termed

    def get(self, name):
        return self.cluster.get("pod", "-n", NS, name)

    def kubectl(self, *argv):
        code, out = self.cluster.kubectl(*argv)
        self.assertEqual(code, 0, out)
        return out

    def release(self, name):
        """Takes the finalizer off; the pod must then go."""
        self.kubectl("patch", "pod", "-n", NS, name, "--type", "merge", "-p",
                     json.dumps({"metadata": {"finalizers": None}}))
        self.wait("pod %s gone once its finalizer is off" % name, lambda: self.get(name) is None)

    def terminated(self, name):
        pod = self.get(name)
        statuses = pod["status"].get("containerStatuses") or [{}]
        return pod, statuses[0].get("state", {}).get("terminated")

    def test_deleted_pod_terminates_reports_failed_and_waits_for_its_finalizer(self):
        _, started, termed = self.pod("graceful")
        self.wait("the pod's process started", lambda: os.path.exists(started))
        # What Kueue does before it deletes a pod it preempts: a condition of its own.
        self.kubectl("patch", "pod", "-n", NS, "graceful", "--subresource", "status",
                     "--type", "strategic", "-p", json.dumps({"status": {"conditions": [
                         {"type": "TerminationTarget", "status": "True", "reason": "Test",
                          "message": "set by the test"}]}}))
        self.kubectl("delete", "pod", "-n", NS, "graceful", "--wait=false")

        def terminal_and_deleted_by_node():
            pod, state = self.terminated("graceful")
            return (pod["status"].get("phase") == "Failed" and state is not None and
                    pod["metadata"].get("deletionGracePeriodSeconds") == 0)
        self.wait("the pod Failed and the node's DELETE (grace 0) done",
                  terminal_and_deleted_by_node)
        pod, state = self.terminated("graceful")
        self.assertTrue(os.path.exists(termed), "the process never got SIGTERM")
        self.assertEqual(state["exitCode"], 7, state)
        self.assertEqual(pod["metadata"]["finalizers"], [HOLD])
        self.assertEqual(condition(pod, "TerminationTarget").get("reason"), "Test", pod["status"])
        self.assertEqual(condition(pod, "Ready").get("status"), "False")
        self.release("graceful")

    def test_process_that_ignores_sigterm_is_killed_after_the_grace_period(self):
        _, started, termed = self.pod("stubborn", on_term="ignore")
        self.wait("the pod's process started", lambda: os.path.exists(started))
        self.kubectl("delete", "pod", "-n", NS, "stubborn", "--wait=false", "--grace-period=1")
        self.wait("the pod Failed", lambda: self.get("stubborn")["status"].get("phase") == "Failed")
        pod, state = self.terminated("stubborn")
        self.assertEqual((state["exitCode"], state.get("signal")), (137, 9), state)
        self.assertIsNotNone(self.get("stubborn"))  # kept: the finalizer is on
        self.release("stubborn")

    def test_pod_deleted_while_its_node_was_down_is_reported_failed_never_run(self):
        node = self.cluster.add_node("late-node-", gpus=0, name="late-node")
        node.terminate()
        node.wait(timeout=30)
        made, started, _ = self.pod("orphan", node="late-node-0")
        self.kubectl("delete", "pod", "-n", NS, "orphan", "--wait=false")
        self.assertIsNotNone(self.get("orphan")["metadata"].get("deletionTimestamp"))
        self.cluster.add_node("late-node-", gpus=0, name="late-node-again")
        self.wait("the orphan Failed and the node's DELETE (grace 0) done", lambda: (
            self.get("orphan")["status"].get("phase") == "Failed" and
            self.get("orphan")["metadata"].get("deletionGracePeriodSeconds") == 0))
        self.assertFalse(os.path.exists(started), "the deleted pod was run")
        self.assertEqual(self.get("orphan")["metadata"]["uid"], made["metadata"]["uid"])
        self.release("orphan")

    def test_an_image_only_deployment_keeps_one_pending_pod(self):
        """The chart's operator Deployment (its image's entry point, no command) on the local
        node: its pod stays Pending with the reason, never Failed, so its ReplicaSet does not
        replace it (issue 41: 318 failed pods in 30 s)."""
        labels = {"app": "image-only"}
        self.cluster.apply([{"apiVersion": "apps/v1", "kind": "Deployment",
                             "metadata": {"name": "image-only", "namespace": NS},
                             "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                                      "template": {"metadata": {"labels": labels},
                                                   "spec": {"containers": [{
                                                       "name": "operator",
                                                       "image": "ghcr.io/x/operator:1",
                                                       "args": ["--log-level=info"]}]}}}}])

        def pods():
            return self.cluster.get("pods", "-n", NS, "-l", "app=image-only")["items"]

        def waiting():
            for pod in pods():
                for cs in pod["status"].get("containerStatuses") or []:
                    state = cs.get("state", {}).get("waiting") or {}
                    if state.get("reason") == "ImageNotRunnable":
                        return pod
            return None
        self.wait("the pod waits with reason ImageNotRunnable", waiting)
        pod = waiting()
        self.assertEqual(pod["status"]["phase"], "Pending")
        message = pod["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
        self.assertIn("runs commands, not images", message)
        # Its status is written: a ReplicaSet would have replaced a Failed pod by now.
        self.assertEqual([p["metadata"]["name"] for p in pods()], [pod["metadata"]["name"]])
        self.kubectl("delete", "deployment", "-n", NS, "image-only")
        self.wait("the pod gone with its Deployment", lambda: not pods())


if __name__ == "__main__":
    gang_fixture.main()
