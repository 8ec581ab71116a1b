"""spawnpoint's start-up shim for Python trainers: the bootstrap of the rank side.

Python imports `sitecustomize` during start-up, before the trainer's own code runs. The
agent prepends this file's directory to PYTHONPATH of every rank whose command is a Python
interpreter and sets SPAWNPOINT_SHIM=1. This module then only (1) installs a meta-path finder
that runs a post-import hook right after each of these modules is first executed, importing
the hook from the package beside this file (spawnpoint_rank/) only then:
    multiprocessing.context      spawnpoint_rank._mp: spawn is the default start method
    torch.utils.data.dataloader  spawnpoint_rank._dataloader: the job's DataLoader defaults
    torch.distributed            spawnpoint_rank._distributed: USE_LIBUV=0 where torch lacks libuv;
                                 at exit, the process group's threads finish first (_exit);
                                 blocking collectives timed as waits for peers (_collective)
    lightning.pytorch.trainer.connectors.accelerator_connector (and pytorch_lightning's)
                                 spawnpoint_rank._lightning: Lightning's DDP strategies run
                                 on the agent's ranks (nothing spawned or forked)
    torch.optim.optimizer        spawnpoint_rank._optimizer: each optimizer step counts as a
                                 training step in the rank's progress record (_progress)
    torch.nn.parallel.distributed spawnpoint_rank._collective: DDP's gradient allreduce timed,
                                 so the agent can tell a straggler from those waiting for it
    torch.multiprocessing.spawn  spawnpoint_rank._mp_spawn: a script's own mp.spawn of its ranks
                                 runs each as one of the agent's ranks, on its rendezvous
and (2) chains to the sitecustomize Python would have imported without it. Nothing is imported
ahead of time (neither multiprocessing nor torch, nor the package). It also takes out of the
environment, so that processes the rank starts never see them:
    SPAWNPOINT_LOADER_SERVICE    the rank's loader service (the package gets loader_service)
    SPAWNPOINT_PROGRESS_FILE     the rank's progress record (the package gets progress_file,
                                 and progress_attach_ns: when the shim started)
    SPAWNPOINT_STACK_SIGNAL      a signal number and a file: faulthandler writes every Python
    SPAWNPOINT_STACK_FILE        thread's stack to the file (appending) on that signal
    SPAWNPOINT_FAILED_FILE       where the agent lists the pids it stops when the attempt
                                 fails: a rank listed there ends after its exit handlers (atexit,
                                 logging's flush, stdout and stderr flushed) by SIGTERM's default
                                 action, without the interpreter's finalization (module teardown,
                                 collectors, torch's native destructors: 0.3-0.7 s that the
                                 restart would wait for), as if it had no SIGTERM handler of its
                                 own (Lightning's) that let it run on
It reads, and leaves in place, the job's MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, NNODES and TORCHELASTIC_RUN_ID before the script can change them (the package
gets them as job_environment).
A hook that fails is reported once on stderr and the trainer's import goes on without it. A hook
that relies on a private name of torch, multiprocessing or Lightning that this version lacks
says once which feature is off and falls back (spawnpoint_rank/_private.py lists every such name
and the fallback of each). Without SPAWNPOINT_SHIM=1 it only chains.

Standby. With SPAWNPOINT_STANDBY_FD (a warm standby rank, spawnpoint_rank/_standby.py), the
process prepares a rank's imports and waits for the agent to release it into an attempt
before the chained sitecustomize and the trainer's script run; the variables above are taken
from the attempt's environment then, when it is in. What the hooks do, and the environment they read, is
described in spawnpoint_rank/ (env.py lists the variables).

Chaining. Whether active or not (and after installing the finder, so that whatever the
chained module imports is covered), this module runs the first sitecustomize found on sys.path
*after* this module's directory (ignoring any entry that resolves to this directory), e.g.
Debian's /usr/lib/python3.X/sitecustomize.py or one the user put on PYTHONPATH. It is executed
under the name `sitecustomize` once per process; errors in it are reported like site.py
reports them and do not disable the shim. A second copy of this shim later on the path chains
onwards in turn and does not install its hooks twice.

Cost. Every Python process with this environment runs this module, including spawned loader
workers and multiprocessing helper processes: about 0.4 ms of start-up with its bytecode
cached (the build ships it for its own python3, so PYTHONDONTWRITEBYTECODE costs nothing
there), plus whatever the chained sitecustomize costs; each hook's module is imported when its
target is. Module attributes for tests and tools: `shim_active` (this copy installed the
finder) and `chained_sitecustomize` (the module it chained to, or None).
"""

