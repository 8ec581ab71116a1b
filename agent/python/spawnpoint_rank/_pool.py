"""The rank's connection to the agent's loader service (agent/loader/rank_service.h): frames,
sessions, the shared-memory ring and batches as views of it. Pure Python (socket, mmap,
ctypes, numpy), so it loads in any trainer image; torch is taken from sys.modules.

`service()` is this process's Service, or None when the agent runs no pool for this rank.
The bootstrap (sitecustomize.py) takes the socket path out of os.environ
(SPAWNPOINT_LOADER_SERVICE) and hands it to the package, so processes the rank starts
(spawned helpers, a nested DataLoader's workers) never talk to the rank's service.

A batch arrives as a slot of the ring. `Ring.batch(ready, copy)` rebuilds it from the tree
the worker sent, each tensor or array a view of the slot; the slot goes back to the service
only when the last view of it is freed (a ctypes object over the slot is the one buffer every
view keeps alive; its finalizer queues the release). Releases are queued without locks or I/O
(the finalizer may run in any thread, in the middle of anything) and go out with the next
message, or within `RELEASE_FLUSH_S` while the rank waits. With copy=True the batch is copied
out of the slot at once and the slot released as soon as the copy is made.

Thread-safety: Service methods take its lock; a Ring's finalizers are safe from any thread.
"""

import ctypes
import json
import mmap
import os
import select
import socket
import struct
import sys
import threading
import weakref
from collections import deque

from . import _batch_codec

PROTOCOL_VERSION = 1
ERROR, OPEN, OPENED, SUBMIT, READY, RELEASE, DROP, BATCH_ERROR = 8, 9, 10, 11, 12, 13, 14, 15
ACCEPTED = 17
RELEASE_FLUSH_S = 0.05
_HEADER = struct.Struct("<IBBxx")  # payload length, message type, descriptor follows
_MAX_PAYLOAD = 64 << 20

_NUMPY = {"u8": "uint8", "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
          "f16": "float16", "bf16": "int16", "f32": "float32", "f64": "float64",
          "bool": "bool"}

# Whether a DataLoader iterator has been served here, and whether one has had a batch from
# each of its workers since: until then they may still be importing on the rank's CPUs, and
# the rank's warm standby is not prepared (_progress.py), so that its imports do not take
# the CPU from theirs.
iterators_served = False
workers_warm = False

_lock = threading.Lock()
_service = None
# What the bootstrap took out of the environment (sitecustomize.loader_service), or what a
# test set with use_service_path.
_service_path = getattr(sys.modules.get(__package__), "loader_service", None)


def attempt_environment_taken():
    """A released standby rank (sitecustomize): the service of the attempt's environment."""
    use_service_path(getattr(sys.modules.get(__package__), "loader_service", None))


def use_service_path(path):
    """For tests and tools: talk to the service at `path` (None: no service)."""
    global _service_path, _service
    with _lock:
        _service_path = path
        if _service is not None:
            _service.close()
        _service = None


def service():
    """This process's Service (connected on first use), or None without a pool. Raises
    OSError when the agent's socket does not answer."""
    global _service
    with _lock:
        if _service is None and _service_path:
            _service = Service(_service_path)
        return _service


class ServiceError(RuntimeError):
    """The service refused a session or went away; `kind` says why."""

    def __init__(self, kind, message, exc_type=None):
        RuntimeError.__init__(self, message)
        self.kind = kind
        self.exc_type = exc_type


