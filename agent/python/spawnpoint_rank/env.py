"""What this rank is and what its job asks for: the environment, parsed once.

`RankEnv.from_environ(environ)` parses the variables the agent sets for a Python rank into one
frozen record; it never raises, and a bad value is ignored and described in `problems`.
`current()` answers "what am I?": the RankEnv of this process, or None outside an
agent-started rank (SPAWNPOINT_SHIM != "1"), as torch.utils.data.get_worker_info() returns
None in the main process. `current()` reports the problems once on stderr. Both are safe from
any thread; RankEnv is immutable.

The variables (set by the agent, spawnpoint's node_plan):
  SPAWNPOINT_SHIM=1                    an agent-started rank (anything else: current() is None)
  RANK, LOCAL_RANK, WORLD_SIZE         as torchrun sets them; unset: 0, 0, 1
  SPAWNPOINT_LOADER_WORKERS            integer >= 0 or "auto" (= min(CPUs, 8), at least 1)
  SPAWNPOINT_LOADER_CPUS               the rank's CPUs, for "auto" (unset: the affinity mask)
  SPAWNPOINT_LOADER_PERSISTENT_WORKERS 1/true/yes/on or 0/false/no/off (default)
  SPAWNPOINT_LOADER_PREFETCH_FACTOR    integer >= 1; unset: torch's default
  SPAWNPOINT_LOADER_TIMEOUT_SECONDS    seconds > 0; unset: no timeout
  SPAWNPOINT_SHIM_DEBUG=1              one stderr line per DataLoader (anything else: off)
Values are stripped of surrounding blanks; an empty value counts as unset.
Not read here: the bootstrap (sitecustomize.py) takes these out of the environment at start-up,
so that processes the rank starts never see them:
  SPAWNPOINT_LOADER_SERVICE            the rank's loader service socket (_pool.py)
  SPAWNPOINT_PROGRESS_FILE             the rank's progress record (agent/progress/
                                       progress_record.h), written by _progress.py
  SPAWNPOINT_STACK_SIGNAL              a signal number: on it, faulthandler appends every Python
  SPAWNPOINT_STACK_FILE                thread's stack to this file (both set, or neither)
"""

import os
import threading
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Tuple

from ._report import report_once

AUTO_WORKERS_CAP = 8

_WORKERS = "SPAWNPOINT_LOADER_WORKERS"
_CPUS = "SPAWNPOINT_LOADER_CPUS"
_PERSISTENT = "SPAWNPOINT_LOADER_PERSISTENT_WORKERS"
_PREFETCH = "SPAWNPOINT_LOADER_PREFETCH_FACTOR"
_TIMEOUT = "SPAWNPOINT_LOADER_TIMEOUT_SECONDS"
_DEBUG = "SPAWNPOINT_SHIM_DEBUG"
# Everything from_environ reads: current() parses again only when one of them changed.
VARIABLES = ("SPAWNPOINT_SHIM", "RANK", "LOCAL_RANK", "WORLD_SIZE", _WORKERS, _CPUS,
             _PERSISTENT, _PREFETCH, _TIMEOUT, _DEBUG)


def affinity_cpus():
    """The CPUs this process may run on (its affinity mask), at least 1."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True)
class RankEnv(object):
    """One rank's identity and its job's loader settings. Immutable."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    loader_workers: Optional[int] = None   # None: the job sets no count; "auto" is resolved
    persistent_workers: bool = False  # True: persistent_workers=True where the code is silent
    prefetch_factor: Optional[int] = None  # None: torch's default
    timeout_s: Optional[float] = None      # None: no timeout
    debug: bool = False
    problems: Tuple[str, ...] = ()         # the values ignored, one line each; never raised

    @classmethod
    def from_environ(cls, environ: Mapping[str, str],
                     cpus: Callable[[], int] = affinity_cpus) -> "RankEnv":
        """Parses `environ`; `cpus()` is asked only for "auto" without SPAWNPOINT_LOADER_CPUS."""
        parser = _Parser(environ)
        rank = parser.integer("RANK", 0, 0)
        local_rank = parser.integer("LOCAL_RANK", 0, 0)
        world_size = parser.integer("WORLD_SIZE", 1, 1)
        if rank >= world_size:
            parser.problem("ignoring RANK=%d: not below WORLD_SIZE=%d" % (rank, world_size))
            rank = 0
        return cls(rank=rank, local_rank=local_rank, world_size=world_size,
                   loader_workers=parser.workers(cpus),
                   persistent_workers=parser.flag(_PERSISTENT, False),
                   prefetch_factor=parser.number(_PREFETCH, int, 1, False),
                   timeout_s=parser.number(_TIMEOUT, float, 0, True),
                   debug=parser.value(_DEBUG) == "1",
                   problems=tuple(parser.problems))


class _Parser(object):
    """Reads one environment mapping, collecting a problem line for every ignored value."""

    def __init__(self, environ):
        self._environ = environ
        self.problems = []

    def problem(self, message):
        self.problems.append(message)

    def value(self, name):
        value = self._environ.get(name)
        if value is None:
            return None
        return value.strip() or None

    def integer(self, name, default, minimum):
        value = self.value(name)
        if value is None:
            return default
        try:
            n = int(value)
            if n >= minimum:
                return n
        except ValueError:
            pass
        self.problem("ignoring %s=%r: not an integer >= %d" % (name, value, minimum))
        return default

    def workers(self, cpus):
        value = self.value(_WORKERS)
        if value is None:
            return None
        if value.lower() == "auto":
            return max(1, min(self._cpus(cpus), AUTO_WORKERS_CAP))
        try:
            n = int(value)
            if n >= 0:
                return n
        except ValueError:
            pass
        self.problem("ignoring %s=%r: not an integer >= 0 or auto" % (_WORKERS, value))
        return None

    def _cpus(self, cpus):
        value = self.value(_CPUS)
        if value is not None:
            try:
                n = int(value)
                if n > 0:
                    return n
            except ValueError:
                pass
            self.problem("ignoring %s=%r: not a positive integer" % (_CPUS, value))
        return cpus()

    def flag(self, name, default):
        value = self.value(name)
        if value is None:
            return default
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        self.problem("ignoring %s=%r: not 0 or 1" % (name, value))
        return default

    def number(self, name, convert, minimum, exclusive):
        value = self.value(name)
        if value is None:
            return None
        try:
            n = convert(value)
            if n > minimum or (not exclusive and n == minimum):
                return n
        except ValueError:
            pass
        self.problem("ignoring %s=%r: not a number %s %s"
                     % (name, value, ">" if exclusive else ">=", minimum))
        return None


_cache_lock = threading.Lock()
_cache = (None, None)  # (the values of VARIABLES it was parsed from, the RankEnv)


def current(environ: Optional[Mapping[str, str]] = None) -> Optional[RankEnv]:
    """This process's RankEnv, or None outside an agent-started rank.

    Parsed on the first call and kept; parsed again only if one of VARIABLES changed in
    `environ` (default os.environ) since, so a trainer (or a test) that sets them at run time
    is still obeyed. Each problem is reported once per process on stderr."""
    global _cache
    environ = os.environ if environ is None else environ
    if environ.get("SPAWNPOINT_SHIM") != "1":
        return None
    key = tuple(environ.get(name) for name in VARIABLES)
    with _cache_lock:
        cached_key, env = _cache
        if env is None or cached_key != key:
            env = RankEnv.from_environ(environ)
            _cache = (key, env)
    for message in env.problems:
        report_once(message)
    return env
