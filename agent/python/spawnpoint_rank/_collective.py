"""How long the rank waits for its peers in collectives: the part of each step that is not
its own work, so the agent can tell a straggler from the ranks that wait for it.

In synchronous data-parallel training every rank's step takes as long as the slowest one's:
the others block in the gradient allreduce until it arrives. Step durations therefore look
alike on every rank; a step's duration minus the rank's wait for peers is its own work
(loading, forward, backward, optimizer), and that is what differs. Two sources are timed,
only in a rank with a progress record (`progress_file` set by the bootstrap):

  DistributedDataParallel (post-import hook on torch.nn.parallel.distributed, `patch_ddp`;
    experimental, only with SPAWNPOINT_TIME_DDP=1: see patch_ddp):
    DDP hands each gradient bucket to a communication hook when the bucket's gradients are
    ready and waits for the hooks' futures at the end of backward. The rank's own backward
    work ends when its last bucket is ready; from then until its last bucket's allreduce
    completes it waits for its peers. So every hook is wrapped: a user's hook
    (register_comm_hook, including Lightning's ddp_comm_hook) keeps its behaviour with a
    timestamp on the way in and one on completion; a model with none gets torch's own
    default_hooks.allreduce_hook (what DDP's built-in allreduce does: divide by the world
    size, allreduce) on its first forward. A built-in C++ hook chosen by the trainer
    (_register_builtin_comm_hook) is left alone and untimed. Per backward pass, the wait
    is the last completion minus the last ready bucket (0 when the rank itself was last).

  Blocking calls of torch.distributed's collectives (`patch_functions`, from the
    torch.distributed hook): all_reduce, all_gather, broadcast, barrier, reduce_scatter and
    the like, with async_op false, wait for as long as the call takes.

Both add to the step in flight through _progress (add_wait_source / add_wait). Thread-safe:
hooks complete on the process group's threads.
"""

import functools
import inspect
import os
import sys
import threading
import time

from . import _progress
from ._report import report_once

# torch.distributed's blocking collectives (names absent from a torch are skipped).
_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor",
                "broadcast", "broadcast_object_list", "barrier", "reduce", "reduce_scatter",
                "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter",
                "monitored_barrier")


def _enabled():
    package = sys.modules.get(__package__)
    return bool(getattr(package, "progress_file", None))


class BucketClock(object):
    """The waits of DDP's backward passes: `ready(now)` when a bucket is handed to the hook,
    `done(now)` when its allreduce completes, `take()` the ns waited since the last take.
    A pass ends when all its buckets are done and a new bucket (or a take) comes."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pending = 0    # buckets handed over and not yet done
        self._ready = 0      # this pass's latest ready bucket
        self._done = 0       # this pass's latest completion
        self._wait = 0       # closed passes' waits, not yet taken

    def _close(self):
        if self._done > self._ready:
            self._wait += self._done - self._ready
        self._ready = self._done = 0

    def ready(self, now):
        with self._lock:
            if self._pending == 0 and self._done:
                self._close()
            self._pending += 1
            self._ready = max(self._ready, now)

    def done(self, now):
        with self._lock:
            self._pending = max(0, self._pending - 1)
            self._done = max(self._done, now)

    def take(self):
        with self._lock:
            if self._pending == 0 and self._done:
                self._close()
            wait, self._wait = self._wait, 0
            return wait


_clock = BucketClock()
_nesting = threading.local()  # a timed collective in progress on this thread
_clock_registered = False


def timed_hook(hook, clock=None):
    """`hook` (a DDP communication hook: (state, bucket) -> Future) with its buckets timed
    on `clock` (the process's BucketClock by default). Keeps the hook's name and signature,
    which DDP checks."""
    clock = clock or _clock

    @functools.wraps(hook)
    def timed(state, bucket):
        clock.ready(time.monotonic_ns())
        fut = hook(state, bucket)

        def completed(f):
            clock.done(time.monotonic_ns())
            return f.value()

        return fut.then(completed)

    timed._spawnpoint_timed = True
    return timed


def patch_ddp(ddpmod):
    """The hook for torch.nn.parallel.distributed: times DDP's gradient allreduce, only with
    SPAWNPOINT_TIME_DDP=1 (experimental). A Python communication hook leaves Python objects
    (its futures' callbacks) for gloo's worker threads to release; gloo's process group
    waits for those threads while holding the GIL when a DDP model is torn down after
    destroy_process_group(), and a rank then hangs at exit (seen on a loaded machine). Until
    the wait is measured without Python callbacks on those threads, it is opt-in."""
    global _clock_registered
    ddp = getattr(ddpmod, "DistributedDataParallel", None)
    if ddp is None or getattr(ddp, "_spawnpoint_timed", False) or not _enabled():
        return
    if os.environ.get("SPAWNPOINT_TIME_DDP", "") != "1":
        return
    if not hasattr(ddp, "register_comm_hook"):
        return
    ddp._spawnpoint_timed = True
    if not _clock_registered:
        _progress.add_wait_source(_clock.take)
        _clock_registered = True
    register = ddp.register_comm_hook
    register_builtin = getattr(ddp, "_register_builtin_comm_hook", None)
    forward = ddp.forward

    @functools.wraps(register)
    def register_comm_hook(self, state, hook):
        self.__dict__["_spawnpoint_hooked"] = True
        if getattr(hook, "_spawnpoint_timed", False):
            return register(self, state, hook)
        return register(self, state, timed_hook(hook))

    ddp.register_comm_hook = register_comm_hook

    if register_builtin is not None:
        @functools.wraps(register_builtin)
        def _register_builtin_comm_hook(self, comm_hook_type):
            self.__dict__["_spawnpoint_hooked"] = True  # C++: not timed
            return register_builtin(self, comm_hook_type)

        ddp._register_builtin_comm_hook = _register_builtin_comm_hook

    @functools.wraps(forward)
    def timed_forward(self, *args, **kwargs):
        if not self.__dict__.get("_spawnpoint_hooked", False):
            self.__dict__["_spawnpoint_hooked"] = True
            _register_default(self, register)
        return forward(self, *args, **kwargs)

    ddp.forward = timed_forward


def _register_default(model, register):
    try:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        register(model, model.process_group, timed_hook(default_hooks.allreduce_hook))
    except Exception as err:  # a hook registered behind DDP's back, a torch we do not know
        report_once("cannot time DDP's allreduce (%s: %s); this rank's waits for its peers "
                    "are not reported" % (type(err).__name__, err))


def _timed_collective(fn):
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return fn
    index = params.index("async_op") if "async_op" in params else None

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        depth = getattr(_nesting, "depth", 0)
        if depth or index is not None and (kwargs.get("async_op") or
                                           (len(args) > index and args[index])):
            return fn(*args, **kwargs)
        start = time.monotonic_ns()
        _nesting.depth = 1  # broadcast_object_list's own broadcast is not counted again
        try:
            return fn(*args, **kwargs)
        finally:
            _nesting.depth = 0
            _progress.add_wait(time.monotonic_ns() - start)

    timed._spawnpoint_timed = True
    return timed


def patch_functions(distmod):
    """From the torch.distributed hook: times its blocking collectives."""
    if not _enabled():
        return
    c10d = sys.modules.get(distmod.__name__ + ".distributed_c10d")
    for name in _COLLECTIVES:
        fn = getattr(distmod, name, None)
        if fn is None or getattr(fn, "_spawnpoint_timed", False):
            continue
        timed = _timed_collective(fn)
        setattr(distmod, name, timed)
        if c10d is not None and getattr(c10d, name, None) is fn:
            setattr(c10d, name, timed)