class Service(object):
    """One connection to the rank's loader service: sessions are opened on it one at a time."""

    def __init__(self, path):
        self.path = path
        self.pool_dir = os.path.dirname(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.lock = threading.RLock()
        self.active = None  # the session the service runs now
        self._next_session = 1
        self._buffer = b""
        self._fds = []
        self._released = deque()  # (session, slot), appended by finalizers

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def new_session_id(self):
        with self.lock:
            session = self._next_session
            self._next_session += 1
            return session

    def send(self, kind, body):
        payload = json.dumps(body, allow_nan=False).encode("utf-8")
        self.sock.sendall(_HEADER.pack(len(payload), kind, 0) + payload)

    def released(self, session, slot):
        """Queues a slot's release; safe from a finalizer in any thread."""
        self._released.append((session, slot))

    def take_releases(self, session):
        """The queued releases of `session` (those of older sessions are dropped)."""
        slots = []
        while True:
            try:
                owner, slot = self._released.popleft()
            except IndexError:
                return slots
            if owner == session:
                slots.append(slot)

    def flush_releases(self, session):
        slots = self.take_releases(session)
        if slots:
            self.send(RELEASE, {"session": session, "release": slots})

    def receive(self, timeout):
        """The next (type, body, fd or -1), or None if nothing came within `timeout` seconds.
        Raises ServiceError when the agent closed the connection."""
        while True:
            if len(self._buffer) >= _HEADER.size:
                length, kind, has_fd = _HEADER.unpack_from(self._buffer)
                if length > _MAX_PAYLOAD:
                    raise ServiceError("protocol", "malformed frame from the loader service")
                end = _HEADER.size + length
                if len(self._buffer) >= end:
                    body = json.loads(self._buffer[_HEADER.size:end].decode("utf-8"))
                    self._buffer = self._buffer[end:]
                    fd = self._fds.pop(0) if has_fd and self._fds else -1
                    return kind, body, fd
            ready, _, _ = select.select([self.sock], [], [], timeout)
            if not ready:
                return None
            data, ancillary, _, _ = self.sock.recvmsg(
                1 << 20, socket.CMSG_SPACE(8 * 4), getattr(socket, "MSG_CMSG_CLOEXEC", 0))
            for level, ctype, cdata in ancillary:
                if level == socket.SOL_SOCKET and ctype == socket.SCM_RIGHTS:
                    usable = len(cdata) - len(cdata) % 4
                    self._fds.extend(struct.unpack("%di" % (usable // 4), cdata[:usable]))
            if not data:
                raise ServiceError("gone", "the agent's loader service closed the connection "
                                   "(is the agent still running?)")
            self._buffer += data


class Ring(object):
    """One session's shared-memory ring, mapped; batches are built as views of its slots."""

    def __init__(self, service, session, fd, slots, slot_bytes):
        try:
            self.mm = mmap.mmap(fd, slots * slot_bytes, mmap.MAP_SHARED,
                                mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.service = service
        self.session = session
        self.slots = slots
        self.slot_bytes = slot_bytes
        self._handed = 0            # zero-copy batches given to the trainer
        self._returned = [0]        # of those, released (a list: finalizers add to it)

    def held(self):
        """Slots the trainer still holds through views."""
        return self._handed - self._returned[0]

    def batch(self, ready, copy):
        """The batch of a Ready message: views of its slot, or copies when `copy`."""
        slot = int(ready["slot"])
        if not 0 <= slot < self.slots:
            raise ServiceError("protocol", "the loader service sent slot %d of %d" % (
                slot, self.slots))
        anchor = (ctypes.c_char * self.slot_bytes).from_buffer(self.mm, slot * self.slot_bytes)
        weakref.finalize(anchor, _release, self.service, self.session, slot,
                         None if copy else self._returned)
        fields = ready.get("fields") or []
        try:
            data = _batch_codec.decode(ready["tree"], _ArrayMaker(anchor, fields, copy))
        finally:
            del anchor  # from here on only the views keep the slot
        if not copy:
            self._handed += 1
        return data


def _release(service, session, slot, returned):
    if returned is not None:
        returned[0] += 1
    service.released(session, slot)


class _ArrayMaker(object):
    def __init__(self, anchor, fields, copy):
        self.anchor, self.fields, self.copy = anchor, fields, copy

    def __call__(self, kind, index):
        import numpy as np

        field = self.fields[index]
        dtype = _NUMPY[field["dtype"]]
        shape = tuple(field["shape"])
        count = 1
        for n in shape:
            count *= n
        array = np.frombuffer(self.anchor, dtype=dtype, count=count,
                              offset=field["offset"]).reshape(shape)
        if kind == "ndarray":
            return array.copy() if self.copy else array
        torch = sys.modules["torch"]
        tensor = torch.from_numpy(array)
        if field["dtype"] == "bf16":
            tensor = tensor.view(torch.bfloat16)
        return tensor.clone() if self.copy else tensor
