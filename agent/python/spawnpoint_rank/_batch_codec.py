"""A collated batch as fields in a shared-memory slot plus a JSON tree: the Python loader
worker's encoder (worker.py), kept apart so it is tested without the pool.

`plan(batch)` walks the batch (tuples, namedtuples, lists, dicts, nested) and returns a
Plan: `fields`, one per torch tensor or numpy array, laid out back to back in the slot, each
at a 64-byte aligned offset as the C++ BatchWriter lays them out (agent/loader/types.h), as
{"name", "dtype", "shape", "offset", "nbytes"}; `tree`, the batch's shape with every other
leaf in it; `nbytes`, the bytes the slot must hold. `Plan.write(buffer)` copies the arrays
into a writable buffer (the slot: an mmap, or a bytearray in tests).

The tree, one JSON node per value:
  {"t": "tensor", "field": i}          torch tensor: fields[i] (the rank rebuilds a tensor)
  {"t": "ndarray", "field": i}         numpy array: fields[i]
  {"t": "tuple", "items": [...]}       with "cls": "module:qualname" for a namedtuple
  {"t": "list", "items": [...]}
  {"t": "dict", "keys": [...], "items": [...]}   keys are nodes too (any hashable leaf)
  {"t": "value", "v": x}               None, bool, str, int within int64, finite float
  {"t": "pickle", "v": base64}         any other leaf (numpy scalars, bytes, objects)
Field names are the paths of their leaves ("0", "1.label", "img.2").

Dtypes are agent/loader/types.h's names: u8 i8 i16 i32 i64 f16 bf16 f32 f64 bool. Anything
else (complex, unsigned wider than 8 bits, big-endian, sparse) raises CodecError naming the
path and the dtype. Needs neither torch nor numpy itself: it recognises what the batch
holds through the modules already imported. Pure functions; thread-safe.
"""

import base64
import ctypes
import math
import pickle
import sys

ALIGNMENT = 64

_TORCH_DTYPES = {
    "torch.uint8": "u8", "torch.int8": "i8", "torch.int16": "i16", "torch.int32": "i32",
    "torch.int64": "i64", "torch.float16": "f16", "torch.bfloat16": "bf16",
    "torch.float32": "f32", "torch.float64": "f64", "torch.bool": "bool",
}
_NUMPY_DTYPES = {  # (kind, itemsize)
    ("u", 1): "u8", ("i", 1): "i8", ("i", 2): "i16", ("i", 4): "i32", ("i", 8): "i64",
    ("f", 2): "f16", ("f", 4): "f32", ("f", 8): "f64", ("b", 1): "bool",
}
_INT64 = (-(1 << 63), (1 << 63) - 1)


class CodecError(ValueError):
    """A value of the batch the ring cannot carry."""


def _align(n):
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


class _Array(object):
    """One field: its bytes' address and a reference keeping them alive."""

    __slots__ = ("keep", "address", "nbytes")

    def __init__(self, keep, address, nbytes):
        self.keep, self.address, self.nbytes = keep, address, nbytes


class Plan(object):
    def __init__(self):
        self.fields = []
        self.tree = None
        self.nbytes = 0
        self._arrays = []

    def write(self, buffer, start=0, capacity=None):
        """Copies every field into `buffer` (writable: an mmap, a bytearray) at `start` plus
        its offset; `capacity`: the bytes from `start` on that are the slot's."""
        capacity = len(buffer) - start if capacity is None else capacity
        if self.nbytes > capacity:
            raise CodecError("the batch needs %d bytes, the slot holds %d" % (self.nbytes,
                                                                             capacity))
        if not self._arrays:
            return
        anchor = ctypes.c_char.from_buffer(buffer, start)
        try:
            base = ctypes.addressof(anchor)
            for field, array in zip(self.fields, self._arrays):
                if array.nbytes:
                    ctypes.memmove(base + field["offset"], array.address, array.nbytes)
        finally:
            del anchor  # the buffer's export ends here (an mmap can be closed again)

    def _add(self, name, dtype, shape, array):
        offset = _align(self.nbytes)
        self.fields.append({"name": name, "dtype": dtype, "shape": list(shape),
                            "offset": offset, "nbytes": array.nbytes})
        self._arrays.append(array)
        self.nbytes = offset + array.nbytes
        return len(self.fields) - 1


