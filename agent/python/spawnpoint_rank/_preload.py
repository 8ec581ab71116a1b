"""A Python loader worker's start-up: its turn (staggered start-up, at the end of this
file), then what it imports before its first batch (loader.preloadModules).

SPAWNPOINT_LOADER_PRELOAD names the modules, comma-separated ("torch,numpy"; unset: torch
and __main__; empty: none). The entry "__main__" stands for the trainer's script, which
SPAWNPOINT_LOADER_MAIN names (the agent finds it in the rank's command): its leading import
statements, the `import` and `from ... import` lines before its first other statement (a
docstring and `from __future__` aside), are imported the way the script resolves them, with
the script's directory first on sys.path as Python puts it for a script. A spawned worker
runs the script's module before its first batch anyway (multiprocessing's preparation, as
PyTorch's own workers do at iter()); doing its imports now, while the rank starts, keeps
them out of the first batch. Only the leading block: an import after other code may
depend on it (a sys.path change, say), and importing it early could cache a different
module under that name. A failure there is silent (the script's own import, when the
worker prepares the script, reports it in the rank's words); a failed listed module is one
stderr line and the worker serves anyway.
"""

import ast
import importlib
import os
import select
import sys
import time

PRELOAD_ENV = "SPAWNPOINT_LOADER_PRELOAD"
MAIN_ENV = "SPAWNPOINT_LOADER_MAIN"
SCRIPT = "__main__"
TURN_FD_ENV = "SPAWNPOINT_LOADER_TURN_FD"  # contract.h: staggered start-up
STARTED_FD_ENV = "SPAWNPOINT_LOADER_STARTED_FD"
TURN_LIMIT_S = 30.0


def names(environ):
    """The entries SPAWNPOINT_LOADER_PRELOAD names, each once: torch and __main__ when it is
    unset."""
    value = environ.get(PRELOAD_ENV)
    if value is None:
        return ["torch", SCRIPT]
    out = []
    for name in value.split(","):
        name = name.strip()
        if name and name not in out:
            out.append(name)
    return out


def script_imports(path):
    """The modules the script at `path` imports in its leading import statements, in order
    ([] when it cannot be read or parsed). `from a import b` gives "a", and "a.b" as a
    candidate submodule (imported only if a has no attribute b)."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return []
    out = []
    for i, node in enumerate(tree.body):
        if (i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            continue  # the docstring
        if isinstance(node, ast.Import):
            out.extend((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level or node.module == "__future__":
                continue
            out.extend((node.module, alias.name) for alias in node.names if alias.name != "*")
            if all(alias.name == "*" for alias in node.names):
                out.append((node.module, None))
        else:
            break
    return out


def preload_script(path):
    """Imports what script_imports(path) lists, quietly; the names imported."""
    if not path:
        return []
    script_dir = os.path.dirname(os.path.abspath(path))
    saved = list(sys.path)
    # As for `python script.py`: the script's directory first, not this worker's (-m puts
    # the working directory there).
    sys.path[:1] = [script_dir]
    done = []
    try:
        for module, attribute in script_imports(path):
            try:
                imported = importlib.import_module(module)
                done.append(module)
                if attribute is not None and not hasattr(imported, attribute):
                    importlib.import_module(module + "." + attribute)
                    done.append(module + "." + attribute)
            except Exception:
                continue
    finally:
        sys.path[:] = saved
    return done


def preload(environ):
    """Imports the modules to have warm before the rank asks (the point of a pool). A listed
    module that fails is one stderr line; the worker serves on. Returns the names that
    failed."""
    failed = []
    for name in names(environ):
        if name == SCRIPT:
            preload_script(environ.get(MAIN_ENV, ""))
            continue
        try:
            importlib.import_module(name)
        except Exception as e:
            failed.append(name)
            sys.stderr.write("spawnpoint loader worker: preloadModules: cannot import %s: "
                             "%s: %s\n" % (name, type(e).__name__, e))
            sys.stderr.flush()
    return failed


# ---- Staggered start-up: whose turn it is to import (contract.h) ----------------------

def env_fd(environ, name):
    """The descriptor the variable `name` gives, or -1; the variable is dropped (programs the
    dataset starts must not see it)."""
    try:
        return int(environ.pop(name, ""))
    except ValueError:
        return -1


def close_env_fd(environ, name):
    """Closes the descriptor the variable `name` gives, if any (env_fd)."""
    _close_quietly(env_fd(environ, name))


def _close_quietly(fd):
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


def idle_priority():
    """The calling thread runs only when a CPU is otherwise idle (SCHED_IDLE; Linux sets it
    per thread), else at the lowest nice value."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        try:
            os.nice(19)
        except OSError:
            pass


