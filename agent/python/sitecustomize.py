"""spawnpoint's start-up shim for Python trainers.

The agent prepends this file's directory to PYTHONPATH of every rank whose command is a
Python interpreter and sets SPAWNPOINT_SHIM=1. Python imports `sitecustomize` during
start-up, before the trainer's own code runs, so this module is where spawnpoint makes
PyTorch's data loading fork-free without the trainer changing a line.

What it does (only when SPAWNPOINT_SHIM=1; otherwise it only chains, see below):

* Start method. `spawn` becomes multiprocessing's *default* start method, exactly as
  CPython itself does on macOS: the default context's underlying context is replaced, but
  no start method is "set". Consequences, all deliberate:
    - code that never chooses gets spawn (multiprocessing.Process, Pool, Queue,
      torch.multiprocessing, concurrent.futures.ProcessPoolExecutor, DataLoader);
    - `multiprocessing.set_start_method('spawn')` in the trainer keeps working (a forced
      global `set_start_method` at start-up would make it raise "context has already been
      set", which would break the many DDP scripts that call it); asking again for the
      method already in effect is a no-op instead of that RuntimeError;
    - an explicit `set_start_method('fork')` is honoured, with a RuntimeWarning that says
      why fork is unsafe with GPU (CUDA/HIP) contexts and OpenMP thread pools.
  multiprocessing is not imported for this: the default is switched by a post-import hook
  right after `multiprocessing.context` is first imported, so it is in place before torch
  (or anything else) can use it.

* DataLoader. Right after `torch.utils.data.dataloader` is first imported (torch is never
  imported by this module), `DataLoader.__init__` is wrapped. The wrapper binds the call
  against the original signature, so positional arguments count the same as keywords
  (`DataLoader(ds, 32, True, None, None, 4)` has num_workers=4, chosen by the code).
    - num_workers: when it is 0 (left at the default, or 0 passed) and the job asks for
      workers (SPAWNPOINT_LOADER_WORKERS > 0, or "auto" = min(SPAWNPOINT_LOADER_CPUS, 8)),
      it becomes the job's count. Never for an IterableDataset (every worker would replay
      the whole stream unless the dataset shards itself by worker) and never inside a
      daemonic process such as a loader worker (it may not have children).
    - With workers > 0 (the code's or the job's):
        multiprocessing_context='spawn'  unless the code passed one (not None);
        persistent_workers=True          unless the code passed it, or the job has
                                         SPAWNPOINT_LOADER_PERSISTENT_WORKERS=0;
        prefetch_factor=<job>            unless the code passed it (SPAWNPOINT_LOADER_PREFETCH_FACTOR);
        timeout=<job seconds>            unless the code passed it (SPAWNPOINT_LOADER_TIMEOUT_SECONDS).
      An explicit multiprocessing_context='fork' is honoured with the same warning as above.
    - pin_memory and everything else are left exactly as the code passed them
      (SPAWNPOINT_LOADER_PIN_MEMORY, _SEED and _START_METHOD are not used here: pinning
      needs the code's device handling, torch already seeds worker w with base_seed + w,
      and spawn is the only start method the job accepts).
    - persistent workers keep the dataset object they unpickled at the first epoch: a
      trainer that mutates its dataset in the main process between epochs (not its
      sampler: DistributedSampler.set_epoch is fine) must pass persistent_workers=False
      or run with the job's persistentWorkers: false.
    - spawned workers pickle the dataset, collate_fn and worker_init_fn, forked ones did
      not. If that pickling fails when the iterator starts: for a loader whose workers came
      from the job, a RuntimeWarning and the loader runs in the main process (as the code
      asked); for a loader whose workers the code asked for, a RuntimeError that explains
      the spawn requirement (chained to the pickling error).
  SPAWNPOINT_SHIM_DEBUG=1 prints one line per DataLoader to stderr saying what changed and
  what the code's own choice kept.

Chaining. Whether active or not (and after installing its hooks, so that whatever the
chained module imports is covered), this module runs the sitecustomize that Python
would have imported without it: the first one found on sys.path *after* this module's
directory (ignoring any entry that resolves to this directory), e.g. Debian's
/usr/lib/python3.X/sitecustomize.py or one the user put on PYTHONPATH. It is executed under
the name `sitecustomize` once per process; errors in it are reported like site.py reports
them and do not disable the shim. A second copy of this shim later on the path chains
onwards in turn and does not install its hooks twice.

Cost. Every Python process with this environment runs this module, including spawned
loader workers and multiprocessing helper processes. It imports only importlib.machinery
and does no work until a hooked module is imported: about 0.4 ms of start-up with its
bytecode cached (about 3 ms when the directory is read-only and it is compiled each time),
plus whatever the chained sitecustomize costs. Inside a worker the hooks are as harmless as
in the trainer: the worker never gets job workers of its own (daemonic), and a forced
set_start_method('spawn') from multiprocessing's own child bootstrap passes through.

Environment contract (set by the agent for Python ranks):
  PYTHONPATH                           this directory first, the rank's own PYTHONPATH after
  SPAWNPOINT_SHIM=1                    activates the shim (anything else: chain only)
  SPAWNPOINT_LOADER_WORKERS            integer >= 0 or "auto"; unset or 0: no workers added
  SPAWNPOINT_LOADER_CPUS               CPUs of the rank, for "auto" (default: the affinity mask)
  SPAWNPOINT_LOADER_PERSISTENT_WORKERS 1 (default) / 0
  SPAWNPOINT_LOADER_PREFETCH_FACTOR    integer >= 1; unset: torch's default
  SPAWNPOINT_LOADER_TIMEOUT_SECONDS    seconds > 0; unset or 0: no timeout
  SPAWNPOINT_SHIM_DEBUG=1              one stderr line per DataLoader
Invalid values are reported once on stderr and ignored; the trainer never fails because of them.
"""

