"""Post-import hook for multiprocessing.context: spawn becomes the default start method.

`patch(ctxmod)` is called by the bootstrap (sitecustomize.py) right after
multiprocessing.context is first executed, before multiprocessing/__init__ exports the
default context's methods; call it only from there (the import lock makes it single-threaded).

What it does, all deliberate:
  - the default context's underlying context becomes spawn, exactly as CPython does on
    macOS: nothing is "set", so code that never chooses gets spawn (Process, Pool, Queue,
    torch.multiprocessing, ProcessPoolExecutor, DataLoader) and the trainer may still call
    set_start_method('spawn') (a forced global set_start_method at start-up would make that
    raise "context has already been set" and break the many DDP scripts that call it);
  - asking again for the method already in effect is a no-op instead of that RuntimeError;
  - an explicit set_start_method('fork') is honoured, with a RuntimeWarning that says why
    fork is unsafe with GPU (CUDA/HIP) contexts and OpenMP thread pools;
  - a spawn or forkserver child started from an unguarded top-level line of the trainer's
    script (no `if __name__ == "__main__":`) ends the process with one line naming the line
    and the fix (_script.py), where the children would run the script again.
Imports nothing beyond the package's _report (this runs in every process that imports
multiprocessing, loader workers included); _script only when a child is about to start.
"""

from ._report import FORK_WARNING, warn


def patch(ctxmod):
    default = getattr(ctxmod, "_default_context", None)
    concrete = getattr(ctxmod, "_concrete_contexts", None)
    if default is None or not concrete or "spawn" not in concrete:
        return
    if getattr(default, "_spawnpoint_patched", False):
        return
    if getattr(default, "_actual_context", None) is None:
        default._default_context = concrete["spawn"]
    original = default.set_start_method

    def set_start_method(method, force=False):
        if method == "fork":
            warn(FORK_WARNING, 1)
        actual = getattr(default, "_actual_context", None)
        if (not force and method is not None and actual is not None
                and getattr(actual, "_name", None) == method):
            return None  # already in effect: no "context has already been set" error
        return original(method, force=force)

    for name in ("SpawnProcess", "ForkServerProcess"):
        _guard_popen(getattr(ctxmod, name, None))
    set_start_method.__doc__ = original.__doc__
    # An instance attribute: multiprocessing/__init__ exports the bound methods of the
    # default context after this hook ran, so multiprocessing.set_start_method (and
    # torch.multiprocessing's re-export) is this function.
    default.set_start_method = set_start_method
    default._spawnpoint_patched = True


def _guard_popen(cls):
    """Wraps cls._Popen (every spawn or forkserver child starts there: Process.start, Pool,
    ProcessPoolExecutor, DataLoader) so that a child started from an unguarded top-level line
    of the trainer's script ends the process with one line that says why (_script), instead
    of children that run the script again: a second init_process_group's port clash, or a
    Pool that respawns workers forever as each fails its bootstrapping."""
    original = getattr(cls, "__dict__", {}).get("_Popen") if cls is not None else None
    if not isinstance(original, staticmethod):
        return
    popen = original.__func__

    def _Popen(process_obj):
        from . import _script

        where = _script.unguarded_call()
        if where is not None:
            from ._report import fatal

            fatal(_script.advice(where, "starts a %s process" % cls._start_method))
        return popen(process_obj)

    cls._Popen = staticmethod(_Popen)
