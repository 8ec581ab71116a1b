"""The notebook extension: Lightning's spawning and forking strategies on spawnpoint.launch.

    %load_ext spawnpoint          (IPython; or, anywhere:)
    import spawnpoint.notebook

Then `Trainer(strategy="ddp_notebook" | "ddp_fork" | "ddp_spawn", devices=N)` (and "auto",
which Lightning makes ddp_fork in an interactive kernel with several devices) runs
fit/validate/test/predict on N ranks that spawnpoint-agent spawns fresh, through
spawnpoint.launch, instead of forking the kernel (which does not survive the kernel's CUDA
context or OpenMP threads) or spawning children (which cannot import what cells define).

What it changes, said once when the extension loads: Lightning's `_MultiProcessingLauncher`
(lightning.pytorch.strategies.launchers.multiprocessing, and pytorch_lightning's copy) gets
  - `launch`: the kernel's side. Instead of torch.multiprocessing.start_processes, one
    spawnpoint.launch of `nprocs=strategy.num_processes` ranks (one GPU each with a CUDA
    accelerator) running _notebook_rank.main with the launcher, the trainer, Lightning's function and
    its arguments by value (cloudpickle: a LightningModule or DataLoader defined in a cell
    goes along) and the kernel's global state (Lightning's _GlobalStateSnapshot: RNG states,
    deterministic flags, as Lightning's spawn path sends). Rank 0's _WorkerOutput comes back
    and Lightning's own _recover_results_in_main_process restores it, exactly as after its own
    launch: the last weights into the kernel's LightningModule (load_state_dict, strict=False),
    trainer.state, callback_metrics, the checkpoint callback's best_model_path; the call
    returns the rank's results (validate/test metrics, predictions). A second fit on the same
    Trainer is refused as Lightning refuses it.
  - `is_interactive_compatible`: True, so ddp_spawn is accepted in a kernel too (its children
    no longer need to import __main__).
On each rank, _notebook_rank.main runs Lightning's own `_wrapping_function` (the rank is
process LOCAL_RANK) with a queue that keeps what rank 0 puts, after giving the strategy a fresh
cluster environment of the same kind (a LightningEnvironment caches the port it found in the
kernel; the rank must use the agent's MASTER_ADDR/MASTER_PORT).

Private names (checked when a launcher module is patched, as spawnpoint_rank/_private.py
does for the rank side): _MultiProcessingLauncher with launch, _wrapping_function,
_recover_results_in_main_process and _collect_rank_zero_results, the module's
_GlobalStateSnapshot, and TrainerFn. One missing: one line says which and that Lightning's own
launcher (fork/spawn) is kept, and nothing of that module is patched.

Importing this module imports neither Lightning nor torch: a launcher module imported later is
patched right after it is executed (a meta path finder), one already imported is patched now.
`unload()` (`%unload_ext spawnpoint`) puts Lightning's methods back.
"""

import importlib.abc
import importlib.util
import os
import sys
import threading

__all__ = ["install", "unload", "MODULES"]

MODULES = ("lightning.pytorch.strategies.launchers.multiprocessing",
           "pytorch_lightning.strategies.launchers.multiprocessing")
_CLASS = "_MultiProcessingLauncher"
_METHODS = ("launch", "_wrapping_function", "_recover_results_in_main_process",
            "_collect_rank_zero_results")
_MARK = "_spawnpoint_notebook"
_lock = threading.RLock()
_said = set()
_patched = {}  # module name -> {attribute: Lightning's original}
_finder = []


def _say(text):
    if text in _said:
        return
    _said.add(text)
    sys.stderr.write("[spawnpoint] notebook: %s\n" % text)
    sys.stderr.flush()


def missing_names(module):
    """The private names this extension needs that `module` (a launcher module) lacks."""
    lacking = []
    cls = getattr(module, _CLASS, None)
    if cls is None:
        return ["%s.%s" % (module.__name__, _CLASS)]
    for name in _METHODS:
        if not callable(getattr(cls, name, None)):
            lacking.append("%s.%s.%s" % (module.__name__, _CLASS, name))
    if not hasattr(getattr(module, "_GlobalStateSnapshot", None), "capture"):
        lacking.append("%s._GlobalStateSnapshot.capture" % module.__name__)
    if getattr(getattr(module, "TrainerFn", None), "FITTING", None) is None:
        lacking.append("%s.TrainerFn.FITTING" % module.__name__)
    return lacking


