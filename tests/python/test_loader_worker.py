"""Unit tests of the Python loader worker (spawnpoint_rank/worker.py) in this process, without
the pool: the frames over a socket pair and the preloaded modules (a worker process for the
one that fails), and with torch the worker's set-up and fetching compared with torch's own
_worker_loop and _MapDatasetFetcher, loaders served in turn each with its own random
streams, and the probe's rewind. (tests/loader/python_worker_test.cc runs it as a process
under the real PoolClient.) Run through run_shim_tests.py (ctest: python_loader_worker,
python_loader_worker_torch).
"""

import contextlib
import io
import json
import os
import pickle
import random
import socket
import struct
import subprocess
import sys
import tempfile
import unittest

from shim_import import SHIM_DIR, shim_module

worker = shim_module("spawnpoint_rank.worker")
preload = shim_module("spawnpoint_rank._preload")

# Not installed (ModuleNotFoundError for numpy or torch itself): the torch cases skip, and
# run_shim_tests.py exits 77, which ctest reports as Skipped. Installed but failing to import,
# or a torch without the names below, raises: the run fails.
try:
    import numpy as np
    import torch
except ModuleNotFoundError as e:
    if e.name not in ("numpy", "torch"):
        raise
    torch = None
if torch is not None:
    from torch.utils.data import get_worker_info
    from torch.utils.data._utils import worker as torch_worker


class Squares(object):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        if i == 7:
            raise KeyError("no sample 7")
        return i * i


class Batched(Squares):
    def __getitems__(self, indices):
        return ["batched %d" % i for i in indices]


_NUMPY_SEEDED = torch is not None and hasattr(torch_worker, "_generate_state")


class Draws(object):
    """Sample i: (i, a draw of random, torch and numpy, and the worker info's id and seed)."""

    def __len__(self):
        return 100

    def __getitem__(self, i):
        info = get_worker_info()
        # torch < 1.9 (Debian 11's 1.7) does not seed numpy in its workers, so numpy's draws
        # differ from run to run there, stock or not: nothing to compare.
        numpy_draw = float(np.random.rand()) if _NUMPY_SEEDED else 0.0
        return (i, random.random(), torch.rand(()).item(), numpy_draw, info.id, info.seed)


calls = []


def remember_init(worker_id):
    calls.append((worker_id, get_worker_info().id))


def failing_init(worker_id):
    raise RuntimeError("init failed in %d" % worker_id)


@contextlib.contextmanager
def module_dir(files):
    """A directory of modules {name: source} on sys.path, and them unimported afterwards."""
    with tempfile.TemporaryDirectory() as d:
        for name, source in files.items():
            with open(os.path.join(d, name + ".py"), "w") as f:
                f.write(source)
        sys.path.insert(0, d)
        try:
            yield d
        finally:
            sys.path.remove(d)
            for name in files:
                sys.modules.pop(name, None)


