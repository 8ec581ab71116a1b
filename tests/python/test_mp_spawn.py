"""Scripts that start their own ranks with torch.multiprocessing.spawn, on the agent's ranks
(spawnpoint_rank/_mp_spawn.py; issue 37). Run through run_shim_tests.py (ctest).

MpSpawnUnitTest (no torch): the pure parts, and the hook on a fake torch.multiprocessing.spawn.
MpSpawnTorchTest (torch): the hook on torch's own module, in one interpreter with the shim: an
exception of fn as torch's join() raises it, join=False, and torch's own processes outside an
agent rank.
MpSpawnAgentTest (torch and --agent): the PyTorch DDP tutorial's multigpu.py
(mp_spawn_scripts/, CPU edits only) under `spawnpoint-agent run`: on 2 ranks it trains in the
ranks themselves (no other Python process starts; each rank's optimizer steps are its
own) and says the mapping once; nprocs that is not the job's ranks per node, and a 2-node job
running the single-node script, end with one line naming the script's line.
"""

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
from unittest import mock

from test_rank_side import SHIM_DIR  # noqa: F401  (and spawnpoint_rank, from SHIM_DIR)
from test_shim import PYTHON, clean_environment, run_python

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ports import free_port  # noqa: E402  (tests/support/ports.py)

import spawnpoint_rank  # noqa: E402
from spawnpoint_rank import _mp_spawn  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "mp_spawn_scripts")
TIMEOUT = 300  # every rank imports torch, on a loaded 2-core machine
# The variables the agent starts a rank with (sitecustomize's job_environment).
AGENT = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "RANK": "1", "WORLD_SIZE": "2",
         "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "NNODES": "1",
         "TORCHELASTIC_RUN_ID": "default/job"}
MAPPING = ("torch.multiprocessing.spawn(main, nprocs=2) at multigpu.py:%d: each of the agent's "
           "2 ranks on this node runs main(LOCAL_RANK, ...) itself; nothing is spawned")
RENDEZVOUS = ("MASTER_ADDR/MASTER_PORT set by the script (localhost:12355) replaced by the "
              "agent's 127.0.0.1:%s for init_process_group at multigpu.py:%d")


def line_of(text, script="multigpu.py"):
    """The line number of the one line of a script holding `text`."""
    with open(os.path.join(SCRIPTS, script)) as f:
        found = [n for n, line in enumerate(f, 1) if text in line]
    assert len(found) == 1, (text, found)
    return found[0]


class ProcessRaisedException(Exception):
    def __init__(self, msg, error_index, error_pid):
        super().__init__(msg)
        self.error_index, self.pid = error_index, error_pid