def patch(module):
    """Patches one launcher module (idempotent); False, said once, when a name is missing."""
    with _lock:
        if module.__name__ in _patched:
            return True
        lacking = missing_names(module)
        if lacking:
            version = getattr(sys.modules.get(module.__name__.split(".")[0]), "__version__", "?")
            _say("Lightning's spawning and forking strategies are NOT mapped to spawnpoint.launch: "
                 "%s %s has no %s; Lightning's own launcher (fork/spawn from this kernel) runs "
                 "them as without the extension" % (module.__name__.split(".")[0], version,
                                                    ", ".join(lacking)))
            return False
        cls = getattr(module, _CLASS)
        originals = {"launch": cls.__dict__["launch"],
                     "is_interactive_compatible": cls.__dict__.get("is_interactive_compatible")}
        cls.launch = _make_launch(module)
        cls.is_interactive_compatible = property(_interactive_compatible)
        _patched[module.__name__] = originals
        _say("Lightning's ddp_notebook, ddp_fork and ddp_spawn (and auto, which is ddp_fork here "
             "with several devices) now run fit/validate/test/predict on ranks that "
             "spawnpoint-agent spawns (spawnpoint.launch), not on processes forked or spawned "
             "from this kernel; the trained weights, trainer.state, callback_metrics and the "
             "checkpoint callback's best_model_path come back into this trainer and model as "
             "Lightning's launcher brings them (%s.%s.launch patched; %%unload_ext spawnpoint "
             "puts it back)" % (module.__name__, _CLASS))
        return True


def _interactive_compatible(self):
    return True  # the ranks get everything by value: nothing needs importing from __main__


def _make_launch(module):
    fitting = module.TrainerFn.FITTING
    snapshot = module._GlobalStateSnapshot

    def launch(self, function, *args, trainer=None, **kwargs):
        from . import _notebook_rank
        from .launcher import launch as spawnpoint_launch

        if self._already_fit and trainer is not None and trainer.state.fn == fitting:
            raise NotImplementedError(  # Lightning's own words: its launcher refuses the same
                "Calling `trainer.fit()` twice on the same Trainer instance using a spawn-based "
                "strategy is not supported. You can work around this limitation by creating a "
                "new Trainer instance and passing the `fit(ckpt_path=...)` argument.")
        strategy = self._strategy
        nprocs = int(strategy.num_processes)
        gpus = type(strategy.accelerator).__name__ == "CUDAAccelerator"
        what = getattr(function, "__name__", "the trainer's function").strip("_")
        sys.stderr.write("[spawnpoint] notebook: Lightning %s (start method %s): %s on %d %s "
                         "rank%s spawned by spawnpoint-agent\n"
                         % (type(strategy).__name__, self._start_method, what, nprocs,
                            "GPU" if gpus else "CPU", "" if nprocs == 1 else "s"))
        sys.stderr.flush()
        self.procs = []
        output = spawnpoint_launch(_notebook_rank.main, self, trainer, function, args, kwargs,
                                   snapshot.capture(), nprocs=nprocs, gpus=gpus,
                                   name="lightning-" + what.replace("_", "-"))
        if trainer is None:
            return output
        self._already_fit |= trainer.state.fn == fitting
        weights = getattr(output, "weights_path", None)
        self._recover_results_in_main_process(output, trainer)
        if weights:  # Lightning removes the file, not the mkdtemp directory it made for it
            try:
                os.rmdir(os.path.dirname(weights))
            except OSError:
                pass
        return output.trainer_results

    launch._spawnpoint_notebook = True
    return launch


class _Finder(importlib.abc.MetaPathFinder):
    """Patches a launcher module right after it is executed."""

    def find_spec(self, name, path=None, target=None):
        if name not in MODULES or name in _patched:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module):
            original(module)
            patch(module)

        spec.loader = _Loader(loader, exec_module)
        return spec


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, exec_module):
        self._loader = loader
        self.exec_module = exec_module

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def __getattr__(self, name):
        return getattr(self._loader, name)


def install():
    """Patches the launcher modules already imported and every one imported later."""
    with _lock:
        for name in MODULES:
            if name in sys.modules:
                patch(sys.modules[name])
        if not _finder:
            _finder.append(_Finder())
            sys.meta_path.insert(0, _finder[0])
        if not any(name in sys.modules for name in MODULES):
            _say("loaded: Lightning's ddp_notebook, ddp_fork and ddp_spawn (and auto with several "
                 "devices) will run on ranks that spawnpoint-agent spawns once Lightning is "
                 "imported (said then)")


def unload():
    """Puts Lightning's own launcher methods back and stops patching new imports."""
    with _lock:
        if _finder:
            if _finder[0] in sys.meta_path:
                sys.meta_path.remove(_finder[0])
            _finder.clear()
        for name, originals in list(_patched.items()):
            cls = getattr(sys.modules.get(name), _CLASS, None)
            if cls is not None:
                for attribute, original in originals.items():
                    if original is None:
                        delattr(cls, attribute)
                    else:
                        setattr(cls, attribute, original)
            del _patched[name]
        _said.clear()
        sys.stderr.write("[spawnpoint] notebook: unloaded: Lightning's own launcher is back\n")


install()