def _tensor(plan, path, t):
    dtype = _TORCH_DTYPES.get(str(t.dtype))
    if dtype is None or t.layout != sys.modules["torch"].strided:
        raise CodecError("batch value %s: a %s tensor (%s) cannot go through the shared-memory "
                         "ring; it carries %s" % (path or "<batch>", t.dtype, t.layout,
                                                   ", ".join(sorted(_TORCH_DTYPES))))
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    return plan._add(path, dtype, t.shape, _Array(t, t.data_ptr(), t.numel() * t.element_size()))


def _ndarray(plan, path, a):
    np = sys.modules["numpy"]
    dtype = _NUMPY_DTYPES.get((a.dtype.kind, a.dtype.itemsize))
    if dtype is None or a.dtype.byteorder == ">":
        raise CodecError("batch value %s: a numpy array of dtype %s cannot go through the "
                         "shared-memory ring; use one of %s" % (path or "<batch>", a.dtype.str,
                                                                ", ".join(sorted(_NUMPY_DTYPES.values()))))
    a = np.ascontiguousarray(a)
    return plan._add(path, dtype, a.shape, _Array(a, a.ctypes.data, a.nbytes))


def _json_value(x):
    if x is None or isinstance(x, (bool, str)):
        return True
    if type(x) is int:
        return _INT64[0] <= x <= _INT64[1]
    return type(x) is float and math.isfinite(x)


def _walk(plan, path, x):
    def child(key):
        return "%s.%s" % (path, key) if path else str(key)

    torch = sys.modules.get("torch")
    np = sys.modules.get("numpy")
    if torch is not None and isinstance(x, torch.Tensor):
        return {"t": "tensor", "field": _tensor(plan, path, x)}
    if np is not None and isinstance(x, np.ndarray):
        return {"t": "ndarray", "field": _ndarray(plan, path, x)}
    if _json_value(x):
        return {"t": "value", "v": x}
    if isinstance(x, tuple):
        node = {"t": "tuple", "items": [_walk(plan, child(i), v) for i, v in enumerate(x)]}
        if hasattr(x, "_fields"):  # a namedtuple, as default_collate keeps it
            node["cls"] = "%s:%s" % (type(x).__module__, type(x).__qualname__)
        return node
    if type(x) is list:
        return {"t": "list", "items": [_walk(plan, child(i), v) for i, v in enumerate(x)]}
    if type(x) is dict:
        keys = list(x)
        return {"t": "dict", "keys": [_walk(plan, "", k) for k in keys],
                "items": [_walk(plan, child(k), x[k]) for k in keys]}
    return {"t": "pickle", "v": base64.b64encode(pickle.dumps(x, protocol=2)).decode("ascii")}


def plan(batch):
    """The layout of `batch` in a slot: a Plan (fields, tree, nbytes). Raises CodecError."""
    p = Plan()
    p.tree = _walk(p, "", batch)
    return p


def decode(tree, array_of):
    """The batch a tree describes (the rank side's inverse of plan): `array_of(kind, i)` gives
    the value of field i for a "tensor" or "ndarray" node. Raises CodecError on a node it does
    not know, or a namedtuple class it cannot import."""
    kind = tree.get("t")
    if kind in ("tensor", "ndarray"):
        return array_of(kind, tree["field"])
    if kind == "value":
        return tree["v"]
    if kind == "list":
        return [decode(node, array_of) for node in tree["items"]]
    if kind == "tuple":
        items = [decode(node, array_of) for node in tree["items"]]
        if "cls" in tree:
            return _named_tuple(tree["cls"])(*items)
        return tuple(items)
    if kind == "dict":
        return {decode(k, array_of): decode(v, array_of)
                for k, v in zip(tree["keys"], tree["items"])}
    if kind == "pickle":
        return pickle.loads(base64.b64decode(tree["v"]))
    raise CodecError("unknown batch tree node %r" % (kind,))


def _named_tuple(name):
    import importlib

    module, _, qualname = name.partition(":")
    try:
        cls = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
    except (ImportError, AttributeError) as err:
        raise CodecError("the batch holds a namedtuple %s the rank cannot import (%s)" % (
            name, err))
    return cls