class FramesTest(unittest.TestCase):
    def test_messages_and_descriptors_cross_a_socket_pair(self):
        a, b = socket.socketpair()
        sender, receiver = worker.Connection(a), worker.Connection(b)
        try:
            sender.send(worker.PROBE, {"indices": [1, 2]})
            r, w = os.pipe()
            body = b'{"slots": 2}'
            a.sendmsg([struct.pack("<IBBxx", len(body), worker.RING, 1) + body],
                      [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", w))])
            self.assertEqual(receiver.receive(), (worker.PROBE, {"indices": [1, 2]}, -1))
            kind, got, fd = receiver.receive()
            self.assertEqual((kind, got), (worker.RING, {"slots": 2}))
            os.write(fd, b"x")
            self.assertEqual(os.read(r, 1), b"x")
            for f in (r, w, fd):
                os.close(f)
            sender.close()
            self.assertIsNone(receiver.receive())  # the peer went away
        finally:
            receiver.close()


    def test_preload_names_default_to_torch_and_the_script_and_empty_means_none(self):
        self.assertEqual(preload.names({}), ["torch", "__main__"])
        self.assertEqual(preload.names({preload.PRELOAD_ENV: ""}), [])
        self.assertEqual(preload.names({preload.PRELOAD_ENV: " numpy, torchvision,,numpy "}),
                         ["numpy", "torchvision"])

    def test_preload_imports_each_module_and_reports_one_that_fails_once(self):
        files = {"sp_preload_ok": "import sys\nsys.sp_preload_ok_imported = True\n",
                 "sp_preload_broken": "raise RuntimeError('broken on purpose')\n"}
        with module_dir(files):
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                failed = preload.preload({preload.PRELOAD_ENV: (
                    "sp_preload_ok,sp_preload_missing,sp_preload_broken,sp_preload_missing")})
            self.assertTrue(getattr(sys, "sp_preload_ok_imported", False))
            del sys.sp_preload_ok_imported
        self.assertEqual(failed, ["sp_preload_missing", "sp_preload_broken"])
        self.assertEqual(err.getvalue().splitlines(), [
            "spawnpoint loader worker: preloadModules: cannot import sp_preload_missing: "
            "ModuleNotFoundError: No module named 'sp_preload_missing'",
            "spawnpoint loader worker: preloadModules: cannot import sp_preload_broken: "
            "RuntimeError: broken on purpose"])

    SCRIPT = (
        '"""A trainer."""\n'
        "from __future__ import annotations\n"
        "import sp_lead_a, sp_lead_b as b\n"
        "from sp_lead_pkg import sub, VALUE\n"
        "from sp_lead_missing import x\n"
        "import sys\n"
        "sys.path.insert(0, '/nowhere')\n"
        "import sp_after_code\n"
        "if __name__ == '__main__':\n"
        "    import sp_in_main\n")
    MODULES = {name: "" for name in ("sp_lead_a", "sp_lead_b", "sp_after_code", "sp_in_main")}

    def test_the_scripts_leading_imports_are_listed_and_nothing_after_other_code(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "train.py")
            with open(path, "w") as f:
                f.write(self.SCRIPT)
            self.assertEqual(preload.script_imports(path), [
                ("sp_lead_a", None), ("sp_lead_b", None), ("sp_lead_pkg", "sub"),
                ("sp_lead_pkg", "VALUE"), ("sp_lead_missing", "x"), ("sys", None)])
            with open(path, "w") as f:
                f.write("import (\n")  # not Python: nothing to preload, no error
            self.assertEqual(preload.script_imports(path), [])
        self.assertEqual(preload.script_imports("/nonexistent/train.py"), [])

    def test_the_script_entry_imports_them_from_the_scripts_directory(self):
        # A fresh interpreter: the imports must not leak into this process's sys.modules.
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "train.py"), "w") as f:
                f.write(self.SCRIPT)
            for name, source in self.MODULES.items():
                with open(os.path.join(d, name + ".py"), "w") as f:
                    f.write(source)
            os.mkdir(os.path.join(d, "sp_lead_pkg"))
            with open(os.path.join(d, "sp_lead_pkg", "__init__.py"), "w") as f:
                f.write("VALUE = 1\n")
            with open(os.path.join(d, "sp_lead_pkg", "sub.py"), "w") as f:
                f.write("")
            probe = (
                "import json, os, sys\n"
                "from spawnpoint_rank import _preload\n"
                "path = list(sys.path)\n"
                "failed = _preload.preload({'SPAWNPOINT_LOADER_PRELOAD': 'json,__main__', "
                "'SPAWNPOINT_LOADER_MAIN': sys.argv[1]})\n"
                "print(json.dumps({'failed': failed, 'path_kept': sys.path == path, "
                "'modules': sorted(m for m in sys.modules if m.startswith('sp_'))}))\n")
            out = subprocess.run(
                [sys.executable, "-c", probe, os.path.join(d, "train.py")], cwd="/",
                env=dict(os.environ, PYTHONPATH=SHIM_DIR), capture_output=True, text=True,
                timeout=120)
            self.assertEqual(out.returncode, 0, out.stderr)
            got = json.loads(out.stdout)
        self.assertEqual(got["failed"], [])  # the script's own failures are silent
        self.assertTrue(got["path_kept"])
        # The leading imports, the package's submodule; not what follows other code.
        self.assertEqual(got["modules"], ["sp_lead_a", "sp_lead_b", "sp_lead_pkg",
                                          "sp_lead_pkg.sub"])

    def test_a_worker_whose_preload_fails_still_serves(self):
        with tempfile.TemporaryDirectory() as d:
            listen = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listen.bind(os.path.join(d, "worker.sock"))
            listen.listen(1)
            env = dict(os.environ, PYTHONPATH=SHIM_DIR, SPAWNPOINT_LOADER_WORKER_ID="0",
                       SPAWNPOINT_LOADER_LISTEN_FD=str(listen.fileno()),
                       SPAWNPOINT_LOADER_PRELOAD="json,sp_preload_missing")
            proc = subprocess.Popen([sys.executable, "-m", "spawnpoint_rank.worker"],
                                    pass_fds=[listen.fileno()], env=env,
                                    stderr=subprocess.PIPE, universal_newlines=True)
            listen.close()
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(60)
                sock.connect(os.path.join(d, "worker.sock"))
                conn = worker.Connection(sock)
                conn.send(worker.CONFIGURE, {"protocol": 1, "dataset": "index", "workerId": 0})
                kind, body, _ = conn.receive()
                conn.close()
            finally:
                proc.kill()
                _, err = proc.communicate(timeout=60)
        self.assertEqual((kind, body["kind"]), (worker.ERROR, "configure"))
        self.assertIn("Python loader worker", body["message"])
        lines = [l for l in err.splitlines() if "preloadModules" in l]
        self.assertEqual(lines, [
            "spawnpoint loader worker: preloadModules: cannot import sp_preload_missing: "
            "ModuleNotFoundError: No module named 'sp_preload_missing'"], err)


