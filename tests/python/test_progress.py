"""Tests of the rank side of the progress record and of Python stacks on request.

ProgressTest: real interpreters with the shim (SPAWNPOINT_SHIM=1) and a record named in
SPAWNPOINT_PROGRESS_FILE train a tiny model with torch's SGD: the record shows the optimizer
steps with their durations; spawnpoint.step() makes the record explicit; a process the rank
starts does not write. WaitTest: two real ranks (gloo) of which rank 1 works longer per
step: rank 0's record shows the wait for its peer, through DDP (its default allreduce, or a
hook of the trainer's own) or blocking collectives, and both ranks exit after tearing their
process group down; a backward without DDP waits for nothing; BackwardClock's arithmetic.
OptimizerHookTest: the hook on a fake torch.optim.optimizer, for
torch >= 2.0 (the global post-hook) and 1.x (wrapped step()s), without torch. StackTest:
SPAWNPOINT_STACK_SIGNAL makes faulthandler write every thread's stack to
SPAWNPOINT_STACK_FILE. The shim is taken from SPAWNPOINT_TEST_SHIM_DIR (ctest: the build's
share/spawnpoint/python), else from the source tree. Run through run_shim_tests.py (ctest).
"""

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("SPAWNPOINT_SOURCE_DIR") or os.path.dirname(os.path.dirname(HERE))
SHIM_DIR = (os.environ.get("SPAWNPOINT_TEST_SHIM_DIR")
            or os.path.join(SOURCE_DIR, "agent", "python"))
PYTHON = sys.executable  # /usr/bin/python3 under ctest: Debian's, with torch
TIMEOUT = 120

# The record's layout (agent/progress/progress_record.h).
MAGIC = b"SPPROG1\0"
HEADER = struct.Struct("<8sIIQQQI4xQQ")  # magic version pid steps last first source attach
                                         # waiting_since
DURATIONS = 64
RING = 256
WAITS = DURATIONS + 4 * RING
OPTIMIZER, LOADER, EXPLICIT = 1, 2, 3


def create_record(path):
    """What the agent's ProgressFile::Create makes: 4096 zero bytes, magic and version."""
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<I", 3) + bytes(4096 - 12))