import os
import sys

_SHIM_DIR = os.path.dirname(os.path.realpath(__file__))
_PACKAGE = "spawnpoint_rank"
_HOOKS = {  # module -> "hook module:function", called with the module just executed
    "multiprocessing.context": "spawnpoint_rank._mp:patch",
    "torch.utils.data.dataloader": "spawnpoint_rank._dataloader:patch",
    "torch.distributed": "spawnpoint_rank._distributed:patch",
    "lightning.pytorch.trainer.connectors.accelerator_connector": "spawnpoint_rank._lightning:patch",
    "pytorch_lightning.trainer.connectors.accelerator_connector": "spawnpoint_rank._lightning:patch",
    "torch.optim.optimizer": "spawnpoint_rank._optimizer:patch",
    "torch.nn.parallel.distributed": "spawnpoint_rank._collective:patch_ddp",
    "torch.multiprocessing.spawn": "spawnpoint_rank._mp_spawn:patch",
}
_JOB_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                  "LOCAL_WORLD_SIZE", "NNODES", "TORCHELASTIC_RUN_ID")

shim_active = False          # the hooks of this copy are installed
chained_sitecustomize = None  # the module this one chained to, if any
# The agent's loader service for this rank (SPAWNPOINT_LOADER_SERVICE), taken out of the
# environment at start-up so that processes the rank starts never use it; the package gets
# it as spawnpoint_rank.loader_service.
loader_service = None
# This rank's progress record (SPAWNPOINT_PROGRESS_FILE), likewise taken out at start-up, and
# the CLOCK_MONOTONIC ns of that moment (the first step's duration is measured from it); the
# package gets them as progress_file and progress_attach_ns.
progress_file = None
progress_attach_ns = None
# The file faulthandler dumps the stacks into on SPAWNPOINT_STACK_SIGNAL (its fd stays open).
stack_fd = None
# Where the agent lists the pids it stops because the attempt failed (SPAWNPOINT_FAILED_FILE).
failed_file = None
# {name: value} of _JOB_VARIABLES as the agent set them (read at start-up, left in place).
job_environment = None


def _say(message):
    sys.stderr.write("spawnpoint-shim: %s\n" % message)
    sys.stderr.flush()


def _module_from_spec(spec):
    try:
        from importlib._bootstrap import module_from_spec
    except ImportError:
        from importlib.util import module_from_spec
    return module_from_spec(spec)


def _hook_function(target):
    """The function named by "module:function", from the package beside this file (even if
    sys.path no longer names this directory, or names another package of that name first)."""
    if _PACKAGE not in sys.modules:
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(_PACKAGE, [_SHIM_DIR])
        if spec is None or spec.loader is None:
            raise ImportError("no %s package in %s" % (_PACKAGE, _SHIM_DIR))
        package = _module_from_spec(spec)
        package.loader_service = loader_service
        package.progress_file = progress_file
        package.progress_attach_ns = progress_attach_ns
        package.job_environment = job_environment
        package.standby = "SPAWNPOINT_STANDBY_FD" in os.environ  # hooks: an attempt will come
        sys.modules[_PACKAGE] = package
        try:
            spec.loader.exec_module(package)
        except BaseException:
            del sys.modules[_PACKAGE]
            raise
    import importlib

    name, _, function = target.partition(":")
    return getattr(importlib.import_module(name), function)


def _run_hook(target, module):
    try:
        _hook_function(target)(module)
    except Exception as err:  # never break the trainer's import
        _say("could not patch %s (%s: %s); continuing without that part"
             % (getattr(module, "__name__", "?"), type(err).__name__, err))


