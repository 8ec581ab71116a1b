"""Unit tests of the Python loader worker's batch encoder (spawnpoint_rank/_batch_codec.py),
without the pool: batches are planned and written into a bytearray and read back. numpy is
needed; the torch cases skip themselves without torch (a skip run_shim_tests.py reports: exit
77, ctest's Skipped). Run through run_shim_tests.py (ctest: python_batch_codec).
"""

import ast
import collections
import os
import struct
import unittest

from shim_import import SHIM_DIR, shim_module

codec = shim_module("spawnpoint_rank._batch_codec")

# Not installed (ModuleNotFoundError for the module itself): its cases skip, and
# run_shim_tests.py exits 77, which ctest reports as Skipped. Installed but failing to import
# (a missing library, a dependency's ModuleNotFoundError) raises: the run fails.
try:
    import numpy as np
except ModuleNotFoundError as e:  # Debian's python3-numpy is a test dependency
    if e.name != "numpy":
        raise
    np = None
try:
    import torch
except ModuleNotFoundError as e:
    if e.name != "torch":
        raise
    torch = None

Point = collections.namedtuple("Point", "x y")


def written(batch, size=4096):
    plan = codec.plan(batch)
    buffer = bytearray(b"\xee" * size)
    plan.write(buffer, 64, size - 64)
    return plan, buffer


def field_bytes(buffer, field):
    start = 64 + field["offset"]
    return bytes(buffer[start:start + field["nbytes"]])


@unittest.skipIf(np is None, "numpy is not installed")
class BatchCodecTest(unittest.TestCase):
    def test_leaves_go_in_the_tree_and_need_no_bytes(self):
        plan = codec.plan({"a": 1, "b": [None, True, "s", 2.5], "c": (-(1 << 63),)})
        self.assertEqual(plan.fields, [])
        self.assertEqual(plan.nbytes, 0)
        v = lambda x: {"t": "value", "v": x}  # noqa: E731
        self.assertEqual(plan.tree, {
            "t": "dict", "keys": [v("a"), v("b"), v("c")],
            "items": [v(1), {"t": "list", "items": [v(None), v(True), v("s"), v(2.5)]},
                      {"t": "tuple", "items": [v(-(1 << 63))]}]})

    def test_values_json_cannot_hold_exactly_are_pickled(self):
        for value in (float("nan"), 1 << 64, b"raw", np.float32(1.5), {1, 2}):
            node = codec.plan([value]).tree["items"][0]
            self.assertEqual(node["t"], "pickle", value)
            import base64
            import pickle
            restored = pickle.loads(base64.b64decode(node["v"]))
            if value == value:
                self.assertEqual(restored, value)

    def test_arrays_are_aligned_named_by_path_and_copied(self):
        a = np.arange(5, dtype=np.int16)
        b = np.ones((2, 3), dtype=np.float64)[:, ::2]  # not contiguous
        plan, buffer = written({"img": [a, {"label": b}]})
        self.assertEqual([f["name"] for f in plan.fields], ["img.0", "img.1.label"])
        self.assertEqual([f["dtype"] for f in plan.fields], ["i16", "f64"])
        self.assertEqual(plan.fields[1]["shape"], [2, 2])
        self.assertEqual([f["offset"] % 64 for f in plan.fields], [0, 0])
        self.assertEqual(plan.fields[1]["offset"], 64)
        self.assertEqual(plan.nbytes, 64 + 32)
        self.assertEqual(field_bytes(buffer, plan.fields[0]), a.tobytes())
        self.assertEqual(field_bytes(buffer, plan.fields[1]), np.ascontiguousarray(b).tobytes())
        self.assertEqual(plan.tree["items"][0]["items"][0], {"t": "ndarray", "field": 0})
        # Nothing written outside the fields.
        self.assertEqual(bytes(buffer[:64]), b"\xee" * 64)
        self.assertEqual(bytes(buffer[64 + 10:64 + 64]), b"\xee" * 54)

    def test_every_ring_dtype_and_none_other(self):
        names = {np.uint8: "u8", np.int8: "i8", np.int16: "i16", np.int32: "i32",
                 np.int64: "i64", np.float16: "f16", np.float32: "f32", np.float64: "f64",
                 np.bool_: "bool"}
        for dtype, name in names.items():
            self.assertEqual(codec.plan(np.zeros(2, dtype=dtype)).fields[0]["dtype"], name)
        for bad in (np.zeros(2, dtype=np.complex64), np.zeros(2, dtype=np.uint32),
                    np.zeros(2, dtype=">i4")):
            with self.assertRaises(codec.CodecError) as caught:
                codec.plan({"x": [bad]})
            self.assertIn("batch value x.0", str(caught.exception))

    def test_namedtuples_name_their_class(self):
        node = codec.plan(Point(1, 2)).tree
        self.assertEqual(node["cls"], "%s:Point" % __name__)
        self.assertEqual(len(node["items"]), 2)

    def test_a_slot_too_small_is_refused_before_writing(self):
        plan = codec.plan(np.zeros(100, dtype=np.uint8))
        buffer = bytearray(b"\xee" * 128)
        with self.assertRaises(codec.CodecError):
            plan.write(buffer, 64, 64)
        self.assertEqual(bytes(buffer), b"\xee" * 128)

    def test_the_modules_load_on_python_3_9(self):
        for name in ("_batch_codec.py", "worker.py"):
            with open(os.path.join(SHIM_DIR, "spawnpoint_rank", name)) as f:
                ast.parse(f.read(), name, feature_version=(3, 9))