import os
import sys

_SHIM_DIR = os.path.dirname(os.path.realpath(__file__))
_AUTO_WORKERS_CAP = 8

shim_active = False          # the hooks of this copy are installed
chained_sitecustomize = None  # the module this one chained to, if any

_FORK_WARNING = (
    "spawnpoint: the 'fork' start method was chosen explicitly and is honoured, but a "
    "forked child of a process that has initialised CUDA/ROCm crashes ('Cannot "
    "re-initialize CUDA in forked subprocess') or hangs, and OpenMP thread pools do not "
    "survive fork either. spawnpoint's default here is 'spawn'; drop the explicit 'fork' "
    "to use it."
)


def _warn(message, stacklevel):
    """A RuntimeWarning attributed to the trainer's line, stacklevel frames above the caller."""
    import warnings

    warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 2)


_reported = set()


def _report_once(message):
    """A start-up level problem (bad environment value): one stderr line per process."""
    if message not in _reported:
        _reported.add(message)
        sys.stderr.write("spawnpoint-shim: %s\n" % message)
        sys.stderr.flush()


# --------------------------------------------------------------------------------------
# Post-import hooks: run a callback right after a module has been executed for the first
# time, without importing it ahead of time.


class _HookLoader(object):
    """Wraps a module's real loader for one exec_module call, then steps aside."""

    def __init__(self, loader, callback):
        self._loader = loader
        self._callback = callback

    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        # Leave no trace: the module sees its real loader, as without the shim.
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._loader
        self._loader.exec_module(module)
        _run_hook(self._callback, module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


def _run_hook(callback, module):
    try:
        callback(module)
    except Exception as err:  # never break the trainer's import
        _report_once("could not patch %s (%s: %s); continuing without that part"
                     % (getattr(module, "__name__", "?"), type(err).__name__, err))


class _PostImportFinder(object):
    _spawnpoint_shim = True  # marker: another copy of the shim already installed hooks

    def __init__(self, hooks):
        self._hooks = hooks
        self._busy = set()

    def find_spec(self, fullname, path=None, target=None):
        callback = self._hooks.get(fullname)
        if callback is None or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = None
            for finder in list(sys.meta_path):
                if finder is self:
                    continue
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _HookLoader(spec.loader, callback)
        return spec


# --------------------------------------------------------------------------------------
# multiprocessing: spawn by default.


def _patch_multiprocessing(ctxmod):
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
            _warn(_FORK_WARNING, 1)
        actual = getattr(default, "_actual_context", None)
        if (not force and method is not None and actual is not None
                and getattr(actual, "_name", None) == method):
            return None  # already in effect: no "context has already been set" error
        return original(method, force=force)

    set_start_method.__doc__ = original.__doc__
    # An instance attribute: multiprocessing/__init__ exports the bound methods of the
    # default context after this hook ran, so multiprocessing.set_start_method (and
    # torch.multiprocessing's re-export) is this function.
    default.set_start_method = set_start_method
    default._spawnpoint_patched = True


# --------------------------------------------------------------------------------------
# DataLoader defaults from the job.


def _env(name):
    value = os.environ.get(name)
    if value is None:
        return None
    value = value.strip()
    return value or None


def _cpu_count():
    cpus = _env("SPAWNPOINT_LOADER_CPUS")
    if cpus is not None:
        try:
            n = int(cpus)
            if n > 0:
                return n
        except ValueError:
            pass
        _report_once("ignoring SPAWNPOINT_LOADER_CPUS=%r: not a positive integer" % cpus)
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _job_workers():
    """The number of workers the job asks for, or 0."""
    value = _env("SPAWNPOINT_LOADER_WORKERS")
    if value is None:
        return 0
    if value.lower() == "auto":
        return max(1, min(_cpu_count(), _AUTO_WORKERS_CAP))
    try:
        n = int(value)
        if n >= 0:
            return n
    except ValueError:
        pass
    _report_once("ignoring SPAWNPOINT_LOADER_WORKERS=%r: not an integer >= 0 or auto" % value)
    return 0


def _job_persistent():
    value = _env("SPAWNPOINT_LOADER_PERSISTENT_WORKERS")
    if value is None:
        return True
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    _report_once("ignoring SPAWNPOINT_LOADER_PERSISTENT_WORKERS=%r: not 0 or 1" % value)
    return True


def _job_number(name, convert, minimum, exclusive):
    value = _env(name)
    if value is None:
        return None
    try:
        n = convert(value)
        if n > minimum or (not exclusive and n == minimum):
            return n
    except ValueError:
        pass
    _report_once("ignoring %s=%r: not a number %s %s"
                 % (name, value, ">" if exclusive else ">=", minimum))
    return None


def _in_daemon_process():
    mp = sys.modules.get("multiprocessing")
    try:
        return mp is not None and bool(mp.current_process().daemon)
    except Exception:
        return False


def _start_method_name(context):
    if isinstance(context, str):
        return context
    return getattr(context, "_name", None)


def _adjust_loader_arguments(arguments, parameters, iterable_base):
    """Applies the job's defaults to the bound DataLoader arguments the code left open.

    Returns (changes, kept, info) for the debug line and the iterator fallback."""
    changes, kept = [], []
    info = {"workers_from_job": 0, "spawn_from_shim": False}

    def default(name):
        return parameters[name].default

    def explicit(name):
        return name in arguments

    workers = arguments.get("num_workers", default("num_workers"))
    if isinstance(workers, int) and workers == 0:
        job = _job_workers()
        dataset = arguments.get("dataset")
        if job <= 0:
            pass
        elif iterable_base is not None and isinstance(dataset, iterable_base):
            kept.append("num_workers=0 (IterableDataset: the job's %d workers would each "
                        "replay the stream)" % job)
        elif _in_daemon_process():
            kept.append("num_workers=0 (daemonic process: no children allowed)")
        else:
            arguments["num_workers"] = job
            changes.append("num_workers=0->%d (job)" % job)
            info["workers_from_job"] = job
            workers = job
    elif explicit("num_workers"):
        kept.append("num_workers=%r" % (workers,))

    if not isinstance(workers, int) or workers <= 0:
        return changes, kept, info

    if "multiprocessing_context" in parameters:
        context = arguments.get("multiprocessing_context")
        if context is None:
            arguments["multiprocessing_context"] = "spawn"
            changes.append("multiprocessing_context='spawn'")
            info["spawn_from_shim"] = True
        else:
            name = _start_method_name(context)
            kept.append("multiprocessing_context=%r" % (name or context,))
            if name == "fork":
                _warn(_FORK_WARNING, 2)

    if "persistent_workers" in parameters:
        if explicit("persistent_workers"):
            kept.append("persistent_workers=%r" % (arguments["persistent_workers"],))
        elif _job_persistent():
            arguments["persistent_workers"] = True
            changes.append("persistent_workers=True")

    if "prefetch_factor" in parameters:
        if explicit("prefetch_factor"):
            kept.append("prefetch_factor=%r" % (arguments["prefetch_factor"],))
        else:
            n = _job_number("SPAWNPOINT_LOADER_PREFETCH_FACTOR", int, 1, False)
            if n is not None:
                arguments["prefetch_factor"] = n
                changes.append("prefetch_factor=%d (job)" % n)

    if "timeout" in parameters:
        if explicit("timeout"):
            kept.append("timeout=%r" % (arguments["timeout"],))
        else:
            t = _job_number("SPAWNPOINT_LOADER_TIMEOUT_SECONDS", float, 0, True)
            if t is not None:
                arguments["timeout"] = t
                changes.append("timeout=%gs (job)" % t)
    return changes, kept, info


def _is_pickling_error(err):
    import pickle

    if isinstance(err, pickle.PicklingError):
        return True
    return isinstance(err, (AttributeError, TypeError)) and "pickle" in str(err).lower()


def _patch_dataloader(dlmod):
    cls = getattr(dlmod, "DataLoader", None)
    if cls is None or getattr(cls.__init__, "_spawnpoint_shim", False):
        return
    import functools
    import inspect

    original_init = cls.__init__
    signature = inspect.signature(original_init)
    parameters = signature.parameters
    if "num_workers" not in parameters:
        return
    iterable_base = getattr(dlmod, "IterableDataset", None)

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:  # a wrong call: let torch report it in its own words
            return original_init(self, *args, **kwargs)
        changes, kept, info = _adjust_loader_arguments(bound.arguments, parameters, iterable_base)
        original_init(*bound.args, **bound.kwargs)
        self.__dict__["_spawnpoint_shim"] = info
        if os.environ.get("SPAWNPOINT_SHIM_DEBUG") == "1":
            dataset = bound.arguments.get("dataset")
            sys.stderr.write("spawnpoint-shim: DataLoader(%s) in pid %d: %s%s\n" % (
                type(dataset).__name__, os.getpid(),
                "set " + ", ".join(changes) if changes else "unchanged",
                "; kept: " + ", ".join(kept) if kept else ""))
            sys.stderr.flush()

    __init__._spawnpoint_shim = True
    cls.__init__ = __init__

    original_get_iterator = getattr(cls, "_get_iterator", None)
    if original_get_iterator is None:
        return

    @functools.wraps(original_get_iterator)
    def _get_iterator(self):
        try:
            return original_get_iterator(self)
        except Exception as err:
            info = self.__dict__.get("_spawnpoint_shim")
            if (not info or not info["spawn_from_shim"] or not self.num_workers
                    or not _is_pickling_error(err)):
                raise
            if info["workers_from_job"]:
                _warn("spawnpoint: the job asked for %d DataLoader workers, but spawned "
                      "workers need the dataset, collate_fn and worker_init_fn to be "
                      "picklable and they are not (%s: %s); this loader runs in the main "
                      "process as the code asked. Define them at module level (no lambdas "
                      "or local functions) to get workers."
                      % (info["workers_from_job"], type(err).__name__, err), 2)
                info["workers_from_job"] = 0
                info["spawn_from_shim"] = False
                self.num_workers = 0
                self.timeout = 0
                return original_get_iterator(self)
            raise RuntimeError(
                "spawnpoint starts DataLoader workers with 'spawn' (a forked worker of a "
                "process with a GPU context crashes or hangs), which pickles the dataset, "
                "collate_fn and worker_init_fn; one of them cannot be pickled (%s: %s). "
                "Define them at module level (no lambdas or local functions), or pass "
                "multiprocessing_context='fork' explicitly to accept fork's risks."
                % (type(err).__name__, err)) from err

    _get_iterator._spawnpoint_shim = True
    cls._get_iterator = _get_iterator


# --------------------------------------------------------------------------------------
# Start-up.

_HOOKS = {
    "multiprocessing.context": _patch_multiprocessing,
    "torch.utils.data.dataloader": _patch_dataloader,
}


def _install():
    global shim_active
    if any(getattr(f, "_spawnpoint_shim", False) for f in sys.meta_path):
        return  # another copy of the shim (earlier on sys.path) is already in charge
    sys.meta_path.insert(0, _PostImportFinder(_HOOKS))
    shim_active = True
    for name, callback in _HOOKS.items():
        module = sys.modules.get(name)
        if module is not None:  # imported before us (e.g. by python -X importtime tools)
            _run_hook(callback, module)


def _is_own_dir(entry):
    if not isinstance(entry, str):
        return False
    try:
        return os.path.realpath(entry or os.curdir) == _SHIM_DIR
    except (OSError, ValueError):
        return False


def _chain():
    """Runs the sitecustomize that would have been imported without this one."""
    global chained_sitecustomize
    import importlib.machinery

    path = list(sys.path)
    for index, entry in enumerate(path):
        if _is_own_dir(entry):
            path = path[index + 1:]  # only what comes after us: a later copy never loops back
            break
    path = [entry for entry in path if isinstance(entry, str) and not _is_own_dir(entry)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    origin = getattr(spec, "origin", None)
    if origin and os.path.realpath(origin) == os.path.realpath(__file__):
        return
    try:
        from importlib._bootstrap import module_from_spec
    except ImportError:
        from importlib.util import module_from_spec
    ours = sys.modules.get("sitecustomize")
    try:
        module = module_from_spec(spec)
        sys.modules["sitecustomize"] = module  # it runs under its own name, as site.py would
        try:
            spec.loader.exec_module(module)
        finally:
            if ours is not None:
                sys.modules["sitecustomize"] = ours
        chained_sitecustomize = module
    except ImportError as exc:
        if exc.name != "sitecustomize":
            _report_chain_error(exc)
    except Exception as exc:
        _report_chain_error(exc)


def _report_chain_error(err):
    # The words site.py uses for a failing sitecustomize.
    if sys.flags.verbose:
        sys.excepthook(*sys.exc_info())
    else:
        sys.stderr.write("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                         "%s: %s\n" % (err.__class__.__name__, err))


if os.environ.get("SPAWNPOINT_SHIM") == "1":
    # Before chaining, so that whatever the chained sitecustomize imports is covered too.
    try:
        _install()
    except Exception as _err:
        _report_once("disabled (%s: %s)" % (type(_err).__name__, _err))
_chain()
