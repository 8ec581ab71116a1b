"""Post-import hook for torch.multiprocessing.spawn: a script that spawns its own ranks runs
each of them as one of the agent's ranks instead.

The PyTorch DDP tutorial's multigpu.py, and much code written from it, starts its ranks
itself: `mp.spawn(main, args=(world_size, ...), nprocs=world_size)`, and each `main(rank, ...)`
sets MASTER_ADDR/MASTER_PORT to fixed values before `init_process_group(backend, rank=rank,
world_size=world_size)`. Under the agent each rank would start nprocs more processes of its
own, unsupervised, on that fixed port.

`patch(module)` is called by the bootstrap (sitecustomize.py) right after
torch/multiprocessing/spawn.py is executed, before torch.multiprocessing re-exports its
names; call it only from there. It replaces the module's `spawn` and `start_processes`. In an
agent rank (job_of(): the variables the agent started it with, which sitecustomize read
before the script ran), such a call runs as torch's unless a process group is initialised
already (helpers of a rank), a mapped call is running, this is a multiprocessing child, or
Lightning makes it (_lightning.py refuses those); otherwise:
  - nprocs equal to the job's ranks on this node (LOCAL_WORLD_SIZE): `fn(LOCAL_RANK, *args)`
    runs here, in the rank, and the call returns what torch's returns: None with join=True;
    with join=False (fn has run by then) a context whose join() returns True and pids() this
    process. An exception of fn is raised as torch's join() raises it: ProcessRaisedException
    with fn's traceback in its message and the original as its __context__ (join=False: at
    join()); KeyboardInterrupt and SystemExit go through as they are;
  - any other nprocs ends the rank (fatal: exit 1) with one line naming the call's file:line.
  Rank 0 says once per job which call it mapped.
While fn runs, before_init() (called by _rendezvous's init_process_group wrapper) puts back
the agent's MASTER_ADDR/MASTER_PORT where the script set others, for an env:// rendezvous
(rank 0 says so once), and ends the rank with one line naming the init_process_group call's
file:line when its rank=/world_size=, or RANK/WORLD_SIZE set by the script, contradict the
job: a script that spawns one node's ranks, run on several nodes.

No private name of torch is used. Imports _report only (and _distributed, _lightning when a
call comes). Not thread-safe: a mapped call is expected from the main thread, as torch's.
"""

import functools
import os
import sys
import traceback
from collections import namedtuple

from ._report import fatal

# What the agent started this rank with (sitecustomize's job_environment), parsed.
Job = namedtuple("Job", "rank local_rank world_size local_world_size nodes addr port")
Call = namedtuple("Call", "name fn nprocs where")  # a mapped spawn: "torch.multiprocessing.spawn"

_active = []  # [Call] while a mapped call's fn runs
_said = set()  # the lines rank 0 has said
_SKIP = ("/spawnpoint_rank/", "/torch/multiprocessing/", "/torch/distributed/")


