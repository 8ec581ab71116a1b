"""The rank side's decisions, as pure functions of what they are given (no torch needed).

`loader_defaults` decides which DataLoader arguments the job fills in for a loader the code
built; `debug_line` and `warnings_in` read its notes. `libuv_decision` decides whether a
torch without libuv needs USE_LIBUV=0 for its TCPStore rendezvous. Pure functions;
thread-safe.
"""

import re
from typing import AbstractSet, Any, Dict, List, Mapping, Optional, Tuple

from ._report import FORK_WARNING
from .env import RankEnv

# Every note of loader_defaults starts with one of these.
SET = "set "       # an argument the job filled in
KEPT = "kept "     # the code's own choice, left alone (or why the job's was not applied)
WARN = "warn "     # a RuntimeWarning to raise at the trainer's DataLoader(...) line

LOADER_ARGUMENTS = frozenset(("num_workers", "multiprocessing_context", "persistent_workers",
                              "prefetch_factor", "timeout"))


def job_timeout_s(env: Optional[RankEnv], loader_timeout: float) -> float:
    """Seconds after which the agent's pool replaces the worker of an overdue batch: the
    DataLoader's own timeout= when the code passed one, else the job's
    loader.timeoutSeconds; 0: never."""
    if loader_timeout and loader_timeout > 0:
        return float(loader_timeout)
    if env is not None and env.timeout_s:
        return float(env.timeout_s)
    return 0.0


def loader_defaults(env: RankEnv, explicit: Mapping[str, Any], iterable: bool, daemonic: bool,
                    accepted: AbstractSet[str] = LOADER_ARGUMENTS
                    ) -> Tuple[Dict[str, Any], List[str]]:
    """The DataLoader arguments to apply, and the notes saying why.

    explicit: the arguments the code passed, by name (positional ones bound to their names),
      with their values: a name in it is the code's choice, except num_workers=0 and
      multiprocessing_context=None, which leave the choice open.
    iterable: the dataset is an IterableDataset. daemonic: this process is daemonic (a loader
      worker), so it may not have children. accepted: the arguments this torch's DataLoader
      takes (all of LOADER_ARGUMENTS since torch 1.7).
    Returns (kwargs, notes): kwargs to pass on top of the code's; notes start with SET, KEPT
    or WARN, in the order of the debug line.

    The policy: the job's worker count replaces a num_workers left at 0, never for an
    IterableDataset (each worker would replay the stream) nor in a daemonic process. With
    workers (the code's or the job's): multiprocessing_context='spawn' unless the code chose
    one (an explicit fork is honoured with a warning); persistent_workers=True only where the
    job turned it on (loader.persistentWorkers) and the code did not choose: persistence
    changes which random numbers the trainer and the workers draw from the second epoch on,
    so the default keeps the code's, as under torchrun; the job's prefetch_factor unless the
    code passed one. The
    job's timeout is never passed (torch would make a slow batch kill the rank): the agent's
    pool replaces a worker whose batch is overdue by it (job_timeout_s).
    """
    kwargs = {}  # type: Dict[str, Any]
    notes = []   # type: List[str]
    workers = explicit.get("num_workers", 0)
    if isinstance(workers, int) and workers == 0:
        job = env.loader_workers or 0
        if job <= 0:
            pass
        elif iterable:
            notes.append(KEPT + "num_workers=0 (IterableDataset: the job's %d workers would "
                         "each replay the stream)" % job)
        elif daemonic:
            notes.append(KEPT + "num_workers=0 (daemonic process: no children allowed)")
        else:
            kwargs["num_workers"] = workers = job
            notes.append(SET + "num_workers=0->%d (job)" % job)
    elif "num_workers" in explicit:
        notes.append(KEPT + "num_workers=%r" % (workers,))
    if not isinstance(workers, int) or workers <= 0:
        return kwargs, notes

    if "multiprocessing_context" in accepted:
        context = explicit.get("multiprocessing_context")
        if context is None:
            kwargs["multiprocessing_context"] = "spawn"
            notes.append(SET + "multiprocessing_context='spawn'")
        else:
            name = context_start_method(context)
            notes.append(KEPT + "multiprocessing_context=%r" % (name or context,))
            if name == "fork":
                notes.append(WARN + FORK_WARNING)

    if "persistent_workers" in accepted:
        if "persistent_workers" in explicit:
            notes.append(KEPT + "persistent_workers=%r" % (explicit["persistent_workers"],))
        elif env.persistent_workers:
            kwargs["persistent_workers"] = True
            notes.append(SET + "persistent_workers=True (job)")

    if "prefetch_factor" in accepted:
        if "prefetch_factor" in explicit:
            notes.append(KEPT + "prefetch_factor=%r" % (explicit["prefetch_factor"],))
        elif env.prefetch_factor is not None:
            kwargs["prefetch_factor"] = env.prefetch_factor
            notes.append(SET + "prefetch_factor=%r (job)" % env.prefetch_factor)
    # The job's timeout is never passed as timeout=: torch makes an overdue batch fatal to the
    # rank, where the job's means "replace the hung worker" (the agent's pool does).
    if "timeout" in explicit:
        notes.append(KEPT + "timeout=%r" % (explicit["timeout"],))
    return kwargs, notes