def read_record(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, pid, steps, last, first, source, attach, waiting = HEADER.unpack_from(data, 0)
    ring = struct.unpack_from("<%dI" % RING, data, DURATIONS)
    waits = struct.unpack_from("<%dI" % RING, data, WAITS)
    numbers = range(max(1, steps - RING + 1), steps + 1)
    return {"magic": magic, "version": version, "pid": pid, "steps": steps, "last_ns": last,
            "first_ns": first, "source": source, "attach_ns": attach, "waiting_since_ns": waiting,
            "recent_us": [ring[(n - 1) % RING] for n in numbers],
            "recent_wait_us": [waits[(n - 1) % RING] for n in numbers]}


def environment(extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SPAWNPOINT_") and k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update({"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": SHIM_DIR, "SPAWNPOINT_SHIM": "1"})
    env.update(extra)
    return env


def run(args, cwd, extra):
    proc = subprocess.run([PYTHON] + list(args), cwd=cwd, env=environment(extra),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=TIMEOUT)
    if proc.returncode != 0:
        raise AssertionError("%s exited with %d\nstdout:\n%s\nstderr:\n%s"
                             % (args, proc.returncode, proc.stdout, proc.stderr))
    return json.loads(proc.stdout.strip().splitlines()[-1])


# A rank: `steps` SGD steps on a tiny model; "explicit": spawnpoint.step() after each;
# "child": first runs itself as a child (a process the rank starts), which trains too.
TRAINER = textwrap.dedent("""\
    import json, os, subprocess, sys
    import torch
    import spawnpoint

    mode, steps = sys.argv[1], int(sys.argv[2])
    child = None
    if mode == "child":
        child = subprocess.run([sys.executable, __file__, "explicit", "3"],
                               stdout=subprocess.PIPE, universal_newlines=True, check=True)
        child = json.loads(child.stdout.strip().splitlines()[-1])
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
        if mode == "explicit":
            spawnpoint.step()
    print(json.dumps({"pid": os.getpid(), "child": child,
                      "env": sorted(k for k in os.environ if k.startswith("SPAWNPOINT_P"))}))
""")


class ProgressTestCase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="spawnpoint-progress-test-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.record = os.path.join(self.tmp, "rank-0.progress")
        create_record(self.record)

    def write(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path


class ProgressTest(ProgressTestCase):
    def train(self, mode, steps):
        script = self.write("train.py", TRAINER)
        return run([script, mode, str(steps)], self.tmp,
                   {"SPAWNPOINT_PROGRESS_FILE": self.record})

    def test_optimizer_steps_are_counted_with_their_durations(self):
        out = self.train("plain", 5)
        r = read_record(self.record)
        self.assertEqual(r["magic"], MAGIC)
        self.assertEqual(r["steps"], 5)
        self.assertEqual(r["source"], OPTIMIZER)
        self.assertEqual(r["pid"], out["pid"])
        self.assertEqual(out["env"], [], "the shim takes the record out of the environment")
        self.assertEqual(len(r["recent_us"]), 5)
        # The first step is measured from the shim's start (import torch included).
        self.assertGreater(r["attach_ns"], 0)
        self.assertGreater(r["first_ns"], r["attach_ns"])
        self.assertGreaterEqual(r["last_ns"], r["first_ns"])
        self.assertEqual(r["recent_us"][0], (r["first_ns"] - r["attach_ns"]) // 1000)
        self.assertGreater(r["recent_us"][0], 0)
        # The durations add up to the time between the first step's end and the last's.
        self.assertAlmostEqual(sum(r["recent_us"][1:]), (r["last_ns"] - r["first_ns"]) / 1000,
                               delta=4)

    def test_explicit_steps_win(self):
        self.train("explicit", 5)
        r = read_record(self.record)
        # The first optimizer step counts before the first spawnpoint.step(); from then on,
        # only spawnpoint.step().
        self.assertEqual(r["steps"], 6)
        self.assertEqual(r["source"], EXPLICIT)

    def test_a_process_the_rank_starts_does_not_write(self):
        out = self.train("child", 5)
        self.assertEqual(out["child"]["env"], [])
        r = read_record(self.record)
        self.assertEqual(r["steps"], 5)  # the child's 3 optimizer and 3 explicit steps: none
        self.assertEqual(r["source"], OPTIMIZER)
        self.assertEqual(r["pid"], out["pid"])

    def test_spawnpoint_step_is_a_no_op_outside_the_agent(self):
        script = self.write("bare.py", textwrap.dedent("""\
            import json, spawnpoint
            spawnpoint.step()
            spawnpoint.step()
            print(json.dumps({}))
        """))
        # The package on the path but no shim: nothing happens, nothing fails.
        run([script], self.tmp, {"SPAWNPOINT_SHIM": "0",
                                 "SPAWNPOINT_PROGRESS_FILE": self.record})
        run([script], self.tmp, {})  # the shim without a record
        self.assertEqual(read_record(self.record)["steps"], 0)

    def test_an_unusable_record_is_reported_once(self):
        with open(self.record, "wb") as f:
            f.write(b"nope")
        script = self.write("bad.py", textwrap.dedent("""\
            import json, spawnpoint
            spawnpoint.step()
            spawnpoint.step()
            print(json.dumps({}))
        """))
        proc = subprocess.run([PYTHON, script], cwd=self.tmp, universal_newlines=True,
                              env=environment({"SPAWNPOINT_PROGRESS_FILE": self.record}),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=TIMEOUT)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stderr.count("spawnpoint-shim: progress record %s: 4 bytes"
                                           % self.record), 1, proc.stderr)


# Two ranks (gloo, a FileStore): rank 1 "works" 300 ms per step before its forward, rank 0
# 10 ms. mode "ddp": DDP with its default allreduce; "hook": DDP with the trainer's own comm
# hook (it must still run); "blocking": no DDP, gradients averaged with dist.all_reduce;
# "local": no DDP and no collective. Each rank then tears down its process group before its
# model (what hung a rank at exit when the shim timed DDP with a Python comm hook), except in
# "hook": with a Python comm hook of the trainer's own that order hangs torch 1.13's gloo
# ranks now and then without the shim too (2 runs in 8 here).
WAIT_TRAINER = textwrap.dedent("""\
    import json, os, sys, time
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    mode, rank, store = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)

    def gate():  # rank 1 holds back until the test opens the gate
        if rank == 1:
            while not os.path.exists(store + ".gate"):
                time.sleep(0.01)

    if mode == "gate-init":  # rank 0 waits in DDP's construction (its broadcast)
        gate()
        mode = "ddp"
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    calls = []
    if mode in ("ddp", "hook", "gate-ddp"):
        model = DistributedDataParallel(model)
        open("%s.ddp-%d" % (store, rank), "w").close()
    if mode == "hook":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        def my_hook(state, bucket):
            calls.append(1)
            return default_hooks.allreduce_hook(state, bucket)

        model.register_comm_hook(None, my_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if mode in ("gate-ddp", "gate-barrier"):  # in its first backward, or in barrier()
        gate()
        if mode == "gate-barrier":
            dist.barrier()
        mode = "ddp" if mode == "gate-ddp" else "local"
    for _ in range(6):
        time.sleep(0.3 if rank == 1 else 0.01)
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        if mode == "blocking":
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= 2
        opt.step()
    if mode != "hook":
        dist.destroy_process_group()
        del model, opt
        import gc
        gc.collect()
    print(json.dumps({"hook_calls": len(calls)}))
""")


class WaitTest(ProgressTestCase):
    def start_pair(self, mode, name):
        """WAIT_TRAINER's two ranks in `mode`, each with a fresh record: (store, records,
        processes)."""
        script = self.write("pair.py", WAIT_TRAINER)
        store = os.path.join(self.tmp, "store-" + name)
        records = [os.path.join(self.tmp, "%s-%d.progress" % (name, r)) for r in (0, 1)]
        procs = []
        for r in (0, 1):
            create_record(records[r])
            procs.append(subprocess.Popen(
                [PYTHON, script, mode, str(r), store], cwd=self.tmp,
                env=environment({"SPAWNPOINT_PROGRESS_FILE": records[r]}),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True))
        return store, records, procs

    def train_pair(self, mode):
        _, records, procs = self.start_pair(mode, "rank")
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=TIMEOUT)
            self.assertEqual(p.returncode, 0, err)
            outs.append(json.loads(out.strip().splitlines()[-1]))
        return outs, [read_record(path) for path in records]

    def check_rank_0_waits_for_rank_1(self, records):
        for r in records:
            self.assertEqual(r["steps"], 6)
            for wait, duration in zip(r["recent_wait_us"], r["recent_us"]):
                self.assertLessEqual(wait, duration)
        # Steps 2..6 (the first includes start-up): rank 0 waits ~290 ms of each for rank 1,
        # rank 1 hardly at all (margins far beyond a loaded machine's jitter).
        fast = sorted(records[0]["recent_wait_us"][1:])[2]
        slow = sorted(records[1]["recent_wait_us"][1:])[2]
        self.assertGreater(fast, 150000, records)
        self.assertLess(slow, 150000, records)
        busy = [sorted(d - w for d, w in zip(r["recent_us"][1:], r["recent_wait_us"][1:]))[2]
                for r in records]
        self.assertGreater(busy[1], 2 * busy[0], records)

    def test_ddp_default_allreduce(self):
        _, records = self.train_pair("ddp")
        self.check_rank_0_waits_for_rank_1(records)

    def test_ddp_with_the_trainers_own_hook(self):
        outs, records = self.train_pair("hook")
        self.assertEqual([o["hook_calls"] for o in outs], [6, 6], "the trainer's hook runs")
        self.check_rank_0_waits_for_rank_1(records)

    def test_blocking_collectives(self):
        _, records = self.train_pair("blocking")
        self.check_rank_0_waits_for_rank_1(records)

    def test_a_backward_without_ddp_waits_for_nothing(self):
        _, records = self.train_pair("local")
        for r in records:
            self.assertEqual(r["steps"], 6)
            self.assertEqual(r["recent_wait_us"], [0] * 6, records)

    def test_the_record_says_live_since_when_the_rank_waits_for_its_peers(self):
        # DDP's construction broadcasts, barrier() and DDP's allreduce in backward: while rank
        # 1 holds back, rank 0's record says since when it waits; 0 once it no longer does.
        for mode in ("gate-init", "gate-ddp", "gate-barrier"):
            store, records, procs = self.start_pair(mode, mode)
            deadline = time.monotonic() + TIMEOUT
            # gate-ddp: the wait in backward, not the one in DDP's construction before it.
            while (read_record(records[0])["waiting_since_ns"] == 0 or
                   mode == "gate-ddp" and not os.path.exists(store + ".ddp-0")):
                self.assertLess(time.monotonic(), deadline, "rank 0 never said it waits")
                if procs[0].poll() is not None:
                    self.fail("rank 0 ended: %r" % (procs[0].communicate(),))
                time.sleep(0.05)
            since = read_record(records[0])["waiting_since_ns"]
            self.assertLessEqual(since, time.monotonic_ns())
            self.assertEqual(read_record(records[0])["steps"], 0, "it waits before its first step")
            if mode != "gate-ddp":  # there rank 1 may still be leaving DDP's construction
                self.assertEqual(read_record(records[1])["waiting_since_ns"], 0, "rank 1 held")
            open(store + ".gate", "w").close()
            for p in procs:
                _, err = p.communicate(timeout=TIMEOUT)
                self.assertEqual(p.returncode, 0, err)
            for path in records:
                r = read_record(path)
                self.assertEqual((r["steps"], r["waiting_since_ns"]), (6, 0), (mode, r))

    def test_backward_clock(self):
        sys.path.insert(0, SHIM_DIR)
        self.addCleanup(sys.path.remove, SHIM_DIR)
        from spawnpoint_rank._collective import BackwardClock

        clock = BackwardClock()
        # Gradients at 10 and 30, backward returned at 50: waited 50 - 30.
        clock.begin()
        clock.grad(10)
        clock.grad(30)
        self.assertEqual(clock.end(50), 20)
        # A pass without a DDP gradient: nothing.
        clock.begin()
        self.assertEqual(clock.end(60), 0)
        # A backward inside the pass (a hook's own) is part of it: only the outer end counts.
        clock.begin()
        clock.grad(100)
        clock.begin()
        clock.grad(120)
        self.assertEqual(clock.end(125), 0)
        clock.grad(130)
        self.assertEqual(clock.end(170), 40)
        # Gradients stamped out of order (autograd's device threads): the latest counts.
        clock.begin()
        clock.grad(220)
        clock.grad(210)
        self.assertEqual(clock.end(230), 10)


# A fake torch.optim.optimizer: a base Optimizer and, defined before the hook runs, a
# subclass; with HAS_GLOBAL_HOOK the torch >= 2.0 API the hook uses instead.
FAKE_OPTIMIZER = textwrap.dedent("""\
    _post_hooks = []

    class Optimizer(object):
        def step(self):
            raise NotImplementedError

    class Early(Optimizer):
        def step(self):
            self.calls = getattr(self, "calls", 0) + 1
            for hook in _post_hooks:  # what torch 2.x's wrapper does
                hook(self, (), {})
""")
GLOBAL_HOOK = textwrap.dedent("""\

    def register_optimizer_step_post_hook(hook):
        _post_hooks.append(hook)
""")
FAKE_TRAINER = textwrap.dedent("""\
    import json, sys
    from torch.optim.optimizer import Optimizer, Early

    class Late(Early):  # defined after the hook; its step() calls the base's
        def step(self):
            super().step()

    class Failing(Optimizer):
        def step(self):
            raise RuntimeError("no step")

    Early().step()
    Late().step()
    try:
        Failing().step()
    except RuntimeError:
        pass
    print(json.dumps({"wrapped": getattr(Late.step, "_spawnpoint_counted", False)}))
""")


class OptimizerHookTest(ProgressTestCase):
    def run_fake(self, global_hook):
        package = os.path.join(self.tmp, "fake", "torch", "optim")
        os.makedirs(package)
        for init in (os.path.dirname(package), package):
            self.write(os.path.join(init, "__init__.py"), "")
        self.write(os.path.join(package, "optimizer.py"),
                   FAKE_OPTIMIZER + (GLOBAL_HOOK if global_hook else ""))
        script = self.write("train.py", FAKE_TRAINER)
        return run([script], self.tmp, {"SPAWNPOINT_PROGRESS_FILE": self.record,
                                        "PYTHONPATH": SHIM_DIR + os.pathsep
                                        + os.path.join(self.tmp, "fake")})

    def test_torch_1_wraps_each_step_once(self):
        out = self.run_fake(global_hook=False)
        self.assertTrue(out["wrapped"])
        r = read_record(self.record)
        # Early().step(), Late().step() (once, though it calls Early.step); not Failing's.
        self.assertEqual(r["steps"], 2)
        self.assertEqual(r["source"], OPTIMIZER)

    def test_torch_2_uses_the_global_post_hook(self):
        out = self.run_fake(global_hook=True)
        self.assertFalse(out["wrapped"])
        # Torch's own wrapper (here: Early.step) calls the post hooks once per step() call,
        # also for a super().step().
        self.assertEqual(read_record(self.record)["steps"], 2)


# A rank blocked in blocked_here(): says "ready", then waits for a line on stdin.
BLOCKED = textwrap.dedent("""\
    import json, os, sys, threading

    def blocked_here():
        print("ready", flush=True)
        return sys.stdin.readline()

    def helper_thread_here(event):
        event.wait()

    done = threading.Event()
    helper = threading.Thread(target=helper_thread_here, args=(done,))
    helper.start()
    blocked_here()
    done.set()
    helper.join()
    print(json.dumps({"env": sorted(k for k in os.environ if k.startswith("SPAWNPOINT_STACK"))}))
""")


class StackTest(ProgressTestCase):
    def test_signal_writes_every_python_threads_stack(self):
        script = self.write("blocked.py", BLOCKED)
        stacks = self.write("rank-0.stacks", "earlier content\n")
        proc = subprocess.Popen(
            [PYTHON, script], cwd=self.tmp, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, universal_newlines=True,
            env=environment({"SPAWNPOINT_STACK_SIGNAL": str(int(signal.SIGUSR2)),
                             "SPAWNPOINT_STACK_FILE": stacks}))
        try:
            self.assertEqual(proc.stdout.readline().strip(), "ready")
            proc.send_signal(signal.SIGUSR2)  # handled before the child reads the line below
            out, err = proc.communicate("go\n", timeout=TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.assertEqual(proc.returncode, 0, err)
        self.assertEqual(json.loads(out.strip().splitlines()[-1])["env"], [])
        with open(stacks) as f:
            text = f.read()
        self.assertTrue(text.startswith("earlier content\n"), text)  # appended
        self.assertIn("blocked_here", text)
        self.assertIn("helper_thread_here", text)
        self.assertIn("Current thread", text)

    def test_a_bad_signal_is_reported_and_the_rank_runs(self):
        script = self.write("ok.py", "import json; print(json.dumps({}))\n")
        proc = subprocess.run(
            [PYTHON, script], cwd=self.tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            universal_newlines=True, timeout=TIMEOUT,
            env=environment({"SPAWNPOINT_STACK_SIGNAL": "SIGUSR2",
                             "SPAWNPOINT_STACK_FILE": os.path.join(self.tmp, "s")}))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("spawnpoint-shim: no Python stacks on request", proc.stderr)


if __name__ == "__main__":
    unittest.main()
