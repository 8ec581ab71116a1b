"""What happens to a TrainingJob under Kueue after admission, on the real control plane (issue
40): the real spawnpoint-operator, the real Kueue v0.19 (scripts/cluster.sh up --kueue), local
nodes running the pods with the real agent and the example trainer. Two local nodes of 1
`nvidia.com/gpu`; a ClusterQueue of 1 GPU that preempts lower priorities; 1-node jobs of 1 GPU.
In order, on one cluster:

1. A restart: a job whose first attempt is killed (exit 137, retryable) restarts and succeeds.
   Kueue keeps its finalizer on the failed pod until a replacement of the group exists, so the
   replacement cannot reuse the name (before the operator named replacements, the job hung in
   Restarting for good); and no pod is deleted as excess (kueue#15424).
2. A failure frees the quota: a job that fails (exit 3, not retryable) ends Failed and its
   Workload finishes, so the next job is admitted and succeeds (before, the failed job's
   Workload kept the quota, waiting for replacements, and the next job queued forever). While
   it waits, its Queued condition quotes Kueue's reason from the Workload.
3. Preemption: a running low-priority job is evicted by Kueue for a high-priority one; it shows
   Queued with reason Preempted, spends no restart (status.evictions 1, restarts 0), its gang
   is recreated gated, re-admitted once the high one succeeds, and succeeds.
4. In place: in a 2-node job (quota now 2) rank 1 fails once (exit 137); the agents restart the
   gang in place and it succeeds: the same two pods (UIDs) throughout, none deleted, no
   ExcessPodDeleted, the Workload never evicted.
5. Suspend frees the quota: a running 2-node job is suspended; a queued 1-node job is then
   admitted and succeeds; the first, resumed, waits for its ended group's Workload to go, is
   admitted again under a new Workload and succeeds.

    python3 test_kueue_lifecycle_on_real_server.py --source-dir REPO --build-dir BUILD
"""

import json
import os
import tempfile

import gang_fixture
from gang_fixture import condition, gates

NS = "team"
DEADLINE_S = 240
GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"


def args():
    return gang_fixture.cluster_fixture.ARGS


def training_job(name, script, priority=None, max_restarts=1, nodes=1):
    """gang_fixture.training_job in LocalQueue team-queue, 1 GPU a pod."""
    scheduling = {"gang": "kueue", "queue": "team-queue"}
    if priority:
        scheduling["priorityClassName"] = priority
    return gang_fixture.training_job(args().build_dir, name, NS, script, nodes=nodes,
                                     scheduling=scheduling, max_restarts=max_restarts)


wait_for = gang_fixture.wait_for


