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
    DDPStrategy object with such a start method to start method "popen";
  - check `devices` x `num_nodes` against the job: devices must equal the job's ranks per
    node (LOCAL_WORLD_SIZE) and num_nodes its nodes (NNODES); otherwise a ValueError naming
    the values and the trainer's line that made the Trainer, at Trainer creation;
  - say what it did, one line per job (rank 0 only) on stderr:
    "Lightning strategy ddp_notebook: the agent's 2 ranks run it; nothing is forked".
Anything else (other strategies, single device) is left to Lightning.
"""

import os
import sys
import traceback

_MARK = "_spawnpoint_lightning"
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


def mapping_line(requested, used, verb, ranks):
    """The one line per job: requested is what the Trainer was given ('auto (ddp)' for auto)."""
    if verb is None:
        return ("Lightning strategy %s: the agent's %d ranks run it; Lightning launches nothing"
                % (requested, ranks))
    return ("Lightning strategy %s: the agent's %d ranks run it (as %s); nothing is %s"
            % (requested, ranks, used, verb))


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


def _wrap_check(original):
    def _check_strategy_and_fallback(self):
        original(self)
        flag = self._strategy_flag
        env = os.environ
        if isinstance(flag, str):
            if not flag.startswith("ddp"):
                return  # not a DDP strategy: Lightning's own business
            used, verb = external_form(flag)
            self._strategy_flag = used
            requested = flag
        else:
            start = getattr(flag, "_start_method", None)
            if start is None or not type(flag).__name__.startswith("DDP"):
                return
            verb = None
            if start in ("spawn", "fork", "forkserver"):
                flag._start_method = "popen"
                verb = "forked" if start == "fork" else "spawned"
            requested = "%s(start_method=%r)" % (type(flag).__name__, start)
            used = "%s(start_method='popen')" % type(flag).__name__
        auto = self.__dict__.get("_spawnpoint_auto")  # set only when the Trainer said auto
        if isinstance(auto, str) and auto == requested:
            requested = "auto (%s)" % auto
        devices = len(getattr(self, "_parallel_devices", None) or [])
        num_nodes = int(getattr(self, "_num_nodes_flag", 1) or 1)
        error = check_devices(devices, num_nodes, env)
        if error is not None:
            raise ValueError("%s (at %s)" % (error, _trainer_line()))
        if env.get("RANK") == "0":
            sys.stderr.write("spawnpoint-shim: %s\n" % mapping_line(
                requested, used, verb, int(env["WORLD_SIZE"])))
            sys.stderr.flush()

    _check_strategy_and_fallback._spawnpoint_lightning = True
    return _check_strategy_and_fallback


def patch(module):
    if not agent_rank():
        return
    connector = getattr(module, "_AcceleratorConnector", None)
    if connector is None:
        raise AttributeError("no _AcceleratorConnector in %s" % module.__name__)
    for name, wrap in (("_choose_strategy", _wrap_choose),
                       ("_check_strategy_and_fallback", _wrap_check)):
        original = connector.__dict__.get(name)
        if original is None:
            raise AttributeError("no %s.%s in %s" % (connector.__name__, name, module.__name__))
        if not getattr(original, _MARK, False):
            setattr(connector, name, wrap(original))
