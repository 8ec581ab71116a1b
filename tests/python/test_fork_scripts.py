"""Scripts written for fork, run under spawn (issue 25), with real processes.

ForkScriptTest (needs --agent and torch): fork_scripts/no_guard.py, a 2-rank DDP trainer with
no main guard, its dataset class in the script, a lambda collate_fn and a closure as
worker_init_fn, trains under `spawnpoint-agent run` on the agent's loader pool exactly as it
does under torchrun with forked workers; on torch's own spawned workers it stops at once with
the shim's one line (exit 1), as does a spawn Pool started at a script's top level. And a
dataset that hangs once past loader.timeoutSeconds costs a worker, not the rank.

ScriptGuardTest (no torch): _script.unguarded_call on small scripts.
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

from test_shim import PYTHON, SHIM_DIR, clean_environment, run_python

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ports import free_port  # noqa: E402  (tests/support/ports.py)

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "fork_scripts")
TIMEOUT = 600  # every rank and worker imports torch, on a loaded 2-core machine
ADVICE = 'Put the training under `if __name__ == "__main__":`'

JOB = """\
apiVersion: spawnpoint.dev/v1alpha1
kind: TrainingJob
metadata: {name: fork-script}
spec:
  nodes: 1
  gpusPerNode: 0
  procsPerNode: %(ranks)d
  backend: gloo
  template:
    spec:
      containers:
        - name: trainer
          image: unused
          command: %(command)s
  loader:
    workersPerRank: 2
    persistentWorkers: false
    pythonPool: %(pool)s
    timeoutSeconds: %(timeout)d
"""


@unittest.skipUnless(os.environ.get("SPAWNPOINT_AGENT_BIN"), "needs --agent (the built spawnpoint-agent)")
class ForkScriptTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="spawnpoint-fork-script-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def agent(self, script, args=(), ranks=2, pool=True, timeout=120):
        """Runs the script under the agent; (exit code, output)."""
        out = tempfile.mkdtemp(dir=self.tmp)
        job = os.path.join(out, "job.yaml")
        command = [PYTHON, os.path.join(SCRIPTS, script), out] + list(args)
        with open(job, "w") as f:
            f.write(JOB % {"ranks": ranks, "command": json.dumps(command),
                           "pool": "true" if pool else "false", "timeout": timeout})
        proc = subprocess.run([os.environ["SPAWNPOINT_AGENT_BIN"], "run", "-f", job,
                               "--gpu-backend", "none", "--master-port", "0",
                               "--metrics-addr", "off", "--status-file",
                               os.path.join(out, "status.json")],
                              cwd=out, env=clean_environment(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, timeout=TIMEOUT)
        return proc.returncode, proc.stdout + proc.stderr, out

    def results(self, out):
        found = {}
        for path in glob.glob(os.path.join(out, "result-rank*.json")):
            with open(path) as f:
                r = json.load(f)
            found[r["rank"]] = r
        return found

    def test_no_guard_script_trains_on_the_pool_as_under_fork(self):
        code, output, out = self.agent("no_guard.py")
        self.assertEqual(code, 0, output)
        pool = self.results(out)
        # The reference: torchrun, whose DataLoader workers are forked (Linux's default).
        ref = tempfile.mkdtemp(dir=self.tmp)
        env = clean_environment()
        env["OMP_NUM_THREADS"] = "1"
        proc = subprocess.run(
            [PYTHON, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
             "-r", "1", "-t", "1", "--master_port", str(free_port()),
             os.path.join(SCRIPTS, "no_guard.py"), ref],
            cwd=ref, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            universal_newlines=True, timeout=TIMEOUT)
        self.assertEqual(proc.returncode, 0, proc.stdout)
        fork = self.results(ref)
        self.assertEqual(sorted(pool), [0, 1], output)
        for rank in (0, 1):
            self.assertEqual(pool[rank]["iterators"], ["_PoolDataLoaderIter"] * 2, output)
            self.assertEqual(fork[rank]["iterators"], ["_MultiProcessingDataLoaderIter"] * 2)
            for key in ("indices", "sums", "weights"):
                self.assertEqual(pool[rank][key], fork[rank][key], "rank %d's %s" % (rank, key))
        self.assertNotIn("Address already in use", output)

    def test_no_guard_script_on_torchs_own_workers_fails_with_one_line(self):
        code, output, out = self.agent("no_guard.py", pool=False)
        self.assertEqual(code, 1, output)
        lines = [line for line in output.splitlines()
                 if ADVICE in line and not line.startswith("[spawnpoint]")]
        self.assertEqual(len(lines), 2, output)  # one per rank
        self.assertIn("no_guard.py:48 starts DataLoader workers", lines[0])
        # The agent's verdict quotes the shim's line, not "exited with code 1".
        self.assertIn('reason UserError: the shim stopped the rank: "spawnpoint-shim: fatal: '
                      'no_guard.py:48 starts DataLoader workers', output)
        self.assertNotIn("Address already in use", output)
        self.assertNotIn("Traceback", output)
        self.assertEqual(self.results(out), {})

    def test_spawn_pool_at_a_scripts_top_level_fails_with_one_line(self):
        # Without the shim's check each Pool worker would start a Pool while bootstrapping,
        # fail, and be respawned forever: this test would time out.
        code, output, _ = self.agent("pool_no_guard.py", ranks=1)
        self.assertEqual(code, 1, output)
        self.assertIn("pool_no_guard.py:11 starts a spawn process at the script's top level",
                      output)
        self.assertIn(ADVICE, output)
        self.assertNotIn("bootstrapping phase", output)

    def test_a_batch_hung_past_the_timeout_costs_a_worker_not_the_rank(self):
        code, output, out = self.agent("slow_batch.py", ["600"], ranks=1, timeout=10)
        self.assertEqual(code, 0, output)
        with open(os.path.join(out, "result.json")) as f:
            result = json.load(f)
        self.assertEqual(result["iterator"], "_PoolDataLoaderIter")
        self.assertEqual(result["batches"], [[2.0 * b, 2.0 * b + 1] for b in range(8)])
        self.assertIn("respawned", output)  # the hung worker, killed and replaced

    def test_a_slow_batch_on_torchs_own_workers_is_not_made_fatal(self):
        # The job's timeoutSeconds is never passed as DataLoader(timeout=): a batch 1 s late
        # is waited for (before, torch raised "DataLoader timed out after 1 seconds").
        code, output, out = self.agent("slow_batch.py", ["3"], ranks=1, pool=False, timeout=1)
        self.assertEqual(code, 0, output)
        with open(os.path.join(out, "result.json")) as f:
            result = json.load(f)
        self.assertEqual(result["iterator"], "_MultiProcessingDataLoaderIter")
        self.assertEqual(len(result["batches"]), 8)


GUARD_PROBE = """\
import json, sys
sys.path.insert(0, %(shim)r)
from spawnpoint_rank import _script

