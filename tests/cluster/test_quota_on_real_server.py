"""A ResourceQuota's refusal is a state of the job, on the real control plane (issue 41): the real
kube-apiserver's ResourceQuota admission, the real spawnpoint-operator, local_node.py's 2 nodes
of 4 `nvidia.com/gpu`, the real agent and the example trainer. Namespace team-a has a quota of
4 GPUs (requests.nvidia.com/gpu); a job of 2 pods x 3 GPUs (6) does not fit. The job is Pending
with the condition QuotaExceeded in the API server's words and a QuotaExceeded event; not one
of its pods is created (a half gang would hold 3 GPUs and its agent would time out waiting for
the other), and it stays so, with no restart. The quota raised to 6, the job is created within
seconds, runs and succeeds with 0 restarts, QuotaExceeded False. The operator's timed retry is
set to 10 minutes here, so only its watch of ResourceQuotas can notice the raise in time.

    python3 test_quota_on_real_server.py --source-dir REPO --build-dir BUILD
"""

import json
import os
import time

import cluster_fixture
from cluster_fixture import wait_until

NS = "team-a"
DEADLINE_S = 180


def args():
    return cluster_fixture.ARGS


class QuotaOnRealServerTest(cluster_fixture.OperatorClusterTest):
    GPUS = 4
    NAMESPACE = NS
    # Out of the test's reach: the raise must be seen through the ResourceQuota watch.
    OPERATOR_ARGS = ("--quota-retry", "10m", "--quota-retry-max", "10m")

    @classmethod
    def setUpCluster(cls):
        cls.apply({"apiVersion": "v1", "kind": "ResourceQuota",
                   "metadata": {"name": "gpu-quota", "namespace": NS},
                   "spec": {"hard": {"requests.nvidia.com/gpu": "4"}}})

    def status(self):
        return self.get("tj", "-n", NS, "wide").get("status") or {}

    def condition(self, kind):
        for c in self.status().get("conditions") or []:
            if c["type"] == kind:
                return c
        return {}

    def pods(self):
        return [p["metadata"]["name"] for p in self.get("pods", "-n", NS)["items"]]

    def wait(self, what, check, deadline_s=DEADLINE_S):
        if not wait_until(check, deadline_s):
            self.fail("%s not within %d s; status %s\noperator:\n%s" % (
                what, deadline_s, json.dumps(self.status()),
                self.cluster.log("operator")[-3000:]))

    def test_a_gang_over_the_quota_waits_whole_and_runs_once_it_is_raised(self):
        release = os.path.join(self.tmp, "release")
        self.apply(cluster_fixture.training_job(
            "wide", NS, ["bash", "-c", 'while [ ! -e "$0" ]; do sleep 0.1; done; exec "$@"',
                         release] + cluster_fixture.example_trainer(args().build_dir),
            max_restarts=3, container={"resources": {"limits": {"nvidia.com/gpu": "3"}}}))
        self.wait("QuotaExceeded", lambda: self.condition("QuotaExceeded").get(
            "status") == "True")
        quota = self.condition("QuotaExceeded")
        self.assertEqual(quota["reason"], "ExceededQuota")
        self.assertIn("exceeded quota: gpu-quota", quota["message"])
        self.assertIn("requests.nvidia.com/gpu=6", quota["message"])
        # It stays so, whole: no pod, no restart, Pending, never "created".
        end = time.monotonic() + 8
        while time.monotonic() < end:
            self.assertEqual(self.pods(), [])
            status = self.status()
            self.assertEqual(status.get("phase"), "Pending", json.dumps(status))
            self.assertEqual(status.get("restarts", 0), 0)
            self.assertNotEqual(self.condition("Created").get("status"), "True")
            time.sleep(0.5)
        events = self.get("events", "-n", NS, "--field-selector",
                          "involvedObject.name=wide,reason=QuotaExceeded")["items"]
        self.assertEqual(len(events), 1, events)

        self.kubectl_ok("patch", "resourcequota", "-n", NS, "gpu-quota", "--type", "merge",
                        "-p", json.dumps({"spec": {"hard": {"requests.nvidia.com/gpu": "6"}}}))
        raised = time.monotonic()
        self.wait("the job Running", lambda: self.status().get("phase") == "Running")
        # Seconds, not the timed retry (10 minutes here) nor the gang-start timeout: the quota's
        # change woke the job (with room for a loaded machine's pod start-up).
        self.assertLess(time.monotonic() - raised, 60)
        self.assertIn("tried again when a ResourceQuota there changes", quota["message"])
        self.assertEqual(self.condition("QuotaExceeded").get("status"), "False")
        self.assertEqual(self.condition("Created").get("status"), "True")
        open(release, "w").close()
        self.wait("the job finished", lambda: self.status().get("phase") in (
            "Succeeded", "Failed"))
        status = self.status()
        self.assertEqual(status["phase"], "Succeeded", json.dumps(status))
        self.assertEqual(status["restarts"], 0, json.dumps(status))


if __name__ == "__main__":
    cluster_fixture.main(build_dir=True)