@unittest.skipIf(torch is None, "torch is not installed")
class StarvationTest(unittest.TestCase):
    """_preload.StarvedWhileAwaited: when an idle-priority start-up must start over at normal
    priority (a rank waits for the worker, and the start-up mostly waits for a CPU)."""

    def setUp(self):
        tmp = tempfile.mkdtemp(prefix="spawnpoint-starve-")
        self.addCleanup(__import__("shutil").rmtree, tmp, True)
        self.listen = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(self.listen.close)
        self.path = os.path.join(tmp, "w.sock")
        self.listen.bind(self.path)
        self.listen.listen(4)
        self.now, self.delay = 100.0, 0
        self.watch = preload.StarvedWhileAwaited(
            self.listen.fileno(), 1, clock=lambda: self.now, run_delay_ns=lambda tid: self.delay)

    def advance(self, seconds, waited):
        self.now += seconds
        self.delay += int(waited * 1e9)

    def rank_connects(self):
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(client.close)
        client.connect(self.path)  # pending: the worker has not accepted

    def test_never_while_nobody_waits_for_the_worker(self):
        for _ in range(4):
            self.advance(2.0, waited=2.0)  # starved, but the rank has not asked yet
            self.assertFalse(self.watch.starved())

    def test_once_the_rank_waits_and_the_start_up_mostly_waits_for_a_cpu(self):
        self.rank_connects()
        self.assertFalse(self.watch.starved())  # the window starts
        self.advance(1.0, waited=1.0)
        self.assertFalse(self.watch.starved())  # half a window: not yet
        self.advance(1.0, waited=1.0)
        self.assertTrue(self.watch.starved())  # 2 s of 2 s waiting for a CPU

    def test_sharing_a_cpu_with_its_sibling_workers_is_not_starving(self):
        self.rank_connects()
        self.assertFalse(self.watch.starved())
        for _ in range(4):  # 8 workers importing at once on one CPU: 7/8 of the time waiting
            self.advance(2.0, waited=2.0 * 7 / 8)
            self.assertFalse(self.watch.starved())
        self.advance(2.0, waited=0.0)  # it slept (its turn to import) or ran
        self.assertFalse(self.watch.starved())
        self.advance(2.0, waited=1.99)
        self.assertTrue(self.watch.starved())

    def test_without_the_kernels_figures_it_never_restarts(self):
        self.rank_connects()
        watch = preload.StarvedWhileAwaited(self.listen.fileno(), 1, clock=lambda: self.now,
                                            run_delay_ns=lambda tid: None)
        for _ in range(3):
            self.advance(2.0, waited=2.0)
            self.assertFalse(watch.starved())

    def test_this_kernel_reports_a_threads_run_delay(self):
        self.assertIsInstance(preload.thread_run_delay_ns(__import__("threading").get_native_id()),
                              int)


