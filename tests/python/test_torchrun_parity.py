"""The same results as torchrun: parity/imagenet_like.py (what PyTorch's imagenet/main.py
does with --dummy --seed, small and on CPU) run by Debian's torchrun and by `spawnpoint-agent
run`, each 2 ranks with gloo, and every line compared: the trainer's random streams (torch,
random, numpy) after each iter() and each batch, each batch's bytes, each loss and each
validation loss. The agent runs it at its defaults (no loader section: the pool is
min(8, CPUs of the rank) workers, 1 on a 2-core machine), so `-j` above the pool's size
makes the pool grow, `-j 0` makes the job's workers take over a loader the code left in its
own process, and an explicit workersPerRank above -j serves fewer workers than the pool has.

Run through run_shim_tests.py --agent (ctest: python_parity_*).
"""

import collections
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import unittest

from test_shim import PYTHON, clean_environment

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "parity", "imagenet_like.py")
TIMEOUT = 600  # ranks and workers import torch on a loaded 2-core machine
LINE = re.compile(r"parity rank=(\d+) (.*)$")

JOB = """\
apiVersion: spawnpoint.dev/v1alpha1
kind: TrainingJob
metadata: {name: parity}
spec:
  nodes: 1
  gpusPerNode: 0
  procsPerNode: 2
  template:
    spec:
      containers:
        - name: trainer
          image: unused
          command: %s
%s"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parity_lines(output):
    """{rank: [event, ...]} from a run's output, whatever prefixes its launcher adds."""
    lines = collections.defaultdict(list)
    for line in output.splitlines():
        m = LINE.search(line)
        if m:
            lines[int(m.group(1))].append(m.group(2))
    return dict(lines)


@unittest.skipUnless(os.environ.get("SPAWNPOINT_AGENT_BIN"), "needs --agent (the built spawnpoint-agent)")
class TorchrunParityTest(unittest.TestCase):
    _reference = {}  # -j -> torchrun's lines, measured once per class run

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="spawnpoint-parity-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def torchrun(self, workers, more=(), events=None):
        """torchrun's lines for -j `workers`. A reference run whose ranks do not print
        `events` lines each (once, under heavy load, one of its lines went missing from
        torchrun's merged output) is run once more: the reference is what is compared
        against, not what is tested."""
        key = (workers,) + tuple(more)
        last = {}
        for _ in range(2):
            if key in self._reference:
                break
            env = clean_environment()
            env["OMP_NUM_THREADS"] = "1"  # what torchrun sets for 2 ranks, and the agent too
            proc = subprocess.run(
                [PYTHON, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node",
                 "2", "-r", "1", "-t", "1", "--master_port", str(free_port()),
                 "--monitor_interval", "0.1", SCRIPT, "-j", str(workers)] + list(more),
                cwd=self.tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                universal_newlines=True, timeout=TIMEOUT)
            self.assertEqual(proc.returncode, 0, proc.stdout)
            lines = parity_lines(proc.stdout)
            if events is None or all(len(lines.get(r, [])) == events for r in (0, 1)):
                self._reference[key] = lines
            else:
                last = lines
        return self._reference.get(key, last)

    def agent(self, workers, loader="", more=()):
        job = os.path.join(self.tmp, "job.yaml")
        with open(job, "w") as f:
            f.write(JOB % (json.dumps([PYTHON, SCRIPT, "-j", str(workers)] + list(more)), loader))
        proc = subprocess.run(
            [os.environ["SPAWNPOINT_AGENT_BIN"], "run", "-f", job, "--gpu-backend", "none",
             "--master-port", "0"],
            cwd=self.tmp, env=clean_environment(), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, universal_newlines=True, timeout=TIMEOUT)
        self.assertEqual(proc.returncode, 0, proc.stdout)
        return proc.stdout

    def assert_same(self, workers, loader="", served_by_pool=True, more=(), events=2 * (6 + 3)):
        expected = self.torchrun(workers, more, events)
        output = self.agent(workers, loader, more)
        got = parity_lines(output)
        self.assertEqual(sorted(expected), [0, 1])
        # By default 2 epochs of 6 steps per rank, each with its iter() lines and a validation.
        self.assertEqual(len(expected[0]), events, expected)
        for rank in (0, 1):
            for i, (want, have) in enumerate(zip(expected[rank], got.get(rank, []))):
                self.assertEqual(have, want, "rank %d, event %d differs from torchrun's\n%s" % (
                    rank, i, output))
            self.assertEqual(len(got.get(rank, [])), len(expected[rank]), output)
        if served_by_pool:
            self.assertNotIn("runs on torch's own workers", output)
        return output

    def test_default_pool_grows_to_the_workers_the_code_asks_for(self):
        output = self.assert_same(2)
        self.assertIn("grows", output)

    def test_default_pool_grows_to_main_pys_default_four(self):
        self.assert_same(4)

    def test_pool_larger_than_the_code_asks_for(self):
        self.assert_same(2, "  loader: {workersPerRank: 3}\n")

    def test_loader_the_code_left_in_its_process(self):
        # The dataset draws from the global streams while it builds a batch: the job's
        # workers would draw from their own seeds instead, so the loader stays in the rank.
        output = self.assert_same(0)
        self.assertIn("draws from the random streams", output)

    def test_loader_the_pool_refuses_runs_on_torchs_workers(self):
        # More workers than a rank's pool may grow to (8 here): torch's own (spawned) workers
        # build the batches, and the base seed and indices the pool's iterator drew before
        # it was refused are put back first. One epoch without validation keeps it short.
        output = self.assert_same(9, served_by_pool=False, more=("--epochs", "1", "--val-size", "0"),
                                  events=1 + 6)
        self.assertIn("runs on torch's own workers", output)


if __name__ == "__main__":
    unittest.main()
