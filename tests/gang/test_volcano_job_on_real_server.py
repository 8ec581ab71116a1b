"""A TrainingJob with spec.scheduling.gang volcano on the real control plane (issue 40): the
real spawnpoint-operator makes the job's PodGroup and pods, the real Volcano scheduler
(scripts/cluster.sh up --volcano) binds them, the local nodes run them with the real agent and
the example trainer. 3 nodes x 1 `nvidia.com/gpu` (the template asks for the GPU; the ranks are
CPU ranks, there is no GPU here) on a cluster of 2 free 1-GPU nodes: Volcano binds none of the
pods (the PodGroup the operator made is Pending and Unschedulable, as Volcano wrote it); a
third node and all 3 are bound together, one per node, and the job succeeds. Had the operator
not named Volcano on its pods, kube-scheduler would bind 2 of them (the test fails on any bound
pod); had it made no PodGroup or Volcano not run, no phase is written (the test times out).

    python3 test_volcano_job_on_real_server.py --source-dir REPO --build-dir BUILD [unittest args]
"""

import json
import os
import unittest

import gang_fixture
from gang_fixture import condition

NS = "team"
DEADLINE_S = 240


def args():
    return gang_fixture.cluster_fixture.ARGS


def training_job(name, nodes, gpus, port, build_dir):
    """A CPU DDP job whose pods each ask `gpus` nvidia.com/gpu, scheduled by Volcano."""
    return {
        "apiVersion": "spawnpoint.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodes": nodes, "gpusPerNode": 0, "procsPerNode": 1, "backend": "gloo",
            "scheduling": {"gang": "volcano"},
            "template": {"spec": {"terminationGracePeriodSeconds": 5, "containers": [{
                "name": "trainer", "image": "spawnpoint/example-trainer:latest",
                "command": [os.path.join(build_dir, "bin", "spawnpoint-example-trainer")],
                "args": ["--epochs", "1", "--steps-per-epoch", "5", "--batch-size", "8",
                         "--data", "memory"],
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}},
            "loader": {"workersPerRank": 0},
            "restartPolicy": {"maxRestarts": 0},
            "rendezvous": {"port": port},
            "shmSize": "64Mi",
            "runPolicy": {"cleanPodPolicy": "None"}}}


class VolcanoJobOnRealServerTest(gang_fixture.GangTest):
    DEADLINE_S = DEADLINE_S
    LOGS = (("operator", 3000), ("vc-scheduler", 3000))

    @classmethod
    def setUpClass(cls):
        cls.cluster = gang_fixture.GangCluster(args().source_dir, args().tools_bin, nodes=2,
                                               gpus=1, volcano=True)
        try:
            code, out = cls.cluster.kubectl("create", "namespace", NS)
            if code != 0:
                raise RuntimeError(out)
            cls.cluster.start_operator(args().build_dir)
        except Exception:
            cls.cluster.stop()
            raise



    def pods(self, job):
        listing = self.cluster.get("pods", "-n", NS, "-l", "spawnpoint.dev/job-name=" + job)
        return sorted(listing["items"], key=lambda p: p["metadata"]["name"])

    def test_three_gpu_gang_binds_none_on_two_nodes_then_all_on_three_and_succeeds(self):
        port = gang_fixture.cluster_fixture.free_port()
        made = self.cluster.apply([training_job("big", 3, 1, port, args().build_dir)])
        uid = made[0]["metadata"]["uid"]
        group = "big-" + uid[:8]

        # The operator made the group before the pods, owned by the job, for the whole gang.
        def group_made():
            return self.cluster.get("podgroup", "-n", NS, group) is not None
        self.wait("the operator's PodGroup " + group, group_made)
        pg = self.cluster.get("podgroup", "-n", NS, group)
        self.assertEqual(pg["spec"]["minMember"], 3, pg["spec"])
        self.assertEqual(pg["spec"]["queue"], "default", pg["spec"])
        self.assertEqual(pg["spec"]["minResources"].get("nvidia.com/gpu"), "3", pg["spec"])
        owner = pg["metadata"]["ownerReferences"][0]
        self.assertEqual((owner["kind"], owner["uid"], owner.get("controller")),
                         ("TrainingJob", uid, True))

        # Volcano refused the gang whole: 3 pods, none bound, the PodGroup Pending and
        # Unschedulable as Volcano wrote it.
        def refused():
            pods = self.pods("big")
            bound = [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")]
            if bound:
                self.fail("%s bound with 2 GPUs for a gang of 3 (scheduler %s)" % (
                    bound, [p["spec"].get("schedulerName") for p in pods]))
            status = self.cluster.get("podgroup", "-n", NS, group).get("status") or {}
            return (len(pods) == 3 and status.get("phase") == "Pending" and
                    condition({"status": status}, "Unschedulable").get("status") == "True")
        self.wait("PodGroup %s Pending and Unschedulable with 3 pods" % group, refused)
        pg = self.cluster.get("podgroup", "-n", NS, group)
        unschedulable = condition(pg, "Unschedulable")
        self.assertEqual(unschedulable.get("reason"), "NotEnoughResources", unschedulable)
        # "M/N tasks in gang unschedulable: pod group is not ready, ..., 3 minAvailable; ...":
        # N is how many of the pods Volcano had seen when it wrote the condition (1-3).
        self.assertRegex(unschedulable.get("message", ""),
                         r"^3/[123] tasks in gang unschedulable: pod group is not ready, "
                         r".*\b3 minAvailable\b")
        for p in self.pods("big"):
            self.assertEqual(p["spec"]["schedulerName"], "volcano")
            self.assertEqual(p["metadata"]["annotations"]["scheduling.k8s.io/group-name"], group)
            self.assertIsNone(p["spec"].get("nodeName"))
        job = self.cluster.get("tj", "-n", NS, "big")
        self.assertEqual(job["status"].get("phase"), "Pending", job["status"])

        # A third GPU node: all 3 bound together, one per node; the job runs and succeeds.
        self.cluster.add_node("extra-node-", nodes=1, gpus=1)
        self.wait("all 3 pods bound", lambda: all(
            p["spec"].get("nodeName") for p in self.pods("big")))
        self.assertEqual(sorted(p["spec"]["nodeName"] for p in self.pods("big")),
                         ["extra-node-0", "local-node-0", "local-node-1"])

        def finished():
            return (self.cluster.get("tj", "-n", NS, "big").get("status") or {}).get(
                "phase") in ("Succeeded", "Failed")
        self.wait("the job finished", finished)
        job = self.cluster.get("tj", "-n", NS, "big")
        self.assertEqual(job["status"]["phase"], "Succeeded", json.dumps(job["status"]))
        self.assertEqual(job["status"]["restarts"], 0)
        # Done: the operator gave the group back (an empty group would hold its GPUs).
        self.wait("the PodGroup deleted", lambda: self.cluster.get(
            "podgroup", "-n", NS, group) is None, 60)


if __name__ == "__main__":
    gang_fixture.main(build_dir=True)
