"""A warm standby rank: a spawned Python process that has done a rank's imports and waits,
holding no GPU context, to become that rank on the agent's next attempt.

The agent (agent/run/standby_rank.h) starts it with the rank's command line and environment
plus SPAWNPOINT_STANDBY_FD, a Unix socket to the agent. The bootstrap (sitecustomize.py) sees
the variable and calls `wait_for_release(fd)` before Python runs the trainer's script, so the
script itself later runs exactly as in a fresh process: same argv, `__main__`, sys.path[0].
Until then:

  1. Preload, in a thread at SCHED_IDLE priority (the running attempt's ranks keep their
     CPUs; SPAWNPOINT_STANDBY_PRIORITY=normal keeps the process's own, for nodes whose CPUs
     are never idle, where an idle-priority standby would never be ready): the modules the
     last attempt's rank had imported by its first training step
     (SPAWNPOINT_STANDBY_MODULES names a file of them, one per line, that a rank of the job
     wrote: `learn_modules`), else torch's usual ones on the way to a DDP step; then the
     script's leading imports (the `import` lines before its first other statement), with the
     script's directory first on sys.path as Python will put it. Their output is kept, and
     written out at release, as the rank's.
  2. Says `{"ready": ..., "failed": [...], "gpu": ...}` on the socket: `failed` lists the
     script's imports that raised (the agent then starts a fresh process, where the script
     meets the error in its own words), `gpu` whether anything initialised CUDA (then it is
     never used).
  3. Waits for `{"release": {"env": {...}}}` with the attempt's stdout and stderr as
     SCM_RIGHTS descriptors; takes the environment (os.environ replaced, the variables the
     shim takes out of it taken again), the descriptors as 1 and 2, writes what the preload
     printed, and returns: the interpreter runs the script. The socket is closed. EOF before
     a release (the agent stopped it, or died) exits the process.

`learn_modules(path)` is the rank's side of step 1: at its first counted step once its
loader workers have each served a batch (_progress.py), a rank with
SPAWNPOINT_STANDBY_LEARN writes the library modules it has imported (never the script's own
directory's) for the next standby. Single-threaded but for the preload thread.
"""

import json
import os
import socket
import struct
import sys
import threading

FD_ENV = "SPAWNPOINT_STANDBY_FD"
MAIN_ENV = "SPAWNPOINT_STANDBY_MAIN"        # "-m module" trainers: the module
MODULES_ENV = "SPAWNPOINT_STANDBY_MODULES"  # a file of modules to preload
LEARN_ENV = "SPAWNPOINT_STANDBY_LEARN"      # where a rank writes the modules it imported
PRIORITY_ENV = "SPAWNPOINT_STANDBY_PRIORITY"  # "idle" (the default) or "normal"
# On the way to a DDP step and an optimizer step, where no list was learned yet.
DEFAULT_MODULES = ("torch", "torch.distributed", "torch.nn.parallel", "torch.optim",
                   "torch.utils.data")
# Never imported ahead: the process's own start-up modules (the standby runs inside
# sitecustomize's import, whose lock the preload thread would wait for forever) and mains.
_NEVER = frozenset(("__main__", "__mp_main__", "sitecustomize", "usercustomize", "site"))
_MAX_MESSAGE = 1 << 20


def script_path(argv, environ):
    """The script file the interpreter will run, or the -m module's source; None if neither."""
    module = environ.get(MAIN_ENV)
    if module:
        try:
            import importlib.util

            spec = importlib.util.find_spec(module)
            return spec.origin if spec is not None and spec.has_location else None
        except Exception:
            return None
    if argv and argv[0] not in ("-c", "-m", "-") and os.path.isfile(argv[0]):
        return argv[0]
    return None


def modules_to_preload(environ):
    """The module list file's names (one a line, # comments), else DEFAULT_MODULES."""
    path = environ.get(MODULES_ENV)
    if path:
        try:
            with open(path) as f:
                names = [line.strip() for line in f]
            names = [n for n in names if n and not n.startswith("#")]
            if names:
                return names
        except OSError:
            pass
    return list(DEFAULT_MODULES)


