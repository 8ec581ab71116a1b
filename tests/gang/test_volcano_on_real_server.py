"""The Volcano scheduler v1.15 binds a gang whole or not at all on the real control plane
(issue 40): scripts/cluster.sh up --volcano (the real vc-scheduler, scripts/gang.sh), two local
nodes of 1 `nvidia.com/gpu` each. A PodGroup (minMember 3, minResources 3 GPUs, queue
default) and its 3 pods (schedulerName volcano, annotation scheduling.k8s.io/group-name), 1 GPU
each: Volcano writes the PodGroup's phase (Pending) and an Unschedulable condition and binds
none of them; a third node (another local_node.py) makes room and all 3 are bound, one per
node, the PodGroup Running as Volcano wrote it. Without Volcano no PodGroup status is
written and no pod is ever bound (kube-scheduler leaves pods of another scheduler alone).

    python3 test_volcano_on_real_server.py --source-dir REPO [unittest args]
"""

import os
import tempfile
import unittest

import gang_fixture
from gang_fixture import condition

NS = "team"
DEADLINE_S = 180


def args():
    return gang_fixture.cluster_fixture.ARGS


class VolcanoOnRealServerTest(gang_fixture.GangTest):
    DEADLINE_S = DEADLINE_S
    LOGS = (("vc-scheduler", 5000),)

    @classmethod
    def setUpClass(cls):
        cls.cluster = gang_fixture.GangCluster(args().source_dir, args().tools_bin, nodes=2,
                                               gpus=1, volcano=True)
        cls.tmp = tempfile.mkdtemp(prefix="spawnpoint-volcano-test-")
        code, out = cls.cluster.kubectl("create", "namespace", NS)
        if code != 0:
            cls.tearDownClass()
            raise RuntimeError(out)



    def pods(self):
        listing = self.cluster.get("pods", "-n", NS, "-l", "gang=pg")
        return sorted(listing["items"], key=lambda p: p["metadata"]["name"])

    def test_three_pod_gang_binds_none_on_two_gpu_nodes_then_all_on_three(self):
        release = os.path.join(self.tmp, "release")
        script = ("import os, sys, time\n"
                  "while not os.path.exists(sys.argv[1]):\n"
                  "    time.sleep(0.1)\n")
        objects = [{"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                    "metadata": {"name": "pg", "namespace": NS},
                    "spec": {"minMember": 3, "queue": "default",
                             "minResources": {"nvidia.com/gpu": "3"}}}]
        for i in range(3):
            objects.append({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "pg-%d" % i, "namespace": NS, "labels": {"gang": "pg"},
                             "annotations": {"scheduling.k8s.io/group-name": "pg"}},
                "spec": {"schedulerName": "volcano", "restartPolicy": "Never",
                         "terminationGracePeriodSeconds": 5,
                         "containers": [{"name": "main", "image": "none",
                                         "command": ["python3", "-c", script, release],
                                         "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
        made = self.cluster.apply(objects)
        self.assertNotIn("phase", made[0].get("status") or {})  # nobody but Volcano writes it

        # Volcano looked at the gang and refused it whole: phase Pending and Unschedulable,
        # as it wrote them; no pod bound (2 GPUs for a gang of 3).
        def refused():
            bound = [p["metadata"]["name"] for p in self.pods() if p["spec"].get("nodeName")]
            if bound:
                self.fail("Volcano bound %s of the gang of 3 on 2 GPUs" % bound)
            pg = self.cluster.get("podgroup", "-n", NS, "pg")
            return ((pg.get("status") or {}).get("phase") == "Pending" and
                    condition(pg, "Unschedulable").get("status") == "True")
        self.wait("PodGroup pg Pending and Unschedulable", refused)
        pg = self.cluster.get("podgroup", "-n", NS, "pg")
        unschedulable = condition(pg, "Unschedulable")
        # The gang plugin's words (plugins/gang/gang.go): all 3 of 3 tasks unschedulable.
        self.assertEqual(unschedulable.get("reason"), "NotEnoughResources", unschedulable)
        self.assertTrue(unschedulable.get("message", "").startswith(
            "3/3 tasks in gang unschedulable"), unschedulable)
        self.assertEqual([p["spec"].get("nodeName") for p in self.pods()], [None] * 3)
        self.assertEqual([p["status"].get("phase") for p in self.pods()], ["Pending"] * 3)
        self.assertEqual(pg["status"].get("running", 0), 0)

        # A third GPU node: the gang fits, and all 3 are bound, one per node.
        self.cluster.add_node("extra-node-", nodes=1, gpus=1)
        self.wait("all 3 pods bound", lambda: all(
            p["spec"].get("nodeName") for p in self.pods()))
        nodes = sorted(p["spec"]["nodeName"] for p in self.pods())
        self.assertEqual(nodes, ["extra-node-0", "local-node-0", "local-node-1"])
        self.wait("PodGroup pg Running", lambda: (self.cluster.get(
            "podgroup", "-n", NS, "pg").get("status") or {}).get("phase") == "Running")
        self.wait("the 3 pods Running", lambda: [
            p["status"].get("phase") for p in self.pods()] == ["Running"] * 3)
        open(release, "w").close()
        self.wait("the 3 pods Succeeded", lambda: [
            p["status"].get("phase") for p in self.pods()] == ["Succeeded"] * 3)


if __name__ == "__main__":
    gang_fixture.main()
