"""Unit tests of the Python loader worker (spawnpoint_rank/worker.py) in this process, without
the pool: the frames over a socket pair, and with torch the worker's set-up and fetching
compared with torch's own _worker_loop and _MapDatasetFetcher. (tests/loader/
python_worker_test.cc runs it as a process under the real PoolClient.) Run through
run_shim_tests.py (ctest: python_loader_worker, python_loader_worker_torch).
"""

import os
import pickle
import random
import socket
import struct
import tempfile
import unittest

from shim_import import shim_module

worker = shim_module("spawnpoint_rank.worker")

try:
    import numpy as np
    import torch
    from torch.utils.data import get_worker_info
    from torch.utils.data._utils import worker as torch_worker
except ImportError:
    torch = None


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


calls = []


def remember_init(worker_id):
    calls.append((worker_id, get_worker_info().id))


def failing_init(worker_id):
    raise RuntimeError("init failed in %d" % worker_id)


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


@unittest.skipIf(torch is None, "torch is not installed")
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