class FakeSpawnModule(object):
    """torch.multiprocessing.spawn as far as the hook sees it: spawn() calls start_processes."""

    ProcessRaisedException = ProcessRaisedException

    def __init__(self):
        self.started = []

    def start_processes(self, fn, args=(), nprocs=1, join=True, daemon=False,
                        start_method="spawn"):
        self.started.append((fn, args, nprocs))
        return "torch's"

    def spawn(self, fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
        return self.start_processes(fn, args, nprocs, join, daemon, "spawn")


class MpSpawnUnitTest(unittest.TestCase):
    def setUp(self):
        _mp_spawn._said.clear()
        self.module = FakeSpawnModule()
        self.module.start_processes = self.module.start_processes  # instance attributes
        self.module.spawn = self.module.spawn
        _mp_spawn.patch(self.module)
        _mp_spawn.patch(self.module)  # a second copy of the shim wraps nothing twice
        self.job = _mp_spawn.job_of(AGENT)

    def run_call(self, call, environ=AGENT, *args, **kwargs):
        """call(*args, **kwargs) with the agent's variables; (result, stderr)."""
        err = io.StringIO()
        with mock.patch.object(spawnpoint_rank, "job_environment", environ, create=True), \
                mock.patch.object(sys, "stderr", err):
            result = call(*args, **kwargs)
        return result, err.getvalue()

    def test_job_of(self):
        self.assertEqual(self.job, _mp_spawn.Job(1, 1, 2, 2, 1, "127.0.0.1", "29500"))
        self.assertIsNone(_mp_spawn.job_of(None))
        self.assertIsNone(_mp_spawn.job_of({k: v for k, v in AGENT.items()
                                            if k != "TORCHELASTIC_RUN_ID"}))
        self.assertIsNone(_mp_spawn.job_of(dict(AGENT, RANK="x")))
        no_nnodes = {k: v for k, v in AGENT.items() if k != "NNODES"}
        self.assertEqual(_mp_spawn.job_of(dict(no_nnodes, WORLD_SIZE="8")).nodes, 4)

    def test_fn_runs_in_this_rank_with_its_local_rank(self):
        ran = []
        for name in ("spawn", "start_processes"):
            result, said = self.run_call(getattr(self.module, name), AGENT,
                                         lambda i, a, b: ran.append((i, a, b, os.getpid())),
                                         args=("a", "b"), nprocs=2)
            self.assertIsNone(result)
            self.assertEqual(said, "", "rank 1 says nothing")
        self.assertEqual(ran, [(1, "a", "b", os.getpid())] * 2)
        self.assertEqual(self.module.started, [], "torch started processes")
        self.assertFalse(getattr(self.module.spawn.__wrapped__, "_spawnpoint_mapped", False),
                         "wrapped twice")

    def test_rank_0_says_the_mapping_once(self):
        def main(i):
            pass

        err = io.StringIO()
        with mock.patch.object(spawnpoint_rank, "job_environment", dict(AGENT, RANK="0"),
                               create=True), mock.patch.object(sys, "stderr", err):
            said = []
            for _ in range(2):
                here = sys._getframe().f_lineno + 1
                self.module.spawn(main, nprocs=2)
                said.append(err.getvalue())
                err.truncate(0)
                err.seek(0)
        self.assertEqual(said, ["spawnpoint-shim: torch.multiprocessing.spawn(main, nprocs=2) at "
                                "test_mp_spawn.py:%d: each of the agent's 2 ranks on this node "
                                "runs main(LOCAL_RANK, ...) itself; nothing is spawned\n" % here,
                                ""])

    def test_exception_as_torchs_join_raises_it(self):
        def main(i):
            raise KeyError("boom")

        with self.assertRaises(ProcessRaisedException) as caught:
            self.run_call(self.module.spawn, AGENT, main, nprocs=2)
        error = caught.exception
        self.assertEqual((error.error_index, error.pid), (1, os.getpid()))
        self.assertTrue(str(error).startswith(
            "\n\n-- Process 1 terminated with the following error:\nTraceback"), str(error))
        self.assertIn('raise KeyError("boom")', str(error))
        self.assertIsInstance(error.__context__, KeyError)
        # join=False: fn has run; its exception comes at the first join(), as torch's.
        context, _ = self.run_call(self.module.start_processes, AGENT, main, nprocs=2,
                                   join=False)
        self.assertEqual(context.pids(), [os.getpid()])
        self.assertRaises(ProcessRaisedException, context.join)
        self.assertTrue(context.join())
        context, _ = self.run_call(self.module.spawn, AGENT, lambda i: None, nprocs=2, join=False)
        self.assertTrue(context.join())

    def test_other_nprocs_ends_the_rank_naming_the_line(self):
        err = io.StringIO()
        with self.assertRaises(SystemExit) as caught, mock.patch.object(sys, "stderr", err), \
                mock.patch.object(spawnpoint_rank, "job_environment", AGENT, create=True):
            here = sys._getframe().f_lineno + 1
            self.module.spawn(lambda i: self.fail("ran"), nprocs=4)
        self.assertEqual(caught.exception.code, 1)
        self.assertEqual(err.getvalue(), (
            "spawnpoint-shim: fatal: torch.multiprocessing.spawn(<lambda>, nprocs=4) at "
            "test_mp_spawn.py:%d: the agent runs 2 ranks on this node (LOCAL_WORLD_SIZE=2), not "
            "4, and each runs <lambda>(LOCAL_RANK, ...) itself in place of a spawned process; "
            "give nprocs=2 (int(os.environ['LOCAL_WORLD_SIZE'])) or make the job's procsPerNode "
            "(gpusPerNode) 4\n" % here))
        self.assertEqual(self.module.started, [])

    def test_torchs_own_processes_outside_an_agent_rank_and_for_a_ranks_helpers(self):
        def fn(i):
            pass

        for environ in (None, {k: v for k, v in AGENT.items() if k != "TORCHELASTIC_RUN_ID"}):
            self.assertEqual(self.run_call(self.module.spawn, environ, fn, nprocs=2)[0], "torch's")
        # A process group already set up: the rank starts helpers, whatever their number.
        dist = mock.Mock(is_available=lambda: True, is_initialized=lambda: True)
        with mock.patch.dict(sys.modules, {"torch.distributed": dist}):
            self.assertEqual(self.run_call(self.module.spawn, AGENT, fn, nprocs=3)[0], "torch's")
        # Inside a mapped fn, a second spawn is the fn's own business.
        inner = []
        self.run_call(self.module.spawn, AGENT, lambda i: inner.append(
            self.module.start_processes(fn, nprocs=5)), nprocs=2)
        self.assertEqual(inner, ["torch's"])
        self.assertEqual([started[2] for started in self.module.started], [2, 2, 3, 5])

    def test_world_error(self):
        call = _mp_spawn.Call("torch.multiprocessing.spawn", print, 1, "s.py:9")
        job = _mp_spawn.job_of(dict(AGENT, WORLD_SIZE="2", LOCAL_WORLD_SIZE="1", NNODES="2"))
        check = lambda args, kwargs, env={}: _mp_spawn.world_error(args, kwargs, env, job,
                                                                   "s.py:3", call)
        self.assertIsNone(check(("gloo",), {}))
        self.assertIsNone(check(("gloo",), {"rank": 1, "world_size": 2}))
        self.assertIsNone(check(("gloo", None, None, 2, 1), {}, {"RANK": "1"}))
        self.assertIsNone(check(("gloo",), {"rank": -1, "world_size": -1}))
        self.assertEqual(check(("gloo",), {"rank": 0, "world_size": 1}), (
            "init_process_group at s.py:3 with world_size=1, rank=0 contradicts the job: 2 ranks "
            "(WORLD_SIZE=2) on 2 nodes, this one rank 1 (RANK=1); "
            "torch.multiprocessing.spawn(print, nprocs=1) at s.py:9 starts one node's ranks only. "
            "Run it as a job of one node, or pass rank=int(os.environ['RANK']), "
            "world_size=int(os.environ['WORLD_SIZE'])"))
        self.assertIn("with world_size=1 contradicts", check(("gloo", None, None, 1), {}))
        one_node = _mp_spawn.job_of(AGENT)
        self.assertIn("contradicts the job: 2 ranks (WORLD_SIZE=2) on 1 node, this one rank 1 "
                      "(RANK=1); the ranks of torch.multiprocessing.spawn(print, nprocs=1) at "
                      "s.py:9. Pass rank=int(os.environ['RANK'])",
                      _mp_spawn.world_error((), {"world_size": 3}, {}, one_node, "s.py:3", call))
        self.assertIn("with RANK=0 in the environment contradicts",
                      check(("gloo",), {}, {"RANK": "0", "WORLD_SIZE": "2"}))

    def test_rendezvous_put_back(self):
        environ = {"MASTER_ADDR": "localhost", "MASTER_PORT": "12355"}
        replaced = _mp_spawn.replace_rendezvous(environ, self.job)
        self.assertEqual(environ, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
        self.assertEqual(_mp_spawn.rendezvous_line(replaced, self.job, "m.py:4"),
                         "MASTER_ADDR/MASTER_PORT set by the script (localhost:12355) replaced by "
                         "the agent's 127.0.0.1:29500 for init_process_group at m.py:4")
        environ = {"MASTER_ADDR": "127.0.0.1"}
        replaced = _mp_spawn.replace_rendezvous(environ, self.job)
        self.assertEqual(_mp_spawn.rendezvous_line(replaced, self.job, "m.py:4"),
                         "MASTER_PORT set by the script (unset) replaced by the agent's 29500 "
                         "for init_process_group at m.py:4")
        self.assertEqual(_mp_spawn.replace_rendezvous(environ, self.job), {})

    def test_before_init_only_while_a_mapped_fn_runs(self):
        environ = dict(AGENT, RANK="0", MASTER_ADDR="localhost", MASTER_PORT="12355")

        def init():
            _mp_spawn.before_init(("gloo",), {"rank": 0, "world_size": 2})
            return os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]

        with mock.patch.dict(os.environ, environ):
            self.assertEqual(self.run_call(init, dict(AGENT, RANK="0")),
                             (("localhost", "12355"), ""), "changed outside a mapped call")
            got = []
            _, said = self.run_call(self.module.spawn, dict(AGENT, RANK="0"),
                                    lambda i: got.append(init()), nprocs=2)
        self.assertEqual(got, [("127.0.0.1", "29500")])
        self.assertIn("MASTER_ADDR/MASTER_PORT set by the script (localhost:12355) replaced by "
                      "the agent's 127.0.0.1:29500 for init_process_group at test_mp_spawn.py:",
                      said)


class MpSpawnTorchTest(unittest.TestCase):
    """torch's own torch.multiprocessing.spawn module, hooked, in an interpreter with the shim."""

    SCRIPT = textwrap.dedent("""\
        import json, os, sys
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "localhost", "1"  # before torch
        import torch.distributed as dist
        import torch.multiprocessing as mp

        def fn(i, what):
            if what == "raise":
                raise ValueError("boom in %d" % i)
            if what == "init":
                dist.init_process_group("gloo", rank=0, world_size=1)
                print(json.dumps({"port": os.environ["MASTER_PORT"]}), flush=True)
                dist.destroy_process_group()
            print(json.dumps({"index": i, "pid": os.getpid()}), flush=True)

        if __name__ == "__main__":
            what = sys.argv[1]
            if what == "join=False":
                context = mp.start_processes(fn, args=("raise",), nprocs=1, join=False)
                try:
                    context.join()
                except Exception as err:
                    print(json.dumps([hasattr(mp, "ProcessRaisedException"), type(err).__name__,
                                      type(err.__context__).__name__,
                                      getattr(err, "error_index", None), context.join()]))
            else:
                print(json.dumps({"returned": mp.spawn(fn, args=(what,), nprocs=1),
                                  "pid": os.getpid()}))
        """)

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="spawnpoint-mp-spawn-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.script = os.path.join(self.tmp, "script.py")
        with open(self.script, "w") as f:
            f.write(self.SCRIPT)

    def run_script(self, what, environ):
        proc = run_python([self.script, what], self.tmp, env=environ, check=False)
        return proc, [json.loads(line) for line in proc.stdout.splitlines()]

    def test_fn_runs_here_and_its_exception_is_torchs(self):
        rank = dict(AGENT, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
        proc, out = self.run_script("ok", rank)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(out[0]["index"], 0)
        self.assertEqual(out[0]["pid"], out[1]["pid"], "fn ran in another process")
        self.assertIn("spawnpoint-shim: torch.multiprocessing.spawn(fn, nprocs=1) at script.py:",
                      proc.stderr)
        proc, _ = self.run_script("raise", rank)
        self.assertEqual(proc.returncode, 1, proc.stderr)
        self.assertTrue(proc.stderr.rstrip().endswith("ValueError: boom in 0"), proc.stderr)
        proc, out = self.run_script("join=False", rank)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        if out[0][0] is False:  # torch 1.7 has no ProcessRaisedException: fn's own exception
            self.assertEqual(out, [[False, "ValueError", "NoneType", None, True]])
            return
        self.assertEqual(out, [[True, "ProcessRaisedException", "ValueError", 0, True]])
        proc, _ = self.run_script("raise", rank)
        self.assertIn("torch.multiprocessing.spawn.ProcessRaisedException: \n\n-- Process 0 "
                      "terminated with the following error:\nTraceback", proc.stderr)

    def test_the_agents_rendezvous_even_where_the_script_set_its_own_before_torch(self):
        port = str(free_port())
        rank = dict(AGENT, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                    MASTER_PORT=port)
        proc, out = self.run_script("init", rank)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(out[0], {"port": port})
        self.assertIn("spawnpoint-shim: MASTER_ADDR/MASTER_PORT set by the script (localhost:1) "
                      "replaced by the agent's 127.0.0.1:%s for init_process_group at script.py:"
                      % port, proc.stderr)

    def test_torch_spawns_outside_an_agent_rank(self):
        proc, out = self.run_script("ok", {})
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotEqual(out[0]["pid"], out[1]["pid"], "fn did not run in a child")
        self.assertNotIn("torch.multiprocessing.spawn", proc.stderr)


JOB = """\
apiVersion: spawnpoint.dev/v1alpha1
kind: TrainingJob
metadata: {name: multigpu}
spec:
  nodes: %(nodes)d
  gpusPerNode: 0
  procsPerNode: %(ranks)d
  backend: gloo
  template:
    spec:
      containers:
        - name: trainer
          image: unused
          command: %(command)s
  loader: {workersPerRank: 0, pythonPool: false}
  restartPolicy: {maxRestarts: 0}
"""
# Chained by the shim in every Python process of the job: one line each, its pid and parent's.
PROCESS_LOG = textwrap.dedent("""\
    import json, os, sys
    with open(os.environ["PROCESS_LOG"], "a") as f:
        f.write(json.dumps([os.getpid(), os.getppid(), sys.argv]) + "\\n")
""")


@unittest.skipUnless(os.environ.get("SPAWNPOINT_AGENT_BIN"), "needs --agent (the built spawnpoint-agent)")
class MpSpawnAgentTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="spawnpoint-mp-spawn-agent-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.chained = os.path.join(self.tmp, "chained")
        os.mkdir(self.chained)
        with open(os.path.join(self.chained, "sitecustomize.py"), "w") as f:
            f.write(PROCESS_LOG)
        self.log = os.path.join(self.tmp, "processes.jsonl")

    def agent(self, world_size, nodes=1, ranks=2):
        """multigpu.py (2 epochs, a checkpoint every epoch) under the agent; (exit code,
        output, status)."""
        command = [PYTHON, os.path.join(SCRIPTS, "multigpu.py"), "2", "1",
                   "--world_size", str(world_size)]
        job = os.path.join(self.tmp, "job.yaml")
        with open(job, "w") as f:
            f.write(JOB % {"nodes": nodes, "ranks": ranks, "command": json.dumps(command)})
        env = clean_environment()
        env.update(PYTHONPATH=self.chained, PROCESS_LOG=self.log)
        status = os.path.join(self.tmp, "status.json")
        proc = subprocess.run([os.environ["SPAWNPOINT_AGENT_BIN"], "run", "-f", job,
                               "--gpu-backend", "none", "--master-port", "0",
                               "--metrics-addr", "off", "--status-file", status],
                              cwd=self.tmp, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, universal_newlines=True, timeout=TIMEOUT)
        with open(status) as f:
            return proc.returncode, proc.stdout, json.load(f)

    def processes(self):
        """[(pid, parent pid)] of the job's Python processes, each found running multigpu.py,
        none started by another of them."""
        with open(self.log) as f:
            entries = [json.loads(line) for line in f]
        pids = {pid for pid, _, _ in entries}
        for pid, parent, argv in entries:
            self.assertTrue(argv[0].endswith("multigpu.py"), entries)
            self.assertNotIn(parent, pids, "a Python process started by a rank: %s" % entries)
        return [(pid, parent) for pid, parent, _ in entries]

    def test_the_tutorial_trains_in_the_agents_ranks(self):
        code, output, status = self.agent(world_size=2)
        self.assertEqual(code, 0, output)
        self.assertEqual(len(self.processes()), 2, output)
        # Each rank ran main with its own local rank, its optimizer steps counted as its own
        # (a spawned child's would not be: the progress record is the rank's): 2 epochs of
        # 2048 / 2 ranks / 32 a batch.
        for rank in (0, 1):
            for epoch in (0, 1):
                self.assertEqual(output.count("[rank %d] [GPU%d] Epoch %d | Batchsize: 32 | Steps: "
                                              "32\n" % (rank, rank, epoch)), 1, output)
            self.assertNotIn("[rank %d] [GPU%d]" % (rank, 1 - rank), output)
        self.assertEqual([(p["rank"], p["steps"]) for p in status["progress"]], [(0, 64), (1, 64)])
        self.assertTrue(os.path.exists(os.path.join(self.tmp, "checkpoint.pt")))
        self.assertEqual(output.count(MAPPING % line_of("mp.spawn(main")), 1, output)
        port = status_port(output)
        self.assertEqual(output.count(RENDEZVOUS % (port, line_of("init_process_group(backend"))),
                         1, output)
        self.assertEqual(output.count("spawnpoint-shim:"), 2, output)

    def test_nprocs_that_is_not_the_ranks_per_node_ends_the_job_naming_the_line(self):
        code, output, _ = self.agent(world_size=3)
        self.assertEqual(code, 1, output)
        self.assertIn("reason UserError: the shim stopped the rank: \"spawnpoint-shim: fatal: "
                      "torch.multiprocessing.spawn(main, nprocs=3) at multigpu.py:%d: the agent "
                      "runs 2 ranks on this node (LOCAL_WORLD_SIZE=2), not 3"
                      % line_of("mp.spawn(main"), output)
        self.assertNotIn("Epoch", output)
        self.assertTrue(self.processes(), output)  # none started by a rank

    def test_a_two_node_job_running_the_single_node_script_ends_naming_the_line(self):
        code, output, _ = self.agent(world_size=1, nodes=2, ranks=1)
        self.assertEqual(code, 1, output)
        # Whichever rank the agent saw fail first (rank 0's rank=0 agrees with the job).
        self.assertRegex(output, re.escape(
            "spawnpoint-shim: fatal: init_process_group at multigpu.py:%d with world_size=1"
            % line_of("init_process_group(backend")) + r"(, rank=0)? " + re.escape(
            "contradicts the job: 2 ranks (WORLD_SIZE=2) on 2 nodes, this one rank ") + r"\d " +
            re.escape("(RANK=") + r"\d" + re.escape(
                "); torch.multiprocessing.spawn(main, nprocs=1) at multigpu.py:%d starts one "
                "node's ranks only" % line_of("mp.spawn(main")))
        self.assertNotIn("Epoch", output)
        self.assertTrue(self.processes(), output)


def status_port(output):
    """The rendezvous port the agent chose, from its first line."""
    return re.search(r"rendezvous (?:on )?127\.0\.0\.1:(\d+)", output).group(1)


if __name__ == "__main__":
    unittest.main()
