"""The rank's writer of its progress record (agent/progress/progress_record.h): steps, their
durations and their waits for peers, for the agent's hang and straggler detection, never
through stdout.

The bootstrap (sitecustomize.py) takes SPAWNPOINT_PROGRESS_FILE out of the environment at
start-up (so processes the rank starts never write to the record) and gives this package
its path and the start-up time as `progress_file` and `progress_attach_ns`. The first
counted step maps the record and stamps the writer pid and attach time; each step then
publishes its duration (since the previous step's end, the first since start-up) into the
ring (and the time it waited for peers in collectives, added by `add_wait(ns)`, into the
waits ring), then
last_step_ns, then steps. `waiting_since(ns)` says, live, since when the rank waits for its
peers in a collective (0: it does not): the agent names the rank its peers wait on
(agent/run/stall_watch.h); it attaches too, so it works before the first step. `count_step(source)` counts; the first EXPLICIT step
(spawnpoint.step()) makes the record explicit and automatic counts (OPTIMIZER) stop. Without
a record, in a forked child, or where the record cannot be used (reported once), counting
is a no-op. Safe from any thread (one lock; a step takes microseconds to count).
"""

import os
import sys
import threading
import time

from ._report import report_once

# StepSource (progress_record.h).
OPTIMIZER = 1
EXPLICIT = 3

MAGIC = b"SPPROG1\0"
VERSION = 3
FILE_SIZE = 4096
RING = 256
# Offsets (ProgressLayout) as indices of the record viewed as u32 and as u64.
_U32_VERSION = 8 // 4
_U32_WRITER_PID = 12 // 4
_U32_SOURCE = 40 // 4
_U32_DURATIONS = 64 // 4
_U32_WAITS = _U32_DURATIONS + 256
_U64_STEPS = 16 // 8
_U64_LAST_STEP_NS = 24 // 8
_U64_FIRST_STEP_NS = 32 // 8
_U64_ATTACH_NS = 48 // 8
_U64_WAITING_SINCE_NS = 56 // 8
_MAX_US = 0xFFFFFFFF


class Writer(object):
    """One mapped record. Aligned native stores through memoryviews: each field is written
    whole (a reader never sees half a count), in the order the layout asks for."""

    def __init__(self, path, pid, attach_ns):
        import mmap

        if sys.byteorder != "little":
            raise ValueError("the record is little-endian; this machine is not")
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if size < FILE_SIZE:
                raise ValueError("%d bytes, a record has %d" % (size, FILE_SIZE))
            self._map = mmap.mmap(fd, FILE_SIZE, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        view = memoryview(self._map)
        self._u32 = view.cast("I")
        self._u64 = view.cast("Q")
        if bytes(view[:8]) != MAGIC:
            raise ValueError("not a progress record (bad magic)")
        if self._u32[_U32_VERSION] != VERSION:
            raise ValueError("version %d, this shim writes version %d"
                             % (self._u32[_U32_VERSION], VERSION))
        self._lock = threading.Lock()
        self._steps = self._u64[_U64_STEPS]  # a record counted before goes on from its count
        self._explicit = self._u32[_U32_SOURCE] == EXPLICIT
        self._last_end_ns = attach_ns
        self._u32[_U32_WRITER_PID] = pid
        self._u64[_U64_ATTACH_NS] = attach_ns

    def set_waiting_since(self, since_ns):
        """One whole store: the rank waits for its peers since `since_ns` (0: not)."""
        self._u64[_U64_WAITING_SINCE_NS] = max(0, since_ns)

    def count(self, source, now_ns, wait_ns=0):
        """Counts one step of `source` that ended at `now_ns` (time.monotonic_ns()), of which
        it spent `wait_ns` waiting for peers."""
        with self._lock:
            if self._explicit and source != EXPLICIT:
                return
            if source == EXPLICIT:
                self._explicit = True
            n = self._steps + 1
            us = min(max(0, (now_ns - self._last_end_ns) // 1000), _MAX_US)
            self._u32[_U32_DURATIONS + (n - 1) % RING] = us
            self._u32[_U32_WAITS + (n - 1) % RING] = min(max(0, wait_ns // 1000), us)
            self._u64[_U64_LAST_STEP_NS] = now_ns
            if n == 1:
                self._u64[_U64_FIRST_STEP_NS] = now_ns
            self._u32[_U32_SOURCE] = source
            self._u64[_U64_STEPS] = n  # last: a reader that sees n sees step n's figures
            self._steps = n
            self._last_end_ns = now_ns


_lock = threading.Lock()
_writer = None     # the Writer, once attached
_writer_pid = 0    # the process that attached (a forked child does not write)
_tried = False     # attaching was tried (successfully or not)
_wait_lock = threading.Lock()
_wait_ns = 0       # the step in flight's wait for peers, from add_wait


def _attach():
    """The process's Writer, attaching on the first call; None if there is no record."""
    global _writer, _writer_pid, _tried
    with _lock:
        if not _tried:
            _tried = True
            package = sys.modules.get(__package__)
            path = getattr(package, "progress_file", None)
            if path:
                attach_ns = getattr(package, "progress_attach_ns", None) or time.monotonic_ns()
                try:
                    _writer = Writer(path, os.getpid(), attach_ns)
                    _writer_pid = os.getpid()
                except (OSError, ValueError) as err:
                    report_once("progress record %s: %s; this rank's steps are not reported"
                                % (path, err))
        return _writer


def add_wait(ns):
    """Adds `ns` waited for peers in a collective to the step in flight."""
    global _wait_ns
    with _wait_lock:
        _wait_ns += max(0, ns)


def _take_wait():
    global _wait_ns
    with _wait_lock:
        wait, _wait_ns = _wait_ns, 0
    return wait


def waiting_since(since_ns):
    """This rank has waited for its peers in a collective since `since_ns`
    (time.monotonic_ns()); 0: it does not wait now. A no-op without a record."""
    writer = _writer if _tried else _attach()
    if writer is not None and os.getpid() == _writer_pid:
        writer.set_waiting_since(since_ns)


def count_step(source):
    """Counts one step of `source` (OPTIMIZER or EXPLICIT) in this rank's record, if any."""
    writer = _writer if _tried else _attach()
    if writer is not None and os.getpid() == _writer_pid:
        writer.count(source, time.monotonic_ns(), _take_wait())
        if not _learned and not _pool_workers_starting():
            _learn_modules()


_learned = False  # the modules imported by the first step were written for the next standby


def _pool_workers_starting():
    """Whether the rank's loader workers may still be starting (_pool.workers_warm)."""
    pool = sys.modules.get(__package__ + "._pool")
    return pool is not None and pool.iterators_served and not pool.workers_warm


def _learn_modules():
    """At the first counted step once the rank's loader workers have each served a batch:
    what this rank has imported, for its next standby, which the agent prepares once the
    file is written (_standby.learn_modules; SPAWNPOINT_STANDBY_LEARN names the file)."""
    global _learned
    _learned = True
    path = os.environ.get("SPAWNPOINT_STANDBY_LEARN")
    if not path:
        return
    try:
        from . import _standby

        _standby.learn_modules(path, getattr(sys.modules.get("__main__"), "__file__", None))
    except Exception as err:
        report_once("the modules for the next standby were not written (%s: %s)"
                    % (type(err).__name__, err))


def step():
    """spawnpoint.step(): one explicit step."""
    count_step(EXPLICIT)
