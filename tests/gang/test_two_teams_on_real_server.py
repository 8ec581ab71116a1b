"""Issue 40's deadlock, replayed on the real control plane with each gang scheduler: two teams
share 2 local nodes of 4 `nvidia.com/gpu`. Team A applies a job of 3 nodes x 3 GPUs (more than
the cluster has), then team B one of 2 nodes x 3 GPUs (which fits). Without a gang scheduler
kube-scheduler binds two of A's pods, which hold 6 GPUs and wait for a third node that is not
there, and B's job cannot get both of its nodes: neither trains (with two jobs of the same size
whose pods interleave, each gets one pod and both give up every 120 s). With
`spec.scheduling.gang` A binds nothing and waits whole (Volcano: its PodGroup Pending,
Unschedulable; Kueue: Queued, gated, in Kueue's words), B runs at once and succeeds; when the
cluster grows (a third node; under Kueue also the quota), A runs and succeeds. While A waits,
one of B's pods is deleted: B gets its node back (A's gang still does not fit) and restarts in
place; no other restart anywhere. The ranks wait for the test's release file, so a job holds its GPUs while the test
looks.

The real spawnpoint-operator, Kueue v0.19 and the Volcano scheduler v1.15 on one cluster
(scripts/cluster.sh up --kueue --volcano), the real agent and the example trainer. Volcano runs
first, on 2 nodes; its third node stays for Kueue, whose quota (8 GPUs) then keeps A out.

    python3 test_two_teams_on_real_server.py --source-dir REPO --build-dir BUILD
"""

import json
import os
import tempfile
import time

import gang_fixture
from gang_fixture import condition, gates

DEADLINE_S = 300
# Team A's job is watched this long, waiting whole while B trains: past the operator's pending
# timeout (below), so a waiting gang is shown for what it is.
WATCH_S = 12
PENDING_TIMEOUT_S = 5


def args():
    return gang_fixture.cluster_fixture.ARGS


def training_job(name, ns, nodes, scheduling, release):
    """gang_fixture.training_job: `nodes` pods of 3 GPUs whose ranks train once `release`
    exists."""
    return gang_fixture.training_job(args().build_dir, name, ns, gang_fixture.wait_for(release),
                                     nodes=nodes, gpus=3, scheduling=scheduling)