def probe():
    where = _script.unguarded_call()
    return None if where is None else where[1]

seen = {"top": probe()}
def main():
    seen["main"] = probe()
%(tail)s
print(json.dumps(seen))
"""


class ScriptGuardTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="spawnpoint-guard-test-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def run_script(self, tail, args=None):
        path = os.path.join(self.tmp, "script.py")
        with open(path, "w") as f:
            f.write(GUARD_PROBE % {"shim": SHIM_DIR, "tail": textwrap.dedent(tail)})
        proc = run_python(args or [path], self.tmp, pythonpath=(), active=False)
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def test_unguarded_calls_are_found_at_their_line(self):
        seen = self.run_script("main()\n")
        self.assertEqual(seen, {"top": 9, "main": 12})

    def test_calls_under_a_name_guard_are_not(self):
        for guard in ('if __name__ == "__main__":\n    main()\n',
                      'if "__main__" == __name__:\n    main()\n',
                      'if __name__ != "__main__":\n    pass\nelse:\n    main()\n'):
            self.assertEqual(self.run_script(guard)["main"], None, guard)

    def test_other_ifs_do_not_guard(self):
        seen = self.run_script('if len(sys.argv) > 0:\n    main()\n')
        self.assertEqual(seen["main"], 13)

    def test_a_call_inside_a_function_a_guard_runs_is_not_at_the_top_level(self):
        seen = self.run_script('def train():\n    main()\nif __name__ == "__main__":\n'
                               '    train()\n')
        self.assertEqual(seen["main"], None)

    def test_no_script_no_finding(self):
        code = ("import sys; sys.path.insert(0, %r)\nfrom spawnpoint_rank import _script\n"
                "print(_script.unguarded_call())" % SHIM_DIR)
        proc = run_python(["-c", code], self.tmp, pythonpath=(), active=False)
        self.assertEqual(proc.stdout.strip(), "None")


if __name__ == "__main__":
    unittest.main()
