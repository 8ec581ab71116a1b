"""How the rank side speaks: one stderr line per distinct problem, warnings at the trainer.

`report_once` is for start-up level facts (a bad environment value, a hook that could not be
applied, a setting the shim changed): each distinct message is written once per process.
`warn` raises a RuntimeWarning attributed to the trainer's own line. Safe from any thread.
"""

import sys
import threading
import warnings

FORK_WARNING = (
    "spawnpoint: the 'fork' start method was chosen explicitly and is honoured, but a "
    "forked child of a process that has initialised CUDA/ROCm crashes ('Cannot "
    "re-initialize CUDA in forked subprocess') or hangs, and OpenMP thread pools do not "
    "survive fork either. spawnpoint's default here is 'spawn'; drop the explicit 'fork' "
    "to use it."
)

_reported = set()
_lock = threading.Lock()


def report_once(message):
    """Writes 'spawnpoint-shim: <message>' to stderr, once per process for each message."""
    with _lock:
        if message in _reported:
            return
        _reported.add(message)
    sys.stderr.write("spawnpoint-shim: %s\n" % message)
    sys.stderr.flush()


def warn(message, stacklevel):
    """A RuntimeWarning attributed to the frame `stacklevel` levels above the caller."""
    warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 2)


def fatal(message):
    """Ends the process with exit code 1 after one stderr line, 'spawnpoint-shim: fatal:
    <message>': for a mistake whose own failure would be misleading (a port clash, workers
    that never start). The agent quotes that line as the rank's cause
    (agent/supervisor/failure_cause.cc matches its start: keep it). SystemExit, so atexit
    handlers run and no traceback is printed; the trainer's `except Exception` does not
    catch it."""
    sys.stderr.write("spawnpoint-shim: fatal: %s\n" % message)
    sys.stderr.flush()
    raise SystemExit(1)