class KueueLifecycleOnRealServerTest(gang_fixture.GangTest):
    DEADLINE_S = DEADLINE_S
    LOGS = (("operator", 4000), ("kueue", 4000))

    @classmethod
    def setUpClass(cls):
        cls.cluster = gang_fixture.GangCluster(args().source_dir, args().tools_bin, nodes=2,
                                               gpus=1, kueue=True)
        cls.tmp = tempfile.mkdtemp(prefix="spawnpoint-kueue-lifecycle-")
        try:
            cls.cluster.apply([
                {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                 "metadata": {"name": name}, "value": value}
                for name, value in (("low", 10), ("high", 1000))])
            cls.cluster.gpu_queue(NS, quota=1, deadline_s=DEADLINE_S,
                                  preemption={"withinClusterQueue": "LowerPriority"})
            cls.cluster.start_operator(args().build_dir)
        except BaseException:
            cls.tearDownClass()
            raise

    def job(self, name):
        return self.cluster.get("tj", "-n", NS, name) or {}

    def status(self, name):
        return self.job(name).get("status") or {}

    def pods(self, name):
        return [p for p in self.cluster.get("pods", "-n", NS)["items"]
                if p["metadata"]["labels"].get("spawnpoint.dev/job-name") == name]

    def finished(self, name):
        self.wait("job %s finished" % name,
                  lambda: self.status(name).get("phase") in ("Succeeded", "Failed"))
        return self.status(name)

    def workload(self, name):
        """Kueue's Workload of the job's pod group (named after the group)."""
        group = self.pods(name)[0]["metadata"]["labels"][GROUP_LABEL]
        return self.cluster.get("workloads.kueue.x-k8s.io", "-n", NS, group)

    def excess_deleted(self, job):
        """Kueue's ExcessPodDeleted events on the job's pods."""
        return [e for e in self.events("reason=ExcessPodDeleted")
                if e["involvedObject"]["name"].startswith(job + "-node-")]

    def events(self, field):
        code, out = self.cluster.kubectl("get", "events", "-n", NS, "--field-selector", field,
                                         "-o", "json")
        self.assertEqual(code, 0, out)
        return json.loads(out)["items"]

    def test_1_a_restart_makes_a_new_pod_name_and_succeeds(self):
        self.cluster.apply([training_job(
            "flaky", 'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then exit 137; fi; exec "$@"')])
        status = self.finished("flaky")
        self.assertEqual(status["phase"], "Succeeded", json.dumps(status))
        self.assertEqual(status["restarts"], 1)
        self.assertEqual(status["lastFailure"]["exitCode"], 137)
        names = sorted(p["metadata"]["name"] for p in self.pods("flaky"))
        # The first pod may linger until Kueue finalises it; the one that succeeded is new.
        self.assertIn("flaky-node-0-1", names)
        done = [p for p in self.pods("flaky") if p["status"].get("phase") == "Succeeded"]
        self.assertEqual([p["metadata"]["name"] for p in done], ["flaky-node-0-1"])
        self.assertEqual(done[0]["spec"]["hostname"], "flaky-node-0")
        self.assertFalse(self.excess_deleted("flaky"), "Kueue deleted a pod as excess")
        self.wait("flaky's Workload Finished", lambda: condition(
            self.workload("flaky"), "Finished").get("status") == "True")

    def test_2_a_failed_job_frees_its_quota(self):
        release = os.path.join(self.tmp, "release-doomed")
        self.cluster.apply([training_job(
            "doomed", 'while [ ! -e %s ]; do sleep 0.1; done; exit 3' % release)])
        self.wait("doomed Running", lambda: self.status("doomed").get("phase") == "Running")
        self.cluster.apply([training_job("next", 'exec "$@"')])
        # Queued behind it, in Kueue's own words.
        self.wait("next Queued quoting Kueue", lambda: "Kueue: " in condition(
            {"status": self.status("next")}, "Queued").get("message", ""))
        queued = condition({"status": self.status("next")}, "Queued")
        self.assertEqual((queued["status"], queued["reason"]), ("True", "WaitingForAdmission"))
        self.assertIn("insufficient", queued["message"])
        self.assertIn("nvidia.com/gpu", queued["message"])

        open(release, "w").close()
        status = self.finished("doomed")
        self.assertEqual(status["phase"], "Failed", json.dumps(status))
        self.assertEqual(status["lastFailure"]["exitCode"], 3)
        # Its pods stay (cleanPodPolicy None), marked so that Kueue ends the group.
        pod = self.pods("doomed")[0]
        self.assertEqual(pod["metadata"]["annotations"].get(
            "kueue.x-k8s.io/retriable-in-group"), "false")
        self.wait("doomed's Workload Finished", lambda: condition(
            self.workload("doomed"), "Finished").get("status") == "True")
        status = self.finished("next")
        self.assertEqual(status["phase"], "Succeeded", json.dumps(status))
        self.assertEqual(condition({"status": status}, "Queued").get("reason"), "Admitted")

    def test_3_a_preempted_job_requeues_without_spending_a_restart(self):
        release = os.path.join(self.tmp, "release-low")
        self.cluster.apply([training_job("low", wait_for(release), priority="low")])
        self.wait("low Running", lambda: self.status("low").get("phase") == "Running")
        first = self.pods("low")[0]["metadata"]["name"]

        self.cluster.apply([training_job("high", 'exec "$@"', priority="high")])
        self.wait("low evicted", lambda: self.status("low").get("evictions") == 1)
        status = self.status("low")
        self.assertEqual(status["phase"], "Queued", json.dumps(status))
        self.assertEqual(status["restarts"], 0)
        self.assertEqual(status["lastEviction"]["reason"], "Preempted")
        self.assertIn("Preempted to accommodate", status["lastEviction"]["message"])
        queued = condition({"status": status}, "Queued")
        self.assertEqual((queued["status"], queued["reason"]), ("True", "Preempted"))
        self.assertTrue(self.events("involvedObject.name=low,reason=Preempted"))

        status = self.finished("high")
        self.assertEqual(status["phase"], "Succeeded", json.dumps(status))
        # The low gang was recreated (a new name: Kueue held the old pod) and is admitted again.
        self.wait("low Running again", lambda: self.status("low").get("phase") == "Running")
        running = [p for p in self.pods("low") if p["status"].get("phase") == "Running"]
        self.assertEqual(len(running), 1)
        self.assertNotEqual(running[0]["metadata"]["name"], first)
        self.assertEqual(gates(running[0]), [])
        open(release, "w").close()
        status = self.finished("low")
        self.assertEqual(status["phase"], "Succeeded", json.dumps(status))
        self.assertEqual((status["restarts"], status["evictions"]), (0, 1))
        self.assertEqual(condition({"status": status}, "Queued").get("reason"), "Admitted")

    def set_quota(self, gpus):
        code, out = self.cluster.kubectl(
            "patch", "clusterqueue", "gpus", "--type", "json", "-p", json.dumps([{
                "op": "replace", "value": gpus,
                "path": "/spec/resourceGroups/0/flavors/0/resources/0/nominalQuota"}]))
        self.assertEqual(code, 0, out)

    def test_4_a_rank_failure_restarts_in_place_and_no_pod_is_deleted(self):
        self.set_quota(2)
        self.cluster.apply([training_job(
            "inplace", 'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; '
            'then exit 137; fi; exec "$@"', nodes=2)])
        self.wait("inplace's 2 pods bound", lambda: len(
            [p for p in self.pods("inplace") if p["spec"].get("nodeName")]) == 2)
        uids = sorted((p["metadata"]["name"], p["metadata"]["uid"]) for p in self.pods("inplace"))
        status = self.finished("inplace")
        self.assertEqual(status["phase"], "Succeeded", json.dumps(status))
        self.assertEqual(status["restarts"], 1, json.dumps(status))
        self.assertTrue(status["lastFailure"].get("inPlace"), json.dumps(status))
        self.assertNotIn("evictions", status)
        pods = self.pods("inplace")
        self.assertEqual(sorted((p["metadata"]["name"], p["metadata"]["uid"]) for p in pods),
                         uids, "the same pods throughout")
        self.assertFalse([p for p in pods if p["metadata"].get("deletionTimestamp")])
        self.assertFalse(self.excess_deleted("inplace"), "Kueue deleted a pod as excess")
        self.assertNotEqual(condition(self.workload("inplace"), "Evicted").get("status"), "True")

    def test_5_suspend_frees_the_quota(self):
        release = os.path.join(self.tmp, "release-pausable")
        self.cluster.apply([training_job("pausable", wait_for(release), nodes=2)])
        self.wait("pausable Running", lambda: self.status("pausable").get("phase") == "Running")
        first_group = self.workload("pausable")["metadata"]["uid"]
        self.cluster.apply([training_job("waiter", 'exec "$@"')])
        self.wait("waiter Queued", lambda: self.status("waiter").get("phase") == "Queued")

        def suspend(value):
            code, out = self.cluster.kubectl(
                "patch", "tj", "-n", NS, "pausable", "--type", "merge", "-p",
                json.dumps({"spec": {"runPolicy": {"suspend": value}}}))
            self.assertEqual(code, 0, out)
        suspend(True)
        self.wait("pausable Suspended",
                  lambda: self.status("pausable").get("phase") == "Suspended")
        status = self.finished("waiter")  # admitted on the quota the suspended job gave back
        self.assertEqual(status["phase"], "Succeeded", json.dumps(status))

        suspend(False)
        self.wait("pausable Running again",
                  lambda: self.status("pausable").get("phase") == "Running")
        self.assertNotEqual(self.workload("pausable")["metadata"]["uid"], first_group,
                            "admitted again under a new Workload")
        open(release, "w").close()
        status = self.finished("pausable")
        self.assertEqual(status["phase"], "Succeeded", json.dumps(status))


if __name__ == "__main__":
    gang_fixture.main(build_dir=True)
