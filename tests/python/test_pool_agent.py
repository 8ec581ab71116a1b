"""Python ranks on the agent's loader pools, end to end: `spawnpoint-agent run` starts the
ranks and their pools (Python workers spawned by the agent, the per-rank loader service), and
pool_trainers/pool_trainer.py is the trainer, unchanged from what a user writes: the start-up
shim serves its DataLoaders from the pool. Each case's ranks write what they saw to JSON
files that these tests check. Run through run_shim_tests.py --agent (ctest:
python_pool_under_agent).
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from test_shim import PYTHON, clean_environment

HERE = os.path.dirname(os.path.abspath(__file__))
TRAINER = os.path.join(HERE, "pool_trainers", "pool_trainer.py")
TIMEOUT = 600  # every rank and worker imports torch, on a loaded 2-core machine

JOB = """\
apiVersion: spawnpoint.dev/v1alpha1
kind: TrainingJob
metadata: {name: python-pool}
spec:
  nodes: 1
  gpusPerNode: 0
  procsPerNode: 2
  backend: gloo
  template:
    spec:
      containers:
        - name: trainer
          image: unused
          command: %s
  loader:
    workersPerRank: 2
    timeoutSeconds: 120
  restartPolicy: {maxRestarts: %d, backoffSeconds: 0}
