"""A job of any size the API accepts runs (issue 41), on the real control plane: the real
spawnpoint-operator and agent, local_node.py's nodes running the pods as processes (a real
execve with the pod's environment). The trainer container carries 30 environment variables of
10 KB: valid, and fine for any process, but the whole job (300 KB) in the one variable the agent
read (SPAWNPOINT_JOB) stopped every pod with E2BIG ("Argument list too long": Linux refuses an
environment string over 128 KiB), retried, then Failed. Now the job goes in parts
(SPAWNPOINT_JOB_PARTS, SPAWNPOINT_JOB_0..), none over 100 KiB: the 2-node job succeeds, and
its ranks see the big variables.

    python3 test_big_job_on_real_server.py --source-dir REPO --build-dir BUILD
"""

import json
import os

import cluster_fixture
from cluster_fixture import wait_until

NS = "big"


def args():
    return cluster_fixture.ARGS


class BigJobOnRealServerTest(cluster_fixture.OperatorClusterTest):
    NAMESPACE = NS

    def test_a_300_kb_template_runs(self):
        seen = os.path.join(self.tmp, "seen")
        trainer = cluster_fixture.example_trainer(args().build_dir, steps=3)
        # Each rank records the length of one big variable, then trains.
        script = 'printf "%s\\n" "${#BIG_29}" >> "$0"; exec "$@"'
        env = [{"name": "BIG_%d" % i, "value": "v" * 10000} for i in range(30)]
        job = cluster_fixture.training_job("wide", NS, ["bash", "-c", script, seen] + trainer,
                                           container={"env": env})
        self.assertGreater(len(json.dumps(job)), 300000)
        code, out = self.cluster.kubectl("create", "-f", "-", stdin=json.dumps(job))
        self.assertEqual(code, 0, out)

        def finished():
            return (self.get("tj", "-n", NS, "wide").get("status") or {}).get("phase") in (
                "Succeeded", "Failed")
        if not wait_until(finished, 240):
            self.fail("not finished: %s\n%s" % (self.get("tj", "-n", NS, "wide").get("status"),
                                                self.cluster.log("operator")[-2000:]))
        status = self.get("tj", "-n", NS, "wide")["status"]
        self.assertEqual(status["phase"], "Succeeded", json.dumps(status)[:3000])
        self.assertEqual(status["restarts"], 0)
        with open(seen) as f:
            self.assertEqual(f.read().split(), ["10000", "10000"], "both ranks saw BIG_29")
        pod = self.get("pod", "-n", NS, "wide-node-0")
        names = [e["name"] for e in pod["spec"]["containers"][0]["env"]]
        self.assertIn("SPAWNPOINT_JOB_PARTS", names)
        self.assertNotIn("SPAWNPOINT_JOB", names)


if __name__ == "__main__":
    cluster_fixture.main(build_dir=True)