class TwoTeamsOnRealServerTest(gang_fixture.GangTest):
    DEADLINE_S = DEADLINE_S
    LOGS = (("operator", 3000), ("kueue", 2000), ("vc-scheduler", 2000))

    @classmethod
    def setUpClass(cls):
        cls.cluster = gang_fixture.GangCluster(args().source_dir, args().tools_bin, nodes=2,
                                               gpus=4, kueue=True, volcano=True)
        cls.tmp = tempfile.mkdtemp(prefix="spawnpoint-two-teams-")
        try:
            # Kueue: a ClusterQueue of 8 GPUs, a LocalQueue in each team's namespace.
            cls.cluster.gpu_queue("kueue-a", quota=8, deadline_s=DEADLINE_S)
            code, out = cls.cluster.kubectl("create", "namespace", "kueue-b")
            assert code == 0, out
            cls.cluster.apply([{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                                "metadata": {"name": "team-queue", "namespace": "kueue-b"},
                                "spec": {"clusterQueue": "gpus"}}])
            for ns in ("volcano-a", "volcano-b"):
                code, out = cls.cluster.kubectl("create", "namespace", ns)
                assert code == 0, out
            cls.cluster.start_operator(args().build_dir,
                                       args=["--pending-timeout", "%ds" % PENDING_TIMEOUT_S])
        except BaseException:
            cls.tearDownClass()
            raise

    def pods(self, ns, job):
        return [p for p in self.cluster.get("pods", "-n", ns)["items"]
                if p["metadata"]["labels"].get("spawnpoint.dev/job-name") == job]

    def bound(self, ns, job):
        return [p["metadata"]["name"] for p in self.pods(ns, job) if p["spec"].get("nodeName")]

    def status(self, ns, job):
        return (self.cluster.get("tj", "-n", ns, job) or {}).get("status") or {}

    def succeeded(self, ns, job, restarts=0):
        self.wait("%s/%s finished" % (ns, job),
                  lambda: self.status(ns, job).get("phase") in ("Succeeded", "Failed"))
        status = self.status(ns, job)
        self.assertEqual(status["phase"], "Succeeded", json.dumps(status))
        self.assertEqual(status["restarts"], restarts, json.dumps(status))

    def replay(self, scheduler, scheduling, grow):
        """Team A's 3-node job, then team B's 2-node job; `grow()` makes room for A."""
        a, b = ("%s-a" % scheduler, "big"), ("%s-b" % scheduler, "small")
        release = {job: os.path.join(self.tmp, "%s-%s" % (ns, job)) for ns, job in (a, b)}
        for ns, _ in (a, b):  # a failure here must not leave GPUs held for the next test
            self.addCleanup(self.cluster.kubectl, "delete", "tj", "--all", "-n", ns,
                            "--wait=false")
        self.cluster.apply([training_job("big", a[0], 3, scheduling, release["big"])])
        self.wait("%s: A's 3 pods made" % scheduler, lambda: len(self.pods(*a)) == 3)
        self.cluster.apply([training_job("small", b[0], 2, scheduling, release["small"])])

        def a_holds_nothing():
            if self.bound(*a):
                self.fail("%s: team A's gang, too big for the cluster, holds GPUs on %s"
                          % (scheduler, self.bound(*a)))
            return True
        self.wait("%s: B Running" % scheduler, lambda: a_holds_nothing() and self.status(
            *b).get("phase") == "Running")
        # A waits whole while B trains, past the operator's pending timeout.
        end = time.monotonic() + WATCH_S
        while time.monotonic() < end:
            a_holds_nothing()
            self.assertEqual(self.status(*b).get("phase"), "Running")
            time.sleep(0.5)
        waiting = self.status(*a)
        if scheduler == "kueue":
            self.assertEqual(waiting.get("phase"), "Queued", json.dumps(waiting))
            self.assertIn("Kueue: ", condition({"status": waiting}, "Queued")["message"])
            self.assertTrue(all(gates(p) for p in self.pods(*a)))
        else:
            self.assertEqual(waiting.get("phase"), "Pending", json.dumps(waiting))
            group = self.pods(*a)[0]["metadata"]["annotations"]["scheduling.k8s.io/group-name"]
            self.assertEqual(condition(self.cluster.get("podgroup", "-n", a[0], group),
                                       "Unschedulable").get("status"), "True")
        # A pod of B is lost while A waits: B gets its node back (A still does not fit whole)
        # and restarts in place; under Kueue the replacement takes a new name.
        code, out = self.cluster.kubectl("delete", "pod", "-n", b[0], "small-node-1",
                                         "--wait=false")
        self.assertEqual(code, 0, out)
        def b_runs_again():
            status = self.status(*b)
            if status.get("phase") in ("Failed", "Succeeded"):
                self.fail("%s: B ended %s after its pod's loss: %s"
                          % (scheduler, status["phase"], json.dumps(status)))
            return (a_holds_nothing() and status.get("restarts") == 1
                    and status.get("phase") == "Running")
        self.wait("%s: B Running again after its pod's loss" % scheduler, b_runs_again)
        last = self.status(*b)["lastFailure"]
        # Node 1's: the pod's deletion (PodDeleted, recorded as it terminates), or its agent's
        # report of its rank stopped (Killed) when the agents said so first. Never node 0's.
        self.assertEqual(last["node"], 1, json.dumps(last))
        self.assertIn(last["reason"], ("PodDeleted", "Killed", "Terminated"), json.dumps(last))
        self.assertEqual(len([p for p in self.pods(*b) if p["spec"].get("nodeName") and
                              not p["metadata"].get("deletionTimestamp") and
                              p["status"].get("phase") == "Running"]), 2)
        open(release["small"], "w").close()
        self.succeeded(*b, restarts=1)

        # Room for A: it runs whole and succeeds.
        open(release["big"], "w").close()
        grow()
        self.wait("%s: A bound whole" % scheduler, lambda: len(self.bound(*a)) == 3)
        self.succeeded(*a)

    def test_1_volcano_binds_a_gang_whole_or_not_at_all(self):
        self.replay("volcano", {"gang": "volcano"},
                    lambda: self.cluster.add_node("extra-node-", nodes=1, gpus=4))

    def test_2_kueue_admits_a_gang_whole_or_not_at_all(self):
        def raise_quota():
            code, out = self.cluster.kubectl(
                "patch", "clusterqueue", "gpus", "--type", "json", "-p", json.dumps([{
                    "op": "replace", "value": 12, "path":
                    "/spec/resourceGroups/0/flavors/0/resources/0/nominalQuota"}]))
            self.assertEqual(code, 0, out)
        self.replay("kueue", {"gang": "kueue", "queue": "team-queue"}, raise_quota)


if __name__ == "__main__":
    gang_fixture.main(build_dir=True)