"""

POOL_ITER = "_PoolDataLoaderIter"


@unittest.skipUnless(os.environ.get("SPAWNPOINT_AGENT_BIN"), "needs --agent (the built spawnpoint-agent)")
class PoolAgentTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="spawnpoint-pool-test-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def run_job(self, case, max_restarts=0, env=None, preload=None):
        """Runs the case under the agent (`env`: the container's variables; `preload`:
        loader.preloadModules); {(rank, attempt): report}."""
        job = os.path.join(self.tmp, "job.yaml")
        text = JOB % (json.dumps([PYTHON, TRAINER, case, self.tmp]), max_restarts)
        if env:
            text = text.replace("          command:", "          env: %s\n          command:" % (
                json.dumps([{"name": k, "value": v} for k, v in sorted(env.items())])))
        if preload:
            text = text.replace("    workersPerRank: 2\n", "    workersPerRank: 2\n"
                                "    preloadModules: %s\n" % json.dumps(preload))
        with open(job, "w") as f:
            f.write(text)
        self.status_file = os.path.join(self.tmp, "status.json")
        proc = subprocess.run([os.environ["SPAWNPOINT_AGENT_BIN"], "run", "-f", job,
                               "--gpu-backend", "none", "--master-port", "0",
                               "--status-file", self.status_file],
                              cwd=self.tmp, env=clean_environment(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, timeout=TIMEOUT)
        self.output = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 0, self.output)
        reports = {}
        for path in glob.glob(os.path.join(self.tmp, case + "-rank*-attempt*.json")):
            with open(path) as f:
                r = json.load(f)
            reports[(r["rank"], r["attempt"])] = r
        return reports

    def test_ddp_train_and_validation_batches_equal_stock_dataloader(self):
        reports = self.run_job("ddp")
        self.assertEqual(sorted(reports), [(0, 0), (1, 0)], self.output)
        for r in reports.values():
            self.assertEqual(r["served"], [POOL_ITER], self.output)
            self.assertEqual(r["stock"], ["_MultiProcessingDataLoaderIter"], self.output)
            self.assertEqual(r["equal"], {"train": True, "val": True},
                             json.dumps(r.get("differences"), indent=1) + "\n" + self.output)
            self.assertEqual(r["batches"], 2 * 6)  # 24 samples per rank, batches of 4
            # Batch 0 of the first epoch was built in the rank itself (as worker 0 would:
            # the batches equal stock's, draws included), the others by the pool's 2 workers.
            self.assertIn(r["pid"], r["workers"], self.output)
            self.assertEqual(len(set(r["workers"]) - {r["pid"]}), 2, self.output)
        # Each rank has its own pool.
        self.assertFalse(set(reports[(0, 0)]["workers"]) & set(reports[(1, 0)]["workers"]))
        # The agent's status carries each rank's loader statistics, which the service wrote.
        with open(self.status_file) as f:
            status = json.load(f)
        for entry in status["loader"]:
            stats = entry.get("stats", {})
            self.assertGreaterEqual(stats.get("batches", 0), 2 * 6 + 2 * 4, status)
            self.assertIn("dataStall", stats)
            self.assertEqual([w["exits"] for w in entry["pool"]["workers"]], [0, 0], status)

    def test_ddp_with_the_dataloader_knobs_equals_stock_dataloader(self):
        reports = self.run_job("knobs")
        self.assertEqual(sorted(reports), [(0, 0), (1, 0)], self.output)
        for r in reports.values():
            self.assertEqual((r["served"], r["stock"]),
                             (POOL_ITER, "_MultiProcessingDataLoaderIter"), self.output)
            self.assertTrue(r["equal"], r)
            self.assertEqual(r["batches"], 3 * 5)  # 20 samples per rank, batches of 4
            self.assertEqual(len(r["workers"]), 2, r)

    def test_loader_built_inside_a_library_is_served(self):
        for r in self.run_job("library").values():
            self.assertEqual(r["served"], POOL_ITER, self.output)
            self.assertEqual(r["values"], [i * i for i in range(16)] * 2)

    def test_trainer_that_sets_spawn_first_is_served(self):
        for r in self.run_job("start_method").values():
            self.assertEqual(r["served"], POOL_ITER, self.output)
            self.assertEqual(r["indices"], list(range(8)))

    def test_trainer_with_an_mp_pool_after_tensors_is_served(self):
        for r in self.run_job("mp_pool").values():
            self.assertEqual(r["served"], POOL_ITER, self.output)
            self.assertEqual(r["squares"], [0, 1, 4, 9, 16, 25])
            self.assertEqual(r["indices"], list(range(8)))

    def test_worker_killed_mid_epoch_loses_nothing(self):
        reports = self.run_job("kill")
        self.assertEqual(len(reports), 2, self.output)
        for r in reports.values():
            self.assertEqual(r["served"], POOL_ITER, self.output)
            self.assertTrue(r["in_order"], r)
            self.assertTrue(r["replaced"], r)

    def test_next_epoch_is_built_ahead_and_wrong_predictions_change_nothing(self):
        reports = self.run_job("speculation")
        self.assertEqual(sorted(reports), [(0, 0), (1, 0)], self.output)
        for r in reports.values():
            self.assertEqual(r["served"], [POOL_ITER] * 3, self.output)
            # Every batch, random draws included, as stock DataLoader builds it, and the
            # trainer's own generator untouched by the predictions.
            self.assertEqual(r["equal"], {"global": True, "distributed": True,
                                          "sequential": True}, r)
            self.assertEqual(r["batches"], {"global": 24, "distributed": 12, "sequential": 24})
            self.assertTrue(r["draws_equal"], r)
            # Wrong twice: the global generator moved between epochs; then no more guesses.
            self.assertEqual(r["predictions"]["global"], {"hits": 0, "misses": 2}, r)
            # set_epoch never called: the first guess (epoch 1) misses, the rest hold.
            self.assertEqual(r["predictions"]["distributed"], {"hits": 2, "misses": 1}, r)
            self.assertEqual(r["predictions"]["sequential"], {"hits": 3, "misses": 0}, r)
            # The next epoch's first batch was built before the trainer asked for it.
            self.assertEqual(r["prebuilt"], [True, True, True], r)

    def test_batch_0_is_built_in_the_rank_as_worker_0_would_build_it(self):
        reports = self.run_job("first_batch")
        self.assertEqual(sorted(reports), [(0, 0), (1, 0)], self.output)
        for r in reports.values():
            for name in ("drawing", "caching"):
                got = r[name]
                self.assertEqual((got["served"], got["stock"]),
                                 (POOL_ITER, "_MultiProcessingDataLoaderIter"), self.output)
                self.assertTrue(got["equal"], (name, self.output))
                # The trainer's streams, threads, worker info and CUDA seeds: as stock's.
                self.assertTrue(got["state_equal"], (name, got["state"]))
            # The dataset drew from the random streams: built here all the same (worker 0
            # goes on from the streams it left), the other batches by the pool's workers.
            self.assertEqual(r["drawing"]["batch0_pids"], [r["pid"]], self.output)
            self.assertEqual(len(set(r["drawing"]["pids"]) - {r["pid"]}), 2, self.output)
            # Building changed the dataset (its cache): left to worker 0.
            self.assertNotIn(r["pid"], r["caching"]["pids"], self.output)
        self.assertEqual(self.output.count("batch 0 of a DataLoader's first epoch is built in "
                                           "the trainer's process"), 2, self.output)  # a rank

    def test_a_start_up_starved_at_idle_priority_starts_over_at_normal_priority(self):
        # A worker's start-up imports run at idle CPU priority. Here they never end at idle
        # priority (pool_trainers/idle_forever.py, a preloaded module, sleeps while the
        # priority is idle), and every check while the rank waits counts as starved
        # (SPAWNPOINT_LOADER_STARVED_SHARE=-1: a stand-in for other processes keeping the
        # CPUs busy). Each worker starts over at normal priority, says so once, and serves.
        reports = self.run_job("starved", env={
            "SPAWNPOINT_LOADER_STARVED_SHARE": "-1",
            "PYTHONPATH": os.path.join(HERE, "pool_trainers")}, preload=["idle_forever"])
        self.assertEqual(sorted(reports), [(0, 0), (1, 0)], self.output)
        for r in reports.values():
            self.assertEqual(r["served"], POOL_ITER, self.output)
            self.assertEqual(r["indices"], list(range(12)), self.output)
        # 2 ranks x 2 workers, each once.
        self.assertEqual(self.output.count("they start over at normal priority"), 4,
                         self.output)

    def test_restarted_rank_reconnects_to_the_same_warm_workers(self):
        reports = self.run_job("restart", max_restarts=1)
        self.assertIn((1, 0), reports, self.output)
        self.assertIn((1, 1), reports, self.output)
        for rank in (0, 1):
            before, after = reports.get((rank, 0)), reports[(rank, 1)]
            self.assertEqual(after["served"], POOL_ITER, self.output)
            if before is not None:
                self.assertEqual(after["workers"], before["workers"],
                                 "rank %d's workers were not kept" % rank)
            # The workers were running before the restarted rank was: its first batch needed
            # no worker start-up.
            for t in after["workers_started"]:
                self.assertLess(t, after["started"], self.output)


if __name__ == "__main__":
    unittest.main()
