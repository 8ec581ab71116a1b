"""Post-import hook for torch.utils.data.dataloader: the job's defaults for every DataLoader.

`patch(dlmod)` is called by the bootstrap (sitecustomize.py) right after
torch.utils.data.dataloader is first executed (torch is never imported by the shim itself);
call it only from there. It wraps two methods of dlmod.DataLoader:

  __init__       binds the call against the original signature (positional arguments count
                 as the code's choice, as keywords do: DataLoader(ds, 32, True, None, None, 4)
                 has num_workers=4), asks policy.loader_defaults what the job fills in for
                 current()'s RankEnv, raises its warnings at the trainer's line, and with
                 SPAWNPOINT_SHIM_DEBUG=1 prints one line per loader. A call that does not
                 bind is passed through untouched so torch reports it in its own words.
  _get_iterator  spawned workers pickle the dataset, collate_fn and worker_init_fn; forked
                 ones did not. If that pickling fails when the iterator starts: for workers
                 that came from the job, a RuntimeWarning and the loader runs in the main
                 process (as the code asked); for workers the code asked for, a RuntimeError
                 that explains the spawn requirement (chained to the pickling error).
                 It also hands the loader to the agent's pool (_pool_iter.py). A torch whose
                 DataLoader has no _get_iterator (a private name: _private.py) gets no job
                 workers for loaders that asked for none, since nothing could take them back
                 at iter(), and no pool: said once, and every loader runs as the code asked.

What is not touched: pin_memory and everything else (pinning needs the code's device
handling, torch already seeds worker w with base_seed + w, spawn is the only start method a
job accepts). Persistent workers keep the dataset they unpickled at the first epoch: a
trainer that mutates its dataset between epochs must pass persistent_workers=False or run
with the job's persistentWorkers: false.
"""

import dataclasses
import functools
import inspect
import os
import sys

from . import _private, _script
from . import env as _env
from ._report import fatal, report_once, warn
from .policy import context_start_method, debug_line, loader_defaults, warnings_in

_PICKLE_FALLBACK = (
    "spawnpoint: the job asked for %d DataLoader workers, but spawned workers need the "
    "dataset, collate_fn and worker_init_fn to be picklable and they are not (%s: %s); this "
    "loader runs in the main process as the code asked. Define them at module level (no "
    "lambdas or local functions) to get workers.")
_UNGUARDED_FALLBACK = (
    "spawnpoint: the job asked for %d DataLoader workers, but this loader runs in the main "
    "process: %s")
_PICKLE_ERROR = (
    "spawnpoint starts DataLoader workers with 'spawn' (a forked worker of a process with a "
    "GPU context crashes or hangs), which pickles the dataset, collate_fn and "
    "worker_init_fn; one of them cannot be pickled (%s: %s). Define them at module level (no "
    "lambdas or local functions), or pass multiprocessing_context='fork' explicitly to "
    "accept fork's risks.")


def _spawns(loader):
    """Whether torch's workers for `loader` would be spawned (or forkserver'd): children that
    import the trainer's script before they work."""
    context = loader.multiprocessing_context
    if context is not None:
        name = context_start_method(context)
    else:
        mp = sys.modules.get("multiprocessing")
        try:
            name = mp.get_start_method() if mp is not None else None
        except Exception:
            name = None
    return name in ("spawn", "forkserver")


def _in_daemon_process():
    mp = sys.modules.get("multiprocessing")
    try:
        return mp is not None and bool(mp.current_process().daemon)
    except Exception:
        return False


def _warm_pool():
    """With an agent's loader service: imports the pool's rank side and connects to the
    service now, so that the first iter(), where the trainer waits for its first batch, does
    neither (~8 ms). A failure is left for iter() to report."""
    if not getattr(sys.modules.get(__package__), "loader_service", None):
        return
    try:
        from . import _byvalue, _pool
        from . import _pool_iter  # noqa: F401  (imported for its cost)

        _byvalue.cloudpickle()
        _pool.service()
    except Exception:
        pass


