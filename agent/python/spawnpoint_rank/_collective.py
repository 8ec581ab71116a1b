"""How long the rank waits for its peers in collectives: the part of each step that is not
its own work, so the agent can tell a straggler from the ranks that wait for it.

In synchronous data-parallel training every rank's step takes as long as the slowest one's:
the others block in the gradient allreduce until it arrives. Step durations therefore look
alike on every rank; a step's duration minus the rank's wait for peers is its own work
(loading, forward, backward, optimizer), and that is what differs. Two sources are timed,
only in a rank with a progress record (`progress_file` set by the bootstrap):

  DistributedDataParallel (post-import hook on torch.nn.parallel.distributed, `patch_ddp`):
    DDP allreduces each gradient bucket as its gradients are ready, while backward goes on,
    and waits for every bucket at the end of backward, before torch.autograd.backward
    returns. The rank's own backward work ends with the last gradient it computes; from then
    until backward returns it waits for its peers (and for its last bucket's allreduce).
    Both ends are taken on the trainer's side, never on the process group's threads: a
    gradient hook on each parameter of a DDP model (Tensor.register_hook, run by autograd)
    stamps the last gradient, and a wrapper on torch.autograd.backward (which
    Tensor.backward calls, so plain loops, Lightning, Ultralytics and GradScaler are covered)
    takes the difference when backward returns. The trainer's own communication hooks
    (PowerSGD, fp16 compression) are untouched and timed alike. A Python communication hook
    of ours would leave callbacks for gloo's worker threads, whose teardown waits for them
    holding the GIL: a rank could hang at exit. On CUDA the stamps are the host's (kernels
    are asynchronous): a wait spent in a later synchronisation is not seen.

  Blocking calls of torch.distributed's collectives (`patch_functions`, from the
    torch.distributed hook): all_reduce, all_gather, broadcast, barrier, reduce_scatter and
    the like, with async_op false, wait for as long as the call takes.

Both add to the step in flight through _progress.add_wait. Both also say, live, since when
the rank waits (_progress.waiting_since): a blocking collective from its call, DDP's backward
from its latest gradient (until another gradient is computed, or backward returns), and a DDP
model's construction (which broadcasts rank 0's parameters) from its call. The agent names a
rank that makes no step while a peer has long waited for it (agent/run/stall_watch.h).
"""

import functools
import inspect
import sys
import threading
import time

from . import _progress

# torch.distributed's blocking collectives (names absent from a torch are skipped).
_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor",
                "broadcast", "broadcast_object_list", "barrier", "reduce", "reduce_scatter",
                "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter",
                "monitored_barrier")


def _enabled():
    """A rank with a progress record, or a standby whose attempt will bring one (the timing
    itself is a no-op without a record)."""
    package = sys.modules.get(__package__)
    return bool(getattr(package, "progress_file", None) or getattr(package, "standby", False))


class BackwardClock(object):
    """The waits of DDP's backward passes: `begin()` when a backward starts, `grad(now)` for
    each gradient of a DDP parameter computed, `end(now)` when the backward returns, giving
    the ns waited (0 for a pass without DDP gradients). Nested passes (a backward inside a
    hook) count as part of the outer one. The GIL serialises its callers."""

    def __init__(self):
        self._depth = 0
        self._last_grad = 0  # this pass's latest DDP gradient

    def begin(self):
        if self._depth == 0:
            self._last_grad = 0
        self._depth += 1

    def grad(self, now):
        if now > self._last_grad:
            self._last_grad = now

    def end(self, now):
        self._depth = max(0, self._depth - 1)
        if self._depth or not self._last_grad:
            return 0
        wait, self._last_grad = max(0, now - self._last_grad), 0
        return wait


_clock = BackwardClock()
_nesting = threading.local()  # a timed collective in progress on this thread


def timed_backward(backward, clock=None):
    """`backward` (torch.autograd.backward) with the wait for DDP's allreduce added to the
    step in flight; same name and signature."""
    clock = clock or _clock

    @functools.wraps(backward)
    def timed(*args, **kwargs):
        clock.begin()
        try:
            return backward(*args, **kwargs)
        finally:
            wait = clock.end(time.monotonic_ns())
            _progress.waiting_since(0)
            if wait:
                _progress.add_wait(wait)

    timed._spawnpoint_timed = True
    return timed


def stamp_gradients(module, clock=None):
    """A hook on each parameter of `module` that takes a gradient: the time of the last one
    computed in a backward pass. Once per module."""
    clock = clock or _clock
    if module.__dict__.get("_spawnpoint_stamped", False):
        return
    module.__dict__["_spawnpoint_stamped"] = True

    def stamp(grad):
        now = time.monotonic_ns()
        clock.grad(now)
        _progress.waiting_since(now)  # for the allreduce, unless another gradient comes

    for p in module.parameters():
        if p.requires_grad:
            p.register_hook(stamp)


def patch_ddp(ddpmod):
    """The hook for torch.nn.parallel.distributed: every DDP model's parameters stamp their
    gradients (at construction), and torch.autograd.backward is timed."""
    ddp = getattr(ddpmod, "DistributedDataParallel", None)
    if ddp is None or getattr(ddp, "_spawnpoint_timed", False) or not _enabled():
        return
    autograd = sys.modules.get("torch.autograd")
    backward = getattr(autograd, "backward", None)
    if backward is None:
        return
    ddp._spawnpoint_timed = True
    if not getattr(backward, "_spawnpoint_timed", False):
        autograd.backward = timed_backward(backward)
    init = ddp.__init__

    @functools.wraps(init)
    def stamped_init(self, *args, **kwargs):
        _progress.waiting_since(time.monotonic_ns())  # the parameters' broadcast
        try:
            init(self, *args, **kwargs)
        finally:
            _progress.waiting_since(0)
        stamp_gradients(self)

    ddp.__init__ = stamped_init


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
        _progress.waiting_since(start)
        try:
            return fn(*args, **kwargs)
        finally:
            _nesting.depth = 0
            _progress.waiting_since(0)
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