class WorkerSetupTest(unittest.TestCase):
    def spec(self, **overrides):
        spec = {"dataset": Squares(), "collate_fn": None, "worker_init_fn": None,
                "base_seed": 1000, "num_workers": 3, "auto_collation": True}
        spec.update(overrides)
        return worker.LoaderSpec(("key",), spec, 1, fallback_workers=9)

    def tearDown(self):
        torch_worker._worker_info = None

    def test_seeds_and_worker_info_as_torch_sets_them(self):
        loader = self.spec()
        info = get_worker_info()
        self.assertEqual((info.id, info.num_workers, info.seed), (1, 3, 1001))
        self.assertIs(info.dataset, loader.dataset)
        self.assertEqual(torch.initial_seed(), 1001)
        self.assertEqual(torch.get_num_threads(), 1)
        got = (random.random(), np.random.rand())
        random.seed(1001)
        generate_state = getattr(torch_worker, "_generate_state", None)
        if generate_state is None:  # torch < 1.9 (Debian 11's 1.7) leaves numpy's stream alone
            self.assertEqual(got[0], random.random())
            return
        np.random.seed(generate_state(1000, 1))
        self.assertEqual(got, (random.random(), np.random.rand()))

    def test_fetch_collates_like_the_map_fetcher(self):
        self.assertEqual(self.spec().fetch([2, 3]).tolist(), [4, 9])
        self.assertEqual(self.spec(dataset=Batched()).fetch([1, 2]), ["batched 1", "batched 2"])
        self.assertEqual(self.spec(auto_collation=False).fetch([3]), 9)
        self.assertEqual(self.spec(collate_fn=sum).fetch([1, 2, 3]), 14)
        self.assertEqual(self.spec(num_workers=None).num_workers, 9)

    def test_default_collate_stacks_on_the_heap_and_a_custom_collate_sees_the_worker_info(self):
        # The ring's slot gets a copy anyway: no shared-memory segment per batch.
        class Rows(object):
            def __len__(self):
                return 4

            def __getitem__(self, i):
                return torch.full((3,), float(i))

        from torch.utils.data._utils.collate import default_collate

        loader = self.spec(dataset=Rows(), collate_fn=default_collate)
        batch = loader.fetch([1, 2])
        self.assertEqual(batch.tolist(), [[1.0] * 3, [2.0] * 3])
        self.assertFalse(batch.is_shared())
        self.assertEqual(get_worker_info().id, 1)  # set again after the collate
        seen = []
        self.spec(dataset=Rows(), collate_fn=lambda b: seen.append(get_worker_info().id)).fetch([0])
        self.assertEqual(seen, [1])

    def test_a_sample_error_reads_as_pytorch_reraises_it(self):
        with self.assertRaises(worker.BuildError) as caught:
            self.spec().fetch([6, 7])
        reply = caught.exception.reply
        self.assertEqual((reply["kind"], reply["index"], reply["excType"]),
                         ("dataset", 7, "builtins.KeyError"))
        self.assertTrue(reply["message"].startswith(
            "Caught KeyError in DataLoader worker process 1.\nOriginal Traceback (most recent "
            "call last):\n"), reply["message"])
        self.assertIn("in __getitem__", reply["message"])
        self.assertIn("KeyError: 'no sample 7'", reply["message"])

    def test_worker_init_fn_runs_once_and_its_error_goes_to_the_first_batch(self):
        del calls[:]
        self.spec(worker_init_fn=remember_init)
        self.assertEqual(calls, [(1, 1)])
        loader = self.spec(worker_init_fn=failing_init)
        with self.assertRaises(worker.BuildError) as caught:
            loader.fetch([1])
        self.assertIn("RuntimeError: init failed in 1", caught.exception.reply["message"])
        self.assertEqual(loader.fetch([1]).tolist(), [1])

    def test_configure_loads_a_file_once_until_it_changes(self):
        server = worker.Worker(None, 0, 0, 2)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "loader.pickle")

            def write(base_seed):
                with open(path, "wb") as f:
                    pickle.dump({"dataset": Squares(), "base_seed": base_seed}, f)

            write(5)
            body = {"protocol": 1, "dataset": "python", "arg": path, "workerId": 0}
            kind, hello = server.configure(body)
            self.assertEqual(kind, worker.HELLO)
            self.assertEqual((hello["size"], hello["incarnation"], hello["workerId"]), (10, 2, 0))
            first = server.loader
            server.configure(body)  # a reconnect: the same loader, its streams where they were
            self.assertIs(server.loader, first)
            write(123456)  # a new file (another size): loaded and set up again
            server.configure(body)
            self.assertIsNot(server.loader, first)
            self.assertEqual(get_worker_info().seed, 123456)
            kind, error = server.configure(dict(body, arg=os.path.join(d, "missing")))
            self.assertEqual((kind, error["kind"]), (worker.ERROR, "configure"))
            self.assertIn("cannot load the DataLoader from", error["message"])
            kind, error = server.configure(dict(body, dataset="index"))
            self.assertIn("Python loader worker", error["message"])

    def write_loaders(self, d, seeds):
        """A pickle of Draws per base seed, collated into a list; their paths."""
        paths = []
        for n, base_seed in enumerate(seeds):
            paths.append(os.path.join(d, "loader-%d.pickle" % n))
            with open(paths[-1], "wb") as f:
                pickle.dump({"dataset": Draws(), "collate_fn": list, "base_seed": base_seed,
                             "num_workers": 3}, f)
        return paths

    @staticmethod
    def batches(server, path, batches):
        """Configures `server` for the loader at `path` and fetches these batches."""
        kind, hello = server.configure({"protocol": 1, "dataset": "python", "arg": path,
                                        "workerId": 1})
        assert kind == worker.HELLO, hello
        return [server.loader.fetch(indices) for indices in batches]

    def test_alternating_loaders_each_go_on_with_their_own_streams_and_worker_info(self):
        with tempfile.TemporaryDirectory() as d:
            a, b = self.write_loaders(d, [1000, 2000])
            # What persistent workers of A alone, and of B alone, would draw.
            alone_a = self.batches(worker.Worker(None, 1, 0, 0), a, [[0, 1], [2, 3], [4]])
            alone_b = self.batches(worker.Worker(None, 1, 0, 0), b, [[0, 1], [5]])
            server = worker.Worker(None, 1, 0, 0)
            got_a = self.batches(server, a, [[0, 1]])
            got_b = self.batches(server, b, [[0, 1]])
            info = get_worker_info()
            self.assertEqual((info.id, info.seed, info.num_workers), (1, 2001, 3))
            self.assertIs(info.dataset, server.loader.dataset)
            self.assertEqual(torch.initial_seed(), 2001)
            got_a += self.batches(server, a, [[2, 3]])
            info = get_worker_info()
            self.assertEqual(info.seed, 1001)
            self.assertIs(info.dataset, server.loader.dataset)
            self.assertEqual(torch.initial_seed(), 1001)
            got_b += self.batches(server, b, [[5]])
            got_a += self.batches(server, a, [[4]])
            self.assertEqual(len(server.loaders), 2)
        self.assertEqual(got_a, alone_a)
        self.assertEqual(got_b, alone_b)
        self.assertEqual([s[5] for s in got_b[0]], [2001, 2001])
        self.assertNotEqual(got_a[0], got_b[0])

    def test_the_least_recently_used_loader_is_forgotten_and_set_up_afresh(self):
        kept = worker.MAX_LOADERS
        worker.MAX_LOADERS = 2
        try:
            with tempfile.TemporaryDirectory() as d:
                a, b, c = self.write_loaders(d, [10, 20, 30])
                first_a = self.batches(worker.Worker(None, 1, 0, 0), a, [[0]])
                server = worker.Worker(None, 1, 0, 0)
                self.batches(server, a, [[0], [1]])
                self.batches(server, b, [[0]])
                self.batches(server, a, [[2]])  # a is the most recent now, b the least
                self.batches(server, c, [[0]])
                self.assertEqual([k[0] for k in server.loaders], [a, c])
                self.assertEqual(self.batches(server, b, [[0]])[0][0][5], 21)  # b afresh
                self.assertEqual([k[0] for k in server.loaders], [c, b])
                self.assertEqual(self.batches(server, a, [[0]]), first_a)  # a afresh too
        finally:
            worker.MAX_LOADERS = kept

    def test_a_rewind_from_a_client_that_already_left_still_counts(self):
        import mmap

        class Left(object):
            """A client that sent its messages and closed: no answer can reach it."""

            def __init__(self, messages):
                self.messages = list(messages)

            def receive(self):
                return self.messages.pop(0) if self.messages else None

            def send(self, kind, body):
                raise BrokenPipeError("the client went away")

        with tempfile.TemporaryDirectory() as d:
            a, = self.write_loaders(d, [7])
            alone = self.batches(worker.Worker(None, 1, 0, 0), a, [[3]])
            server = worker.Worker(None, 1, 0, 0)
            self.batches(server, a, [])
            server.ring = (mmap.mmap(-1, 1 << 20), 1, 1 << 20)
            # A speculative batch of epoch 1 whose answer fails (the session ended meanwhile),
            # then the Rewind the ending session sent before it closed.
            server.serve_client(Left([
                (worker.TASK, {"id": 1, "epoch": 1, "batch": 0, "slot": 0, "indices": [5]}, -1),
                (worker.REWIND, {"epoch": 1}, -1)]))
            self.assertEqual(server.loader.fetch([3]), alone[0],
                             "the voided batch moved the streams")

    def test_a_probed_batch_no_task_takes_costs_the_streams_nothing(self):
        with tempfile.TemporaryDirectory() as d:
            a, = self.write_loaders(d, [7])
            alone = self.batches(worker.Worker(None, 1, 0, 0), a, [[3], [4]])
            server = worker.Worker(None, 1, 0, 0)
            self.batches(server, a, [])
            # Probed, then another batch asked for: the probe's draws are undone.
            kind, _ = server.probe({"epoch": 0, "batch": 0, "indices": [1, 2]})
            self.assertEqual(kind, worker.PROBE_RESULT)
            built, _, error = server.encode(5, {"epoch": 1, "batch": 0, "indices": [3]})
            self.assertIsNone(error)
            self.assertEqual(built[3], alone[0])
            # Probed and then taken: drawn once, as if the task had built it.
            server.probe({"epoch": 1, "batch": 1, "indices": [4]})
            built, _, _ = server.encode(6, {"epoch": 1, "batch": 1, "indices": [4]})
            self.assertEqual(built[3], alone[1])
            # Probed and the connection (or the loader) changed first: undone as well.
            server.probe({"epoch": 0, "batch": 0, "indices": [9]})
            server.configure({"protocol": 1, "dataset": "python", "arg": a, "workerId": 1})
            self.assertIsNone(server.cached)
            after = server.loader.fetch([8])
            self.assertEqual(after, self.batches(worker.Worker(None, 1, 0, 0), a,
                                                 [[3], [4], [8]])[2])

    def test_a_probed_batch_is_kept_for_its_task_and_a_slot_too_small_says_so(self):
        import mmap
        server = worker.Worker(None, 0, 0, 0)
        server.loader = self.spec(dataset=Batched(), collate_fn=lambda items: [
            np.full(8, len(s), dtype=np.uint8) for s in items])
        kind, result = server.probe({"epoch": 0, "batch": 0, "indices": [1, 2]})
        self.assertEqual((kind, result), (worker.PROBE_RESULT, {"bytes": 72}))
        self.assertEqual(server.cached[:3], (0, 0, [1, 2]))
        server.ring = (mmap.mmap(-1, 2 * 4096), 2, 4096)
        server.loader.dataset = None  # the task must come from the probe
        kind, done = server.task({"id": 4, "epoch": 0, "batch": 0, "slot": 1, "indices": [1, 2]})
        self.assertEqual(kind, worker.DONE, done)
        self.assertEqual([f["offset"] for f in done["fields"]], [0, 64])
        self.assertEqual(server.ring[0][4096:4096 + 8], b"\x09" * 8)  # len("batched 1")
        self.assertIsNone(server.cached)
        server.loader = self.spec(collate_fn=lambda items: np.zeros(5000, dtype=np.uint8))
        kind, error = server.task({"id": 5, "epoch": 0, "batch": 1, "slot": 0, "indices": [1]})
        self.assertEqual((kind, error["kind"], error["need"], error["have"]),
                         (worker.ERROR, "slot", 5000, 4096))
        kind, error = server.task({"id": 6, "slot": 2, "indices": [1]})
        self.assertEqual((kind, error["kind"]), (worker.ERROR, "protocol"))
        server.ring[0].close()


if __name__ == "__main__":
    unittest.main()