@unittest.skipIf(torch is None, "torch is not installed")
class BatchCodecTorchTest(unittest.TestCase):
    def test_tensors_any_layout_and_bfloat16(self):
        t = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()  # not contiguous
        bf = torch.tensor([1.0, -2.0], dtype=torch.bfloat16)
        plan, buffer = written((t, bf, torch.tensor(7), torch.zeros(0)))
        self.assertEqual([f["dtype"] for f in plan.fields], ["f32", "bf16", "i64", "f32"])
        self.assertEqual(plan.fields[0]["shape"], [3, 2])
        self.assertEqual(struct.unpack("6f", field_bytes(buffer, plan.fields[0])),
                         (0.0, 3.0, 1.0, 4.0, 2.0, 5.0))
        self.assertEqual(field_bytes(buffer, plan.fields[1]), struct.pack("<2H", 0x3F80, 0xC000))
        self.assertEqual(plan.fields[2]["shape"], [])
        self.assertEqual(plan.fields[3]["nbytes"], 0)
        self.assertEqual(plan.tree["items"][1], {"t": "tensor", "field": 1})

    def test_tensors_that_need_grad_are_detached_and_complex_refused(self):
        t = torch.ones(2, requires_grad=True) * 2
        plan, buffer = written([t])
        self.assertEqual(field_bytes(buffer, plan.fields[0]), struct.pack("2f", 2.0, 2.0))
        with self.assertRaises(codec.CodecError) as caught:
            codec.plan({"z": torch.zeros(2, dtype=torch.complex64)})
        self.assertIn("torch.complex64", str(caught.exception))


class _Releases(object):
    """Stands for the rank's Service: records the slots a Ring gives back."""

    def __init__(self):
        self.slots = []

    def released(self, session, slot):
        self.slots.append((session, slot))


@unittest.skipIf(torch is None, "torch is not installed")
class RankSideDecodeTest(unittest.TestCase):
    """The rank side's half (spawnpoint_rank/_pool.py): a batch rebuilt from a ring slot as
    views, and the slot given back only when the last view of it is freed."""

    def ring_with(self, batch, slot=1, slots=3, slot_bytes=8192):
        pool = shim_module("spawnpoint_rank._pool")
        fd = os.memfd_create("ring")
        os.ftruncate(fd, slots * slot_bytes)
        releases = _Releases()
        ring = pool.Ring(releases, 5, fd, slots, slot_bytes)
        plan = codec.plan(batch)
        plan.write(ring.mm, slot * slot_bytes, slot_bytes)
        ready = {"slot": slot, "fields": plan.fields, "tree": plan.tree}
        return ring, ready, releases

    def test_nested_batch_comes_back_equal_as_views_of_the_slot(self):
        Point = collections.namedtuple("Point", "x y")
        batch = {"img": torch.arange(12, dtype=torch.float32).reshape(3, 4),
                 "bf": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
                 "label": [torch.tensor(3), "cat", None], "np": np.arange(4, dtype=np.int16),
                 "p": (1, 2.5), 7: {b"raw"}}
        ring, ready, releases = self.ring_with(batch)
        got = ring.batch(ready, copy=False)
        self.assertTrue(torch.equal(got["img"], batch["img"]))
        self.assertEqual(got["bf"].dtype, torch.bfloat16)
        self.assertTrue(torch.equal(got["bf"], batch["bf"]))
        self.assertEqual(got["label"][1:], ["cat", None])
        self.assertTrue(torch.equal(got["label"][0], torch.tensor(3)))
        self.assertEqual(got["np"].tolist(), [0, 1, 2, 3])
        self.assertEqual(got["p"], (1, 2.5))
        self.assertEqual(got[7], {b"raw"})
        # A view: writing the slot changes the tensor.
        got["img"][0, 0] = 42.0
        plan = codec.plan(batch)
        self.assertEqual(struct.unpack_from("f", ring.mm, 1 * 8192 + plan.fields[0]["offset"]),
                         (42.0,))
        self.assertEqual(ring.held(), 1)
        self.assertEqual(releases.slots, [])

    def test_slot_returns_only_when_the_last_view_is_freed(self):
        ring, ready, releases = self.ring_with({"a": torch.ones(4), "b": np.zeros(3)})
        got = ring.batch(ready, copy=False)
        kept = got["a"][1:]  # a view of a view, kept by the trainer
        array = got["b"]
        del got
        self.assertEqual(releases.slots, [])
        del array
        self.assertEqual(releases.slots, [])
        self.assertEqual(kept.tolist(), [1.0, 1.0, 1.0])
        del kept
        self.assertEqual(releases.slots, [(5, 1)])
        self.assertEqual(ring.held(), 0)

    def test_copy_gives_the_slot_back_at_once(self):
        ring, ready, releases = self.ring_with([torch.full((2,), 3.0)])
        got = ring.batch(ready, copy=True)
        self.assertEqual(releases.slots, [(5, 1)])
        self.assertEqual(got[0].tolist(), [3.0, 3.0])
        self.assertEqual(ring.held(), 0)


if __name__ == "__main__":
    unittest.main()