def _is_pickling_error(err):
    import pickle

    if isinstance(err, pickle.PicklingError):  # Python 3.14: "Can't pickle local object ..."
        return True
    if not isinstance(err, (AttributeError, TypeError)):
        return False
    message = str(err).lower()
    # "Can't pickle local object ..." (AttributeError up to Python 3.12), "cannot pickle
    # '_thread.lock' object" (TypeError); Python 3.13 says "Can't get local object ..."
    # for the first, without the word.
    return "pickle" in message or "can't get local object" in message


def patch(dlmod):
    cls = getattr(dlmod, "DataLoader", None)
    if cls is None or getattr(cls.__init__, "_spawnpoint_shim", False):
        return
    original_init = cls.__init__
    signature = inspect.signature(original_init)
    parameters = signature.parameters
    if "num_workers" not in parameters:
        return
    accepted = frozenset(parameters)
    iterable_base = getattr(dlmod, "IterableDataset", None)
    # Without the iterator hook nothing could take the job's workers back from a loader whose
    # dataset does not pickle: loaders keep the workers the code asked for (said once).
    iterator_hook = not _private.missing("iterator_hook", {"torch.utils.data.dataloader": dlmod})

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:  # a wrong call: let torch report it in its own words
            return original_init(self, *args, **kwargs)
        env = _env.current()
        if env is None:  # SPAWNPOINT_SHIM unset after start-up: stock behaviour
            return original_init(self, *args, **kwargs)
        if not iterator_hook:
            env = dataclasses.replace(env, loader_workers=None)
        dataset = bound.arguments.get("dataset")
        iterable = iterable_base is not None and isinstance(dataset, iterable_base)
        defaults, notes = loader_defaults(env, bound.arguments, iterable, _in_daemon_process(),
                                          accepted)
        for message in warnings_in(notes):
            warn(message, 1)
        bound.arguments.update(defaults)
        original_init(*bound.args, **bound.kwargs)
        self.__dict__["_spawnpoint_shim"] = {
            "workers_from_job": defaults.get("num_workers", 0),
            "spawn_from_shim": "multiprocessing_context" in defaults,
        }
        if self.num_workers > 0 and not iterable:
            _warm_pool()
        if env.debug:
            sys.stderr.write("spawnpoint-shim: DataLoader(%s) in pid %d: %s\n" % (
                type(dataset).__name__, os.getpid(), debug_line(notes)))
            sys.stderr.flush()

    __init__._spawnpoint_shim = True
    cls.__init__ = __init__

    if not iterator_hook:
        return
    original_get_iterator = cls._get_iterator

    @functools.wraps(original_get_iterator)
    def _get_iterator(self):
        if self.num_workers > 0 and not _in_daemon_process():
            from ._pool_iter import pool_iterator

            iterator, reason = pool_iterator(self)
            if iterator is not None:
                return iterator
            if reason:
                report_once("a DataLoader of %s runs on torch's own workers, not the agent's "
                            "pool: %s" % (type(self.dataset).__name__, reason))
        if self.num_workers > 0 and _spawns(self):
            where = _script.unguarded_call()
            if where is not None:  # torch's spawned workers would run the script again
                info = self.__dict__.get("_spawnpoint_shim")
                if info and info["workers_from_job"]:
                    warn(_UNGUARDED_FALLBACK % (info["workers_from_job"], _script.advice(
                        where, "iterates a DataLoader", loader=True)), 2)
                    info["workers_from_job"] = 0
                    self.num_workers = 0
                    return original_get_iterator(self)
                fatal(_script.advice(where, "starts DataLoader workers", loader=True))
        try:
            return original_get_iterator(self)
        except Exception as err:
            info = self.__dict__.get("_spawnpoint_shim")
            if (not info or not info["spawn_from_shim"] or not self.num_workers
                    or not _is_pickling_error(err)):
                raise
            if info["workers_from_job"]:
                warn(_PICKLE_FALLBACK % (info["workers_from_job"], type(err).__name__, err), 2)
                info["workers_from_job"] = 0
                info["spawn_from_shim"] = False
                self.num_workers = 0
                self.timeout = 0
                return original_get_iterator(self)
            raise RuntimeError(_PICKLE_ERROR % (type(err).__name__, err)) from err

    _get_iterator._spawnpoint_shim = True
    cls._get_iterator = _get_iterator