def job_of(environ):
    """The job of an agent rank, from the variables it was started with; None without them."""
    if not environ or "TORCHELASTIC_RUN_ID" not in environ:
        return None
    try:
        rank, local_rank, world, local = (int(environ[name]) for name in (
            "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"))
        nodes = int(environ.get("NNODES") or world // max(local, 1))
    except (KeyError, ValueError):
        return None
    return Job(rank, local_rank, world, local, nodes, environ.get("MASTER_ADDR"),
               environ.get("MASTER_PORT"))


def caller():
    """'file:line' of the innermost frame outside this package and torch's own."""
    for frame in reversed(traceback.extract_stack()[:-1]):
        path = frame.filename.replace("\\", "/")
        if not any(part in path for part in _SKIP) and not path.startswith("<frozen"):
            return "%s:%d" % (os.path.basename(frame.filename), frame.lineno)
    return "?"


def describe(name, fn, nprocs):
    return "%s(%s, nprocs=%s)" % (name, getattr(fn, "__name__", type(fn).__name__), nprocs)


def nprocs_error(call, job):
    """None, or the message for a call whose nprocs is not the job's ranks on this node."""
    if call.nprocs == job.local_world_size:
        return None
    return ("%s at %s: the agent runs %d ranks on this node (LOCAL_WORLD_SIZE=%d), not %s, and "
            "each runs %s(LOCAL_RANK, ...) itself in place of a spawned process; give nprocs=%d "
            "(int(os.environ['LOCAL_WORLD_SIZE'])) or make the job's procsPerNode (gpusPerNode) %s"
            % (describe(call.name, call.fn, call.nprocs), call.where, job.local_world_size,
               job.local_world_size, call.nprocs, _name(call.fn), job.local_world_size,
               call.nprocs))


def mapping_line(call, job):
    return ("%s at %s: each of the agent's %d ranks on this node runs %s(LOCAL_RANK, ...) "
            "itself; nothing is spawned" % (describe(call.name, call.fn, call.nprocs),
                                           call.where, job.local_world_size, _name(call.fn)))


def _name(fn):
    return getattr(fn, "__name__", type(fn).__name__)


def world_error(args, kwargs, environ, job, where, call):
    """None, or the message for an init_process_group call (at `where`) whose rank= or
    world_size= (or the RANK/WORLD_SIZE in `environ`) contradict the job."""
    said = []
    for name, index, variable, value in (("world_size", 3, "WORLD_SIZE", job.world_size),
                                         ("rank", 4, "RANK", job.rank)):
        given = kwargs.get(name, args[index] if len(args) > index else None)
        if given is not None and given != -1 and given != value:
            said.append("%s=%s" % (name, given))
        if environ.get(variable, str(value)).strip() != str(value):
            said.append("%s=%s in the environment" % (variable, environ[variable]))
    if not said:
        return None
    spawned = "%s at %s" % (describe(call.name, call.fn, call.nprocs), call.where)
    advice = ("%s starts one node's ranks only. Run it as a job of one node, or pass " % spawned
              if job.nodes > 1 else "the ranks of %s. Pass " % spawned)
    return ("init_process_group at %s with %s contradicts the job: %d ranks (WORLD_SIZE=%d) on "
            "%d node%s, this one rank %d (RANK=%d); %srank=int(os.environ['RANK']), "
            "world_size=int(os.environ['WORLD_SIZE'])"
            % (where, ", ".join(said), job.world_size, job.world_size, job.nodes,
               "" if job.nodes == 1 else "s", job.rank, job.rank, advice))


def replace_rendezvous(environ, job):
    """Puts the job's MASTER_ADDR/MASTER_PORT back into `environ` where they differ; returns
    {name: the value found (None: unset)} of those replaced."""
    replaced = {}
    for name, value in (("MASTER_ADDR", job.addr), ("MASTER_PORT", job.port)):
        if value is not None and environ.get(name) != value:
            replaced[name] = environ.get(name)
            environ[name] = value
    return replaced


def rendezvous_line(replaced, job, where):
    names = sorted(replaced)  # MASTER_ADDR before MASTER_PORT
    ours = {"MASTER_ADDR": job.addr, "MASTER_PORT": job.port}
    return ("%s set by the script (%s) replaced by the agent's %s for init_process_group at %s"
            % ("/".join(names), ":".join(str(replaced[n] or "unset") for n in names),
               ":".join(ours[n] for n in names), where))


def _say_once(job, line):
    if job.rank != 0 or line in _said:
        return
    _said.add(line)
    sys.stderr.write("spawnpoint-shim: %s\n" % line)
    sys.stderr.flush()


def before_init(args, kwargs):
    """For init_process_group(*args, **kwargs) while a mapped call's fn runs: the agent's
    rendezvous put back, or the rank ended on a contradiction (the module docstring)."""
    if not _active:
        return
    job = job_of(_job_environment())
    if job is None:
        return
    where = caller()
    error = world_error(args, kwargs, os.environ, job, where, _active[-1])
    if error is not None:
        fatal(error)
    init_method = kwargs.get("init_method", args[1] if len(args) > 1 else None)
    store = kwargs.get("store", args[5] if len(args) > 5 else None)
    if store is None and init_method in (None, "env://"):
        replaced = replace_rendezvous(os.environ, job)
        if replaced:
            _say_once(job, rendezvous_line(replaced, job, where))


class RanHere(object):
    """What start_processes(join=False) returns for a call that ran in this rank: fn has
    run; join() raises its exception once, as torch's context does, else returns True."""

    def __init__(self, error):
        self._error = error
        self.processes = []

    def pids(self):
        return [os.getpid()]

    def join(self, timeout=None, grace_period=None):
        error, self._error = self._error, None
        if error is not None:
            raise error
        return True


def _job_environment():
    package = sys.modules.get(__name__.rpartition(".")[0])
    return getattr(package, "job_environment", None)


def _torchs(job):
    """Whether a call now is left to torch (the module docstring)."""
    if job is None or _active:
        return True
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return True
    from ._distributed import multiprocessing_child
    from ._lightning import called_from_lightning

    return multiprocessing_child() or called_from_lightning()


def _raised(module, index, original):
    """What torch's join() raises for fn's exception in process `index`."""
    raised = getattr(module, "ProcessRaisedException", None)
    if raised is None:  # a torch before 1.8: the exception itself
        return original
    message = "\n\n-- Process %d terminated with the following error:\n" % index
    error = raised(message + "".join(traceback.format_exception(
        type(original), original, original.__traceback__)), index, os.getpid())
    error.__context__, error.__suppress_context__ = original, True
    return error


def _run_here(module, call, job, fn, args, join):
    _say_once(job, mapping_line(call, job))
    _active.append(call)
    error = None
    try:
        fn(job.local_rank, *args)
    except Exception as err:  # as torch's _wrap: other BaseExceptions end the rank
        error = _raised(module, job.local_rank, err)
    finally:
        _active.pop()
    context = RanHere(error)
    if not join:
        return context
    context.join()
    return None


def _wrap(module, name, original):
    def mapped(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn", **kwargs):
        job = job_of(_job_environment())
        if _torchs(job):
            return original(fn, args, nprocs, join, daemon, start_method, **kwargs)
        call = Call("torch.multiprocessing." + name, fn, nprocs, caller())
        error = nprocs_error(call, job)
        if error is not None:
            fatal(error)
        return _run_here(module, call, job, fn, args, join)

    mapped = functools.wraps(original)(mapped)
    mapped._spawnpoint_mapped = True
    return mapped


def patch(module):
    for name in ("spawn", "start_processes"):
        original = getattr(module, name, None)
        if original is not None and not getattr(original, "_spawnpoint_mapped", False):
            setattr(module, name, _wrap(module, name, original))
