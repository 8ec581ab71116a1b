"""A TrainingJob with spec.scheduling.gang kueue waits Queued for Kueue's admission on the real
control plane (issue 40): the real spawnpoint-operator labels the job's pods as a Kueue pod
group, the real Kueue v0.19 (scripts/cluster.sh up --kueue) gates and admits them, the local
nodes run them with the real agent and the example trainer. Two local nodes of 1
`nvidia.com/gpu`, a ClusterQueue with a quota of 1 GPU; two jobs of 1 node x 1 GPU. The first
is admitted and runs; the second's pod keeps Kueue's gate and no node (the GPU on the second
node stays free), and the job shows phase Queued with the condition Queued
(WaitingForAdmission), as our operator wrote it, past the operator's pending timeout, with no
PodPending; once the first succeeds Kueue admits the second, whose Queued condition turns
False (Admitted), and it succeeds too. Without Kueue both pods would run at once (two free
GPUs); without the operator's admission step the second job would show Pending.

    python3 test_kueue_job_on_real_server.py --source-dir REPO --build-dir BUILD [unittest args]
"""

import calendar
import json
import os
import tempfile
import time
import unittest

import gang_fixture
from gang_fixture import condition, gates

GATE = "kueue.x-k8s.io/admission"
NS = "team"
DEADLINE_S = 240
PENDING_TIMEOUT_S = 5  # the operator's --pending-timeout: the queued job waits past it


def args():
    return gang_fixture.cluster_fixture.ARGS


def training_job(name, port, build_dir, release=None):
    """A 1-node CPU job whose pod asks 1 nvidia.com/gpu, queued in LocalQueue team-queue; with
    `release`, its rank starts training once that file exists (the test's signal)."""
    trainer = [os.path.join(build_dir, "bin", "spawnpoint-example-trainer"), "--epochs", "1",
               "--steps-per-epoch", "5", "--batch-size", "8", "--data", "memory"]
    command = {"command": trainer[:1], "args": trainer[1:]}
    if release:
        command = {"command": ["bash", "-c",
                               'while [ ! -e "$0" ]; do sleep 0.1; done; exec "$@"',
                               release] + trainer}
    container = {"name": "trainer", "image": "spawnpoint/example-trainer:latest",
                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    container.update(command)
    return {
        "apiVersion": "spawnpoint.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodes": 1, "gpusPerNode": 0, "procsPerNode": 1, "backend": "gloo",
            "scheduling": {"gang": "kueue", "queue": "team-queue"},
            "template": {"spec": {"terminationGracePeriodSeconds": 5,
                                  "containers": [container]}},
            "loader": {"workersPerRank": 0},
            "restartPolicy": {"maxRestarts": 0},
            "rendezvous": {"port": port},
            "shmSize": "64Mi",
            "runPolicy": {"cleanPodPolicy": "None"}}}