class _HookLoader(object):
    """Wraps a module's real loader for one exec_module call, then steps aside."""

    def __init__(self, loader, target):
        self._loader = loader
        self._target = target

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
        _run_hook(self._target, module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _PostImportFinder(object):
    """Finds nothing itself: wraps the loader the other finders give a hooked module."""

    _spawnpoint_shim = True  # marker: another copy of the shim already installed hooks

    def __init__(self, hooks):
        self._hooks = hooks
        self._busy = set()

    def find_spec(self, fullname, path=None, target=None):
        hook = self._hooks.get(fullname)
        if hook is None or fullname in self._busy:
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
        spec.loader = _HookLoader(spec.loader, hook)
        return spec


def _install():
    global shim_active
    if any(getattr(f, "_spawnpoint_shim", False) for f in sys.meta_path):
        return  # another copy of the shim (earlier on sys.path) is already in charge
    import atexit

    atexit.register(_end_stopped_rank)  # the first registered: it runs last
    _take_environment()
    sys.meta_path.insert(0, _PostImportFinder(_HOOKS))
    shim_active = True
    for name, target in _HOOKS.items():
        module = sys.modules.get(name)
        if module is not None:  # imported before us (e.g. by python -X importtime tools)
            _run_hook(target, module)


def _take_environment():
    """Takes this attempt's per-rank variables out of the environment (the module
    docstring); in a released standby, again from the attempt's environment, and tells the
    package if it was imported meanwhile."""
    global loader_service, failed_file, job_environment
    loader_service = os.environ.pop("SPAWNPOINT_LOADER_SERVICE", None) or None
    failed_file = os.environ.pop("SPAWNPOINT_FAILED_FILE", None) or None
    job_environment = {name: os.environ[name] for name in _JOB_VARIABLES if name in os.environ}
    _take_progress_file()
    _register_stacks()
    package = sys.modules.get(_PACKAGE)
    if package is not None:
        package.loader_service = loader_service
        package.progress_file = progress_file
        package.progress_attach_ns = progress_attach_ns
        package.job_environment = job_environment
        package.standby = False
        for name in ("_pool", "_distributed"):
            module = sys.modules.get(_PACKAGE + "." + name)
            if module is not None:
                module.attempt_environment_taken()


def _end_stopped_rank():
    """The last exit handler: a rank the agent stopped because its attempt failed (its pid is
    in failed_file) ends here, by SIGTERM's default action, instead of finalizing the
    interpreter, which the restart would wait for."""
    try:
        with open(failed_file) as f:
            stopped = f.read().split()
    except (OSError, TypeError):  # the attempt has not failed, or no file was given
        return
    if str(os.getpid()) not in stopped:
        return
    try:
        logging = sys.modules.get("logging")
        if logging is not None:
            logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except Exception:
        pass
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    os.kill(os.getpid(), signal.SIGTERM)
    os._exit(128 + signal.SIGTERM)  # not reached: the signal ends the process first


def _standby():
    """A warm standby rank: prepare, wait to be released, then go on as the rank."""
    fd = int(os.environ.pop("SPAWNPOINT_STANDBY_FD"))
    _hook_function("spawnpoint_rank._standby:wait_for_release")(fd, _take_environment)


def _take_progress_file():
    global progress_file, progress_attach_ns
    path = os.environ.pop("SPAWNPOINT_PROGRESS_FILE", None)
    if path:
        import time

        progress_file, progress_attach_ns = path, time.monotonic_ns()


def _register_stacks():
    """Python stacks on request: faulthandler dumps every thread's on the agent's signal."""
    global stack_fd
    signum = os.environ.pop("SPAWNPOINT_STACK_SIGNAL", None)
    path = os.environ.pop("SPAWNPOINT_STACK_FILE", None)
    if not signum or not path:
        return
    try:
        import faulthandler

        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            faulthandler.register(int(signum), file=fd, all_threads=True, chain=False)
        except BaseException:
            os.close(fd)
            raise
        stack_fd = fd
    except (ValueError, OSError, RuntimeError) as err:
        _say("no Python stacks on request (SPAWNPOINT_STACK_SIGNAL=%s, SPAWNPOINT_STACK_FILE=%s):"
             " %s" % (signum, path, err))


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
    ours = sys.modules.get("sitecustomize")
    try:
        module = _module_from_spec(spec)
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
        _say("disabled (%s: %s)" % (type(_err).__name__, _err))
    if shim_active and os.environ.get("SPAWNPOINT_STANDBY_FD"):
        _standby()  # returns in the attempt's environment, or exits
_chain()