def preload(argv, environ):
    """Imports what the standby should have warm; the script's imports that failed."""
    import importlib

    from . import _preload

    for name in modules_to_preload(environ):
        if name in sys.modules or name in _NEVER or name.startswith("spawnpoint_rank"):
            continue  # already there (or being imported by the main thread: never wait on it)
        try:
            importlib.import_module(name)
        except BaseException:  # a library the last rank had may be gone: not the script's
            continue
    script = script_path(argv, environ)
    failed = []
    if script:
        script_dir = os.path.dirname(os.path.abspath(script))
        sys.path.insert(0, script_dir)  # as Python will put it for the script
        try:
            for module, attribute in _preload.script_imports(script):
                try:
                    imported = importlib.import_module(module)
                    if attribute is not None and not hasattr(imported, attribute):
                        importlib.import_module(module + "." + attribute)
                except BaseException as err:
                    failed.append("%s: %s: %s" % (module, type(err).__name__, err))
        finally:
            if sys.path and sys.path[0] == script_dir:
                del sys.path[0]
    return failed


def gpu_initialised():
    """Whether this process holds a GPU context (CUDA or HIP through torch)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    try:
        return bool(cuda is not None and cuda.is_initialized())
    except Exception:
        return False


class _Captured(object):
    """Descriptors 1 and 2 sent to temporary files while the standby prepares; `replay`
    writes what they got to the descriptors that are 1 and 2 by then."""

    def __init__(self):
        import tempfile

        sys.stdout.flush()
        sys.stderr.flush()
        self.files = []
        for fd in (1, 2):
            f = tempfile.TemporaryFile()
            os.dup2(f.fileno(), fd)
            self.files.append(f)

    def replay(self):
        for fd, f in zip((1, 2), self.files):
            f.seek(0)
            data = f.read()
            f.close()
            while data:
                data = data[os.write(fd, data):]


def _send(sock, message):
    payload = json.dumps(message).encode()
    sock.sendall(struct.pack("<I", len(payload)) + payload)


def _receive(sock):
    """The next message and the descriptors it carried; (None, []) at EOF."""
    header, fds = b"", []
    while len(header) < 4:
        data, ancillary, _, _ = sock.recvmsg(4 - len(header), socket.CMSG_SPACE(8 * 4))
        fds.extend(_descriptors(ancillary))
        if not data:
            return None, fds
        header += data
    (length,) = struct.unpack("<I", header)
    if length > _MAX_MESSAGE:
        raise ValueError("a message of %d bytes" % length)
    payload = b""
    while len(payload) < length:
        data, ancillary, _, _ = sock.recvmsg(length - len(payload), socket.CMSG_SPACE(8 * 4))
        fds.extend(_descriptors(ancillary))
        if not data:
            return None, fds
        payload += data
    return json.loads(payload.decode()), fds


def _descriptors(ancillary):
    out = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % 4
            out.extend(struct.unpack("%di" % (usable // 4), data[:usable]))
    return out


def wait_for_release(fd, take_environment):
    """Steps 1-3 of the module docstring. `take_environment()` is the bootstrap's: it takes
    the per-attempt variables out of os.environ once the attempt's environment is in."""
    from . import _preload

    sock = socket.socket(fileno=fd)
    captured = _Captured()
    failed = []

    def prepare():
        if _preload.at_idle_priority(os.environ, PRIORITY_ENV):  # the agent allows idle, normal
            _preload.idle_priority()
        failed.extend(preload(sys.argv, os.environ))

    worker = threading.Thread(target=prepare, name="spawnpoint-standby-preload", daemon=True)
    worker.start()
    worker.join()
    _send(sock, {"ready": True, "pid": os.getpid(), "failed": failed,
                 "gpu": gpu_initialised()})
    message, fds = _receive(sock)
    release = message.get("release") if isinstance(message, dict) else None
    if release is None or len(fds) != 2:
        os._exit(0)  # stopped (EOF) or not for us: this standby is never used
    sys.stdout.flush()
    sys.stderr.flush()
    for target, received in zip((1, 2), fds):
        os.dup2(received, target)
        os.close(received)
    sock.close()
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in release.get("env", {}).items()})
    take_environment()
    captured.replay()


def learn_modules(path, script):
    """Writes the library modules this process has imported to `path` (atomically): those
    from outside the script's directory, by name, sorted."""
    script_dir = os.path.dirname(os.path.abspath(script)) if script else None
    names = []
    for name, module in list(sys.modules.items()):
        if name in _NEVER or name.startswith("spawnpoint_rank") or module is None:
            continue
        where = getattr(module, "__file__", None)
        if where and script_dir and os.path.abspath(where).startswith(script_dir + os.sep):
            continue  # the trainer's own modules: the script's imports cover those it needs
        names.append(name)
    names.sort(key=lambda n: (n.count("."), n))  # packages before their submodules
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as f:
        f.write("\n".join(names) + "\n")
    os.rename(tmp, path)
    return names