class KueueJobOnRealServerTest(gang_fixture.GangTest):
    DEADLINE_S = DEADLINE_S
    LOGS = (("operator", 3000), ("kueue", 3000))

    @classmethod
    def setUpClass(cls):
        cls.cluster = gang_fixture.GangCluster(args().source_dir, args().tools_bin, nodes=2,
                                               gpus=1, kueue=True)
        cls.tmp = tempfile.mkdtemp(prefix="spawnpoint-kueue-job-test-")
        try:
            cls.cluster.gpu_queue(NS, quota=1, deadline_s=DEADLINE_S)
            cls.cluster.start_operator(args().build_dir,
                                       args=["--pending-timeout", "%ds" % PENDING_TIMEOUT_S])
        except BaseException:
            cls.tearDownClass()  # unittest runs none after a failed setUpClass
            raise



    def pod(self, job):
        return self.cluster.get("pod", "-n", NS, job + "-node-0")

    def job(self, name):
        return self.cluster.get("tj", "-n", NS, name)

    def phase(self, name):
        return ((self.job(name) or {}).get("status") or {}).get("phase")

    def printed_phase(self, name):
        """The PHASE column of `kubectl get tj` (the CRD's printer column)."""
        code, out = self.cluster.kubectl("get", "tj", "-n", NS, name, "--no-headers")
        self.assertEqual(code, 0, out)
        return out.split()[1]

    def test_second_job_is_queued_gated_until_the_first_succeeds(self):
        release = os.path.join(self.tmp, "release-first")
        self.cluster.apply([training_job("first", gang_fixture.cluster_fixture.free_port(),
                                         args().build_dir, release)])
        self.wait("the first job Running", lambda: self.phase("first") == "Running")
        first = self.pod("first")
        self.assertEqual(gates(first), [], "Kueue admitted the first and removed its gate")
        self.assertEqual(first["metadata"]["labels"].get("kueue.x-k8s.io/managed"), "true",
                         "Kueue's webhook saw the operator's pod")

        self.cluster.apply([training_job("second", gang_fixture.cluster_fixture.free_port(),
                                         args().build_dir)])
        # Kueue holds it (no quota left): gated, no node, though the second node's GPU is
        # free; the operator shows the job Queued.
        self.wait("the second job Queued", lambda: self.phase("second") == "Queued")
        status = self.job("second")["status"]
        queued = condition({"status": status}, "Queued")
        self.assertEqual((queued.get("status"), queued.get("reason")),
                         ("True", "WaitingForAdmission"), status)
        self.assertIn("team-queue", queued.get("message", ""))
        self.assertIn(GATE, queued.get("message", ""))
        self.assertEqual(self.printed_phase("second"), "Queued")
        # Kueue's Workload for the group (named after it) has no quota reserved.
        group = self.pod("second")["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"]
        self.wait("the second group's Workload QuotaReserved=False (Pending)", lambda: condition(
            self.cluster.get("workloads.kueue.x-k8s.io", "-n", NS, group),
            "QuotaReserved").get("reason") == "Pending")
        self.assertNotEqual(condition(self.cluster.get("workloads.kueue.x-k8s.io", "-n", NS,
                                                       group), "Admitted").get("status"), "True")

        # Still Queued, gated and unbound past the operator's pending timeout (the first job
        # holds the quota until the test releases it), and never reported PodPending.
        def queued_past_timeout():
            pod = self.pod("second")
            st = self.job("second")["status"]
            self.assertEqual(st.get("phase"), "Queued", st)
            self.assertNotEqual(condition({"status": st}, "Running").get("reason"),
                                "PodPending", st)
            self.assertIn(GATE, gates(pod))
            self.assertIsNone(pod["spec"].get("nodeName"))
            created = calendar.timegm(time.strptime(pod["metadata"]["creationTimestamp"],
                                                    "%Y-%m-%dT%H:%M:%SZ"))
            return time.time() - created > PENDING_TIMEOUT_S + 3
        self.assertTrue(gang_fixture.wait_until(queued_past_timeout, 60))
        code, events = self.cluster.kubectl(
            "get", "events", "-n", NS, "--field-selector", "involvedObject.name=second",
            "-o", "jsonpath={.items[*].reason}")
        self.assertEqual(code, 0, events)
        self.assertIn("Queued", events.split())
        self.assertNotIn("PodPending", events.split())

        # The first is released and succeeds; Kueue admits the second, which runs and succeeds.
        open(release, "w").close()
        self.wait("the first job finished", lambda: self.phase("first") in ("Succeeded",
                                                                             "Failed"))
        self.assertEqual(self.phase("first"), "Succeeded", self.job("first")["status"])
        self.wait("the second job finished", lambda: self.phase("second") in ("Succeeded",
                                                                               "Failed"))
        status = self.job("second")["status"]
        self.assertEqual(status["phase"], "Succeeded", json.dumps(status))
        self.assertEqual(status["restarts"], 0)
        admitted = condition({"status": status}, "Queued")
        self.assertEqual((admitted.get("status"), admitted.get("reason")),
                         ("False", "Admitted"), status)
        self.assertTrue(self.pod("second")["spec"].get("nodeName"))


if __name__ == "__main__":
    gang_fixture.main(build_dir=True)
