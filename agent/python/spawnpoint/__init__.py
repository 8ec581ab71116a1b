"""spawnpoint for trainers: `import spawnpoint; spawnpoint.step()` once per training step.

The agent ships this package beside its start-up shim, so every Python rank it starts can
import it. step() tells the agent that the rank finished a step (its hang and straggler
detection reads the count and the step times). Python ranks need it only when they do not
step a torch optimizer, which the shim counts by itself; once step() was called, those
automatic counts stop, so nothing is counted twice. Outside an agent-started rank it does
nothing. Safe from any thread; a call costs a few microseconds.

From a notebook (or any Python process), `spawnpoint.launch(fn, *args, nprocs=N)` runs
fn(*args) on N ranks that spawnpoint-agent spawns on this machine and returns rank 0's
result; a rank's exception is raised with its traceback (`spawnpoint.RankFailed` when it
cannot be rebuilt), see launcher.py and docs/notebooks.md. Importing the package imports
neither the launcher nor torch: launch, RankFailed and LaunchError load on first use.
"""

import sys

__all__ = ["step", "launch", "RankFailed", "LaunchError"]
_LAUNCHER = ("launch", "RankFailed", "LaunchError")

_step = None  # the rank side's step(), or a no-op outside an agent-started rank


def step():
    """One training step done."""
    global _step
    if _step is None:
        _step = _resolve()
    _step()


def _noop():
    pass


def _resolve():
    shim = sys.modules.get("sitecustomize")
    hook_function = getattr(shim, "_hook_function", None)
    if not getattr(shim, "shim_active", False) or hook_function is None:
        return _noop
    try:  # the package beside the shim that is in charge, as its hooks get it
        return hook_function("spawnpoint_rank._progress:step")
    except Exception as err:
        sys.stderr.write("spawnpoint: step() is a no-op here (%s: %s)\n"
                         % (type(err).__name__, err))
        return _noop


def __getattr__(name):  # PEP 562: the launcher only when asked for
    if name in _LAUNCHER:
        from . import launcher

        return getattr(launcher, name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def load_ipython_extension(ipython):  # %load_ext spawnpoint: the notebook extension
    from . import notebook

    notebook.install()


def unload_ipython_extension(ipython):  # %unload_ext spawnpoint
    from . import notebook

    notebook.unload()
