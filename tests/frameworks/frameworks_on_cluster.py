"""Issue 24 on Kubernetes: a Lightning job and the Ultralytics job through the operator, on the
real control plane of scripts/cluster.sh and its local node, the agent and the trainers running
in the frameworks environment (Debian 13's torch 2.6, Lightning, Ultralytics).

    python3 frameworks_on_cluster.py --source-dir REPO --build-dir BUILD [unittest args]

The operator's --agent-path is a small script that runs the bundle's agent inside the
frameworks root (scripts/in-root.sh: /opt/spawnpoint the bundle, /opt/spawnpoint-tests this
folder, /mnt/work a writable directory), passing on the environment the operator gives the
pod. Checks: the Lightning job (ddp_spawn, 2 ranks on one node, gloo) reaches Succeeded with
both ranks ending with the same parameters; the Ultralytics job (1 rank, YOLO('yolov8n.yaml')
on a dataset the trainer makes, workersPerRank 2) reaches Succeeded, its InfiniteDataLoader
served by the agent's pool, and the operator reported its data stall (status.utilisation,
the Data-Stall column of `kubectl get tj`) while it ran. Needs root (chroot): exits 77
(skipped) without it.
"""

import glob
import json
import os
import re
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
sys.path.insert(0, os.path.join(HERE, "..", "foreign"))
import cluster_fixture  # noqa: E402
import foreign_common  # noqa: E402  (job_yaml: a one-node CPU TrainingJob)

DEADLINE_S = 600
VENV_PYTHON = "/srv/spawnpoint-frameworks/bin/python"
PASSED_ON = r"^(SPAWNPOINT_|TORCHELASTIC_|POD_|NODE_NAME$|CONTAINER_NAME$)"

def args():
    return cluster_fixture.ARGS


class FrameworksOnClusterTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        source = args().source_dir
        env = subprocess.run(["bash", os.path.join(source, "scripts", "frameworks-env.sh")],
                             stdout=subprocess.PIPE, universal_newlines=True, timeout=2400)
        m = re.search(r"^python: \S+ \(in ([^;]+);", env.stdout, re.M)
        if env.returncode != 0 or not m:
            raise RuntimeError("scripts/frameworks-env.sh could not make the environment")
        cls.cluster = cluster_fixture.Cluster(source, args().tools_bin, nodes=1)
        cls.work = os.path.join(cls.cluster.dir, "work")
        os.makedirs(cls.work)
        agent = os.path.join(cls.cluster.dir, "agent-in-root.sh")
        with open(agent, "w") as f:
            f.write("""#!/usr/bin/env bash
# The operator's --agent-path: the bundle's agent, inside the frameworks root.
passed=()
while IFS='=' read -r name _; do
  [[ $name =~ %(passed)s ]] && passed+=(--env "$name=${!name}")
done < <(env)
exec bash %(in_root)s --bundle %(bundle)s --ro-bind %(tests)s:/opt/spawnpoint-tests \\
  --bind %(work)s:/mnt/work "${passed[@]}" %(root)s -- /opt/spawnpoint/bin/spawnpoint-agent "$@"
""" % {"passed": PASSED_ON, "in_root": os.path.join(source, "scripts", "in-root.sh"),
       "bundle": os.path.join(args().build_dir, "agent-bundle"), "tests": HERE,
       "work": cls.work, "root": m.group(1)})
        os.chmod(agent, 0o755)
        cls.cluster.start_operator(args().build_dir, agent, utilisation_interval="1s")

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def job(self, name):
        code, out = self.cluster.kubectl("get", "tj", name, "-o", "json")
        self.assertEqual(code, 0, out)
        return json.loads(out)

    def run_job(self, name, command, procs, workers):
        """Applies the job and waits for it to end; (final job, data-stall values seen)."""
        manifest = foreign_common.job_yaml(name, command, procs=procs, workers=workers)
        code, out = self.cluster.kubectl("apply", "-f", "-", stdin=manifest)
        self.assertEqual(code, 0, out)
        stalls = []
        end = time.monotonic() + DEADLINE_S
        while time.monotonic() < end:
            job = self.job(name)
            stall = job.get("status", {}).get("utilisation", {}).get("dataStall")
            if stall is not None:
                stalls.append(stall)
            if job.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                return job, stalls
            time.sleep(0.5)
        self.fail("%s did not end within %d s; operator:\n%s" % (
            name, DEADLINE_S, self.cluster.log("operator")[-3000:]))

    def pod_log(self, name):
        text = ""
        for path in sorted(glob.glob(os.path.join(self.cluster.node_dir, "pods",
                                                  "default_%s-node-*" % name, "trainer.log"))):
            with open(path) as f:
                text += f.read()
        return text

    def test_lightning_ddp_spawn_job_succeeds_with_equal_parameters(self):
        job, _ = self.run_job("lightning", [VENV_PYTHON,
                                            "/opt/spawnpoint-tests/lightning_trainer.py",
                                            "ddp_spawn"], procs=2, workers=0)
        log = self.pod_log("lightning")
        self.assertEqual(job["status"]["phase"], "Succeeded", log[-3000:])
        finals = [json.loads(line.split("SPAWNPOINT-LIGHTNING ", 1)[1])
                  for line in log.splitlines() if "SPAWNPOINT-LIGHTNING " in line]
        self.assertEqual(sorted(f["rank_env"] for f in finals), ["0", "1"], log[-3000:])
        self.assertEqual(finals[0]["params"], finals[1]["params"])
        self.assertNotIn("SPAWNPOINT-FORKED", log)

    def test_ultralytics_job_succeeds_on_the_pool_with_its_data_stall_reported(self):
        job, stalls = self.run_job("yolo", [
            VENV_PYTHON, "/opt/spawnpoint-tests/ultralytics_trainer.py", "--make-data",
            "/mnt/work/yolo", "/mnt/work/yolo-out"], procs=1, workers=2)
        log = self.pod_log("yolo")
        self.assertEqual(job["status"]["phase"], "Succeeded", log[-3000:])
        records = [json.loads(line.split("SPAWNPOINT-YOLO ", 1)[1])
                   for line in log.splitlines() if "SPAWNPOINT-YOLO " in line]
        self.assertEqual(len(records), 1, log[-3000:])
        self.assertEqual([i[0] for i in records[0]["iterators"]], ["_PoolDataLoaderIter"] * 3)
        self.assertTrue(stalls and all(0.0 <= s <= 1.0 for s in stalls),
                        "status.utilisation.dataStall while it ran: %s" % stalls)


if __name__ == "__main__":
    # A skip is exit 77, which ctest reports as Skipped (SKIP_RETURN_CODE); unittest's own
    # SkipTest exits 0 and would pass for a test that never ran.
    if os.getuid() != 0:
        print("SKIP: the frameworks tests need root: the frameworks environment is a chroot root")
        sys.exit(77)
    cluster_fixture.main(build_dir=True)