def context_start_method(context: Any) -> Optional[str]:
    """The start method a DataLoader's multiprocessing_context names: the string itself, or a
    multiprocessing context's get_start_method() (public; None for the default context before
    a method is chosen, or an object that is no context)."""
    if isinstance(context, str):
        return context
    try:
        return context.get_start_method(allow_none=True)
    except Exception:
        return None


def debug_line(notes: List[str]) -> str:
    """What SPAWNPOINT_SHIM_DEBUG=1 prints for one loader: "set a, b; kept: c" or "unchanged"."""
    changed = [n[len(SET):] for n in notes if n.startswith(SET)]
    kept = [n[len(KEPT):] for n in notes if n.startswith(KEPT)]
    return ("set " + ", ".join(changed) if changed else "unchanged") + (
        "; kept: " + ", ".join(kept) if kept else "")


def warnings_in(notes: List[str]) -> List[str]:
    """The warning messages among the notes."""
    return [n[len(WARN):] for n in notes if n.startswith(WARN)]


# ------------------------------------------------------------------------------------------
# TCPStore and libuv.

KEEP = "keep"        # leave USE_LIBUV alone
PROBE = "probe"      # it depends on whether this torch has libuv: find out, then ask again
DISABLE = "disable"  # set USE_LIBUV=0 (and say so once)

# torch 2.4 made libuv the TCPStore server's default (USE_LIBUV unset means "1"); before, it
# was opt-in, and before 2.2 torch had neither libuv nor USE_LIBUV.
LIBUV_DEFAULT_SINCE = (2, 4)


def torch_release(version: str) -> Optional[Tuple[int, int]]:
    """(major, minor) of a torch version string such as '2.6.0+cpu' or '1.13.0a0', or None."""
    match = re.match(r"\s*(\d+)\.(\d+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def libuv_decision(torch_version: str, has_libuv: Optional[bool],
                   environ: Mapping[str, str]) -> str:
    """KEEP, PROBE or DISABLE, for USE_LIBUV in a process that imported torch.distributed.

    has_libuv: whether this torch's TCPStore has the libuv backend; None when not known yet.
    USE_LIBUV set by the user (any value) is kept; so is everything on a torch older than 2.4
    or of an unknown version. Otherwise a torch without libuv needs USE_LIBUV=0, or its
    env:// and tcp:// rendezvous fail ("use_libuv was requested but PyTorch was build without
    libuv support"); PROBE asks the caller to find out first.
    """
    if "USE_LIBUV" in environ:
        return KEEP
    release = torch_release(torch_version)
    if release is None or release < LIBUV_DEFAULT_SINCE:
        return KEEP
    if has_libuv is None:
        return PROBE
    return KEEP if has_libuv else DISABLE
