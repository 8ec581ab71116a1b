"""Post-import hook for Lightning's accelerator connector: the agent's ranks are the DDP processes.

`patch(module)` is called by the bootstrap (sitecustomize.py) right after
`lightning.pytorch.trainer.connectors.accelerator_connector` (or the same module of the
standalone `pytorch_lightning` package) is first executed; call it only from there. It never
imports Lightning itself.

What Lightning does (checked in lightning 2.6.6, lightning/pytorch/trainer/connectors/
accelerator_connector.py and strategies/ddp.py): `Trainer(strategy=S)` resolves S in
`_AcceleratorConnector.__init__`; `auto` becomes "ddp" for several devices ("ddp_fork" in an
interactive session); `_check_strategy_and_fallback()` settles the name and `_init_strategy()`
builds it from the registry. The registry's DDP names carry a start method: ddp* "popen",
ddp_spawn* "spawn", ddp_fork* and ddp_notebook* "fork". Only "popen" asks the cluster
environment: `_SubprocessScriptLauncher.launch` starts no children when
`cluster_environment.creates_processes_externally`, which TorchElasticEnvironment (chosen when
TORCHELASTIC_RUN_ID is set, as the agent does for every rank) says. "spawn" and "fork" always
start `devices` processes of their own (`_MultiProcessingLauncher`), a second set of ranks
under each of the agent's ranks, forked for ddp_fork/ddp_notebook.

So, in an agent rank only (SPAWNPOINT_SHIM=1 and RANK, WORLD_SIZE, LOCAL_WORLD_SIZE and
TORCHELASTIC_RUN_ID set), the hook wraps `_check_strategy_and_fallback` to
  - map a spawning or forking DDP strategy name to its external-launch form (ddp_spawn ->
    ddp, ddp_fork_find_unused_parameters_true -> ddp_find_unused_parameters_true, ...), and a
    DDPStrategy object with such a start method to start method "popen" (an object whose
    class's name starts with "DDP", or any instance of Lightning's DDPStrategy with such a
    start method);
  - give such an object whose class overrides DDPStrategy's `_configure_launcher` (a library
    that makes its own _MultiProcessingLauncher subclass there, as RF-DETR does for
    "ddp_notebook", and may refuse "popen") DDPStrategy's own `_configure_launcher`, bound to
    the instance: the connector's _lazy_init_strategy calls it after the hook, and with
    "popen" it makes the _SubprocessScriptLauncher that launches nothing;
  - check `devices` x `num_nodes` against the job: devices must equal the job's ranks per
    node (LOCAL_WORLD_SIZE) and num_nodes its nodes (NNODES); otherwise a ValueError naming
    the values and the trainer's line that made the Trainer, at Trainer creation;
  - say what it did, one line per job (rank 0 only) on stderr:
    "Lightning strategy ddp_notebook: the agent's 2 ranks run it (as ddp); nothing is
    forked", or for an object of such a class "Lightning strategy Lib(start_method='spawn'):
    the agent's 2 ranks run it as DDPStrategy(start_method='popen') with DDPStrategy's own
    launcher (its _configure_launcher is not used); nothing is spawned".
Anything else (other strategies, single device) is left to Lightning.

A new Lightning may rename the private names this relies on (_private.py lists them: the
connector, its _check_strategy_and_fallback and _strategy_flag, DDPStrategy's _start_method,
the launcher's use of torch.multiprocessing.start_processes). Then the mapping is off, said
once, and what is safe is kept: strategy 'ddp' runs as it is (it launches nothing under
TORCHELASTIC_RUN_ID), and torch.multiprocessing.start_processes, where Lightning's launcher
starts the processes of ddp_spawn, ddp_fork and ddp_notebook, ends the rank with one line
instead (refuse_own_processes): a second set of ranks under each of the agent's would take the
same RANK, port and devices, and hang or fail in words that do not say why. Without
_parallel_devices or _num_nodes_flag only the devices check is off; without _choose_strategy
only the "auto (...)" of the line. Without DDPStrategy._configure_launcher (looked up only for
an object of a class that overrides it) such an object is left as it is, said once, and its
launcher's processes are refused as above.
"""

import functools
import os
import sys
import traceback
import types

from . import _private
from ._report import fatal, report_once

_MARK = "_spawnpoint_lightning"
_MODULE = "lightning.pytorch.trainer.connectors.accelerator_connector"
_CONNECTOR = _MODULE + ":_AcceleratorConnector()"  # _private's spelling for either package
_DDP = "lightning.pytorch.strategies.ddp:DDPStrategy()"
_DDP_MODULE = "lightning.pytorch.strategies.ddp"
_LAUNCHING = ("spawn", "fork", "forkserver")  # start methods whose launcher starts processes
_FORMS = (("ddp_spawn", "ddp", "spawned"), ("ddp_fork", "ddp", "forked"),
          ("ddp_notebook", "ddp", "forked"))


