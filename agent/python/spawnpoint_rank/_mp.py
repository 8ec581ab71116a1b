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
A private name of multiprocessing it needs that is missing turns that part off, said once
(_private.py). Imports nothing beyond the package's _report and _private (this runs in every
process that imports multiprocessing, loader workers included); _script only when a child is
about to start.
"""

from . import _private
from ._report import FORK_WARNING, warn

_SCOPE = "multiprocessing.context"


def patch(ctxmod):
    # Each class whose _Popen is there is guarded; a missing one is said once.
    _private.missing("popen_guard", {_SCOPE: ctxmod})
    for name, method in (("SpawnProcess", "spawn"), ("ForkServerProcess", "forkserver")):
        _guard_popen(getattr(ctxmod, name, None), method)
    if _private.missing("spawn_default", {_SCOPE: ctxmod}):
        return  # said: multiprocessing's own default start method stays
    default = ctxmod._default_context
    if getattr(default, "_spawnpoint_patched", False):
        return
    if _private.missing("spawn_default", {_SCOPE + ":DefaultContext()": default}):
        return
    if default.get_start_method(allow_none=True) is None:  # not chosen yet (public: no side effect)
        default._default_context = default.get_context("spawn")
    original = default.set_start_method

    def set_start_method(method, force=False):
        if method == "fork":
            warn(FORK_WARNING, 1)
        if (not force and method is not None
                and default.get_start_method(allow_none=True) == method):
            return None  # already in effect: no "context has already been set" error
        return original(method, force=force)

    set_start_method.__doc__ = original.__doc__
    # An instance attribute: multiprocessing/__init__ exports the bound methods of the
    # default context after this hook ran, so multiprocessing.set_start_method (and
    # torch.multiprocessing's re-export) is this function.
    default.set_start_method = set_start_method
    default._spawnpoint_patched = True


def _guard_popen(cls, method):
    """Wraps cls._Popen (every spawn or forkserver child starts there: Process.start, Pool,
    ProcessPoolExecutor, DataLoader) so that a child started from an unguarded top-level line
    of the trainer's script ends the process with one line that says why (_script), instead
    of children that run the script again: a second init_process_group's port clash, or a
    Pool that respawns workers forever as each fails its bootstrapping. A class without a
    static _Popen is left alone, said once."""
    if cls is None or getattr(cls, "_Popen", None) is None:
        return  # patch() has said so
    original = cls.__dict__.get("_Popen")
    if not isinstance(original, staticmethod):  # inherited, or not static: not ours to wrap
        _private.say_off("popen_guard", ["%s:%s._Popen" % (_SCOPE, cls.__name__)])
        return
    if getattr(original.__func__, "_spawnpoint_guard", False):
        return
    popen = original.__func__

    def _Popen(process_obj):
        from . import _script

        where = _script.unguarded_call()
        if where is not None:
            from ._report import fatal

            fatal(_script.advice(where, "starts a %s process" % method))
        return popen(process_obj)

    _Popen._spawnpoint_guard = True
    cls._Popen = staticmethod(_Popen)