# ---- Idle priority, while nobody waits for this process ------------------------------

PRIORITY_ENV = "SPAWNPOINT_LOADER_PRIORITY"  # "normal": the start-up runs at the process's own
# Starved: waiting for a CPU more than this share of STARVED_WINDOW_S while awaited. Sibling
# workers importing at once on the rank's one CPU each wait up to (n-1)/n of the time (7/8
# for the most a rank's pool has); a thread at idle priority beside one busy process waits
# ~99 % of it. A test sets SPAWNPOINT_LOADER_STARVED_SHARE=-1: every window counts.
try:
    STARVED_SHARE = float(os.environ.get("SPAWNPOINT_LOADER_STARVED_SHARE", "0.95"))
except ValueError:
    STARVED_SHARE = 0.95
STARVED_WINDOW_S = 2.0


def at_idle_priority(environ, variable):
    """Whether a start-up runs at idle CPU priority: unless `variable` (PRIORITY_ENV for a
    loader worker, _standby.PRIORITY_ENV for a standby) is "normal"."""
    return environ.get(variable, "idle") != "normal"


def thread_run_delay_ns(tid):
    """Nanoseconds thread `tid` of this process has spent runnable but waiting for a CPU
    (/proc's schedstat), or None where the kernel does not say."""
    try:
        with open("/proc/self/task/%d/schedstat" % tid) as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None


class StarvedWhileAwaited(object):
    """Tells when an idle-priority thread starves while a client waits: a connection has
    been pending on the listening socket `listen_fd` (the rank asks for this worker) for
    STARVED_WINDOW_S, in which `tid` spent more than STARVED_SHARE of the time waiting for a
    CPU (other processes keep every CPU busy, and SCHED_IDLE yields to all of them). A
    thread that sleeps (its turn to import) or runs is not starved. `clock` and
    `run_delay_ns` are seams for tests."""

    def __init__(self, listen_fd, tid, clock=time.monotonic, run_delay_ns=None):
        self._fd = listen_fd
        self._tid = tid
        self._clock = clock
        self._run_delay_ns = run_delay_ns or thread_run_delay_ns
        self._last = None  # (time, run delay) at the last call with a client waiting

    def starved(self):
        try:
            awaited = bool(select.select([self._fd], [], [], 0)[0])
        except (OSError, ValueError):
            awaited = False
        delay = self._run_delay_ns(self._tid) if awaited else None
        if delay is None:
            self._last = None
            return False
        now = self._clock()
        if self._last is None:
            self._last = (now, delay)  # the window starts
            return False
        elapsed = now - self._last[0]
        if elapsed < STARVED_WINDOW_S:
            return False
        waited, self._last = (delay - self._last[1]) / 1e9, (now, delay)
        return waited > STARVED_SHARE * elapsed


def wait_for_turn(environ, limit_s=TURN_LIMIT_S):
    """With a turn descriptor (staggered start-up), waits until the worker before this one has
    finished its preload (end of file: it closed its end, or died), at most limit_s: a
    predecessor that hangs while importing does not hold this worker back for ever; then
    closes it."""
    fd = env_fd(environ, TURN_FD_ENV)
    if fd >= 0:
        try:
            end = time.monotonic() + limit_s
            while time.monotonic() < end:
                ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
                if ready and not os.read(fd, 64):
                    break
        except OSError:
            pass
        _close_quietly(fd)