def agent_rank(environ=None):
    """True in a rank the agent started (the hook's only scope)."""
    env = os.environ if environ is None else environ
    return (env.get("SPAWNPOINT_SHIM") == "1" and "TORCHELASTIC_RUN_ID" in env
            and all(env.get(name, "").isdigit() for name in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")))


def external_form(name):
    """(external-launch name, what Lightning would have done) for a DDP strategy name that
    spawns or forks; (name, None) for any other name."""
    for prefix, target, verb in _FORMS:
        if name == prefix or name.startswith(prefix + "_find_unused_parameters_"):
            return target + name[len(prefix):], verb
    return name, None


def mapping_line(requested, used, verb, ranks, launcher=None):
    """The one line per job: requested is what the Trainer was given ('auto (ddp)' for auto);
    launcher: the name of the class whose own _configure_launcher the strategy object was
    given instead of its class's (then `used` names that class too)."""
    if launcher is not None:
        return ("Lightning strategy %s: the agent's %d ranks run it as %s with %s's own "
                "launcher (its _configure_launcher is not used); nothing is %s"
                % (requested, ranks, used, launcher, verb))
    if verb is None:
        return ("Lightning strategy %s: the agent's %d ranks run it; Lightning launches nothing"
                % (requested, ranks))
    return ("Lightning strategy %s: the agent's %d ranks run it (as %s); nothing is %s"
            % (requested, ranks, used, verb))


def _ddp_module(package=None):
    """Lightning's strategies.ddp module (of `package`, None: lightning.pytorch) if imported."""
    return sys.modules.get(_private.in_package(_DDP_MODULE, package))


def ddp_strategy_class(package=None):
    """Lightning's DDPStrategy (of `package`, None: lightning.pytorch) if its module is imported
    (it is wherever a DDPStrategy object exists), else None. Imports nothing."""
    cls = getattr(_ddp_module(package), "DDPStrategy", None)
    return cls if isinstance(cls, type) else None


def overrides_launcher(strategy, base):
    """Whether `strategy`'s class makes its launcher itself: its _configure_launcher is not
    `base`'s (Lightning's DDPStrategy)."""
    return (getattr(type(strategy), "_configure_launcher", None)
            is not getattr(base, "_configure_launcher", None))


def _trainer_line():
    """'file:line' of the frame that made the Trainer: the first one outside Lightning, this
    package and the standard library's import machinery."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = frame.filename.replace("\\", "/")
        if ("/lightning/" in path or "/pytorch_lightning/" in path or "/spawnpoint_rank/" in path
                or "/lightning_utilities/" in path or path.startswith("<frozen")):
            continue
        return "%s:%d" % (frame.filename, frame.lineno)
    return "?"


def check_devices(devices, num_nodes, environ):
    """None, or the message of the error for devices x num_nodes against the job."""
    local = int(environ["LOCAL_WORLD_SIZE"])
    nodes = int(environ.get("NNODES") or (int(environ["WORLD_SIZE"]) // max(local, 1)))
    if devices == local and num_nodes == nodes:
        return None
    return ("spawnpoint: Trainer(devices=%d, num_nodes=%d) contradicts the job, which runs %d "
            "ranks per node on %d node(s) (LOCAL_WORLD_SIZE=%d, NNODES=%d, WORLD_SIZE=%s): "
            "the agent's ranks are Lightning's DDP processes; say devices=%d, num_nodes=%d "
            "(or change the job's procsPerNode/gpusPerNode and nodes)"
            % (devices, num_nodes, local, nodes, local, nodes, environ["WORLD_SIZE"], local,
               nodes))


def _wrap_choose(original):
    def _choose_strategy(self):
        chosen = original(self)
        self._spawnpoint_auto = chosen
        return chosen

    _choose_strategy._spawnpoint_lightning = True
    return _choose_strategy


def _wrap_check(original, module, package):
    def _check_strategy_and_fallback(self):
        original(self)
        if _private.missing("lightning", {_MODULE: module, _CONNECTOR: self}, package):
            refuse_own_processes()  # said: strategy 'ddp' still runs as it is
            return
        flag = self._strategy_flag
        env = os.environ
        if isinstance(flag, str):
            if not flag.startswith("ddp"):
                return  # not a DDP strategy: Lightning's own business
            used, verb = external_form(flag)
            self._strategy_flag = used
            requested = flag
            launcher = None
        else:
            base = ddp_strategy_class(package)
            subclass = base is not None and isinstance(flag, base)
            if not type(flag).__name__.startswith("DDP") and not (
                    subclass and getattr(flag, "_start_method", None) in _LAUNCHING):
                return  # not a DDP strategy, or one that launches nothing: Lightning's business
            if _private.missing("lightning", {_MODULE: module, _DDP: flag}, package):
                refuse_own_processes()
                return
            start = flag._start_method
            own = subclass and start in _LAUNCHING and overrides_launcher(flag, base)
            if own:
                # Its class makes its own launcher from the start method, and "popen" may be
                # refused there: DDPStrategy's own makes the launcher that launches nothing.
                if _private.missing("lightning_launcher", {_DDP_MODULE: _ddp_module(package)},
                                    package):
                    refuse_own_processes()  # said: the object stays as it is
                    return
                flag._configure_launcher = types.MethodType(base._configure_launcher, flag)
            verb = None
            if start in _LAUNCHING:
                flag._start_method = "popen"
                verb = "forked" if start == "fork" else "spawned"
            requested = "%s(start_method=%r)" % (type(flag).__name__, start)
            used = "%s(start_method='popen')" % (base if own else type(flag)).__name__
            launcher = base.__name__ if own else None
        auto = self.__dict__.get("_spawnpoint_auto")  # set only when the Trainer said auto
        if isinstance(auto, str) and auto == requested:
            requested = "auto (%s)" % auto
        if not _private.missing("lightning_devices", {_MODULE: module, _CONNECTOR: self},
                                package):
            devices = len(self._parallel_devices or [])
            num_nodes = int(self._num_nodes_flag or 1)
            error = check_devices(devices, num_nodes, env)
            if error is not None:
                raise ValueError("%s (at %s)" % (error, _trainer_line()))
        if env.get("RANK") == "0":
            sys.stderr.write("spawnpoint-shim: %s\n" % mapping_line(
                requested, used, verb, int(env["WORLD_SIZE"]), launcher))
            sys.stderr.flush()

    _check_strategy_and_fallback._spawnpoint_lightning = True
    return _check_strategy_and_fallback


def patch(module):
    if not agent_rank():
        return
    package = "pytorch_lightning" if module.__name__.startswith("pytorch_lightning") else None
    scope = {_MODULE: module}
    if _private.missing("lightning", scope, package):
        refuse_own_processes()  # said: strategy 'ddp' still runs as it is
        return
    connector = module._AcceleratorConnector
    wraps = [("_check_strategy_and_fallback", lambda f: _wrap_check(f, module, package))]
    if not _private.missing("lightning_auto", scope, package):
        wraps.append(("_choose_strategy", _wrap_choose))
    for name, wrap in wraps:
        original = getattr(connector, name)
        if not getattr(original, _MARK, False):
            setattr(connector, name, wrap(original))


# ------------------------------------------------------------------------------------------
# When the hook is off: Lightning's own processes are refused where they would start.

REFUSAL = (
    "Lightning is about to start %s processes of its own (start method %r) under this rank of "
    "the agent, which already runs the job's ranks: the agent could not run Lightning's "
    "strategy on its ranks (the line above says which of Lightning's names it lacks), and "
    "those processes would take the same RANK, port and devices. Use Trainer(strategy='ddp'), "
    "which runs on the agent's ranks as it is")
_LIGHTNING_MODULES = ("lightning.pytorch.", "pytorch_lightning.")
_refusing = []  # [True] once the guard is in place in this process


def called_from_lightning(frames=None):
    """Whether one of `frames` (the caller's stack by default) runs code of Lightning's
    Trainer (lightning.pytorch or pytorch_lightning)."""
    if frames is None:
        frames = (frame for frame, _ in traceback.walk_stack(None))
    return any(str(frame.f_globals.get("__name__", "")).startswith(_LIGHTNING_MODULES)
               for frame in frames)


def refusing(start_processes):
    """torch.multiprocessing.start_processes, ending the rank with one line (REFUSAL) when
    Lightning calls it: its launcher for ddp_spawn, ddp_fork and ddp_notebook starts its
    processes there (lightning 2.6's _MultiProcessingLauncher.launch; 1.x's mp.spawn calls
    it too)."""
    @functools.wraps(start_processes)
    def guarded(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn", **kwargs):
        if called_from_lightning():
            fatal(REFUSAL % (nprocs, start_method))
        return start_processes(fn, args, nprocs, join, daemon, start_method, **kwargs)

    guarded._spawnpoint_lightning = True
    return guarded


def refuse_own_processes():
    """Once per process: torch.multiprocessing.start_processes refuses Lightning's calls.
    Without it nothing would stop a spawning or forking strategy from starting a second set
    of ranks under each of the agent's (said once, then)."""
    if _refusing:
        return
    _refusing.append(True)
    try:
        import importlib

        mp = importlib.import_module("torch.multiprocessing")
    except Exception:
        mp = None
    original = getattr(mp, "start_processes", None)
    if original is None:
        report_once("Lightning's own processes cannot be refused either: this torch has no "
                    "torch.multiprocessing.start_processes; a strategy that spawns or forks "
                    "(ddp_spawn, ddp_fork, ddp_notebook) starts a second set of ranks under "
                    "each of the agent's. Use Trainer(strategy='ddp')")
        return
    if getattr(original, _MARK, False):
        return
    guarded = refusing(original)
    mp.start_processes = guarded
    spawn_module = sys.modules.get("torch.multiprocessing.spawn")
    if spawn_module is not None and getattr(spawn_module, "start_processes", None) is original:
        spawn_module.start_processes = guarded  # torch.multiprocessing.spawn() calls it there
