"""spawnpoint.launch(): run a function on N ranks that spawnpoint-agent spawns, from a notebook.

The caller's side of the launcher; `spawnpoint.launch` and the exceptions are re-exported by
the package (lazily: `import spawnpoint` stays cheap). Call it from the main thread of any
Python process, a Jupyter kernel included; one launch at a time per thread. It never imports
torch: the kernel may have initialised CUDA or OpenMP, the ranks are fresh processes the agent
spawns.

One launch, as flat steps:
  1. a private directory (tempfile.mkdtemp): `call.pkl` (fn, args and kwargs by value, with
     cloudpickle; the caller's sys.path and the source lines of its notebook cells) and
     `job.json`, an ordinary TrainingJob manifest whose trainer is this interpreter running
     _launched.py (the rank's side) on that directory;
  2. one line that says what was launched, then `spawnpoint-agent run -f job.json`, its stdout
     and stderr copied line by line to sys.stdout and sys.stderr as they come (in a kernel,
     the cell's streams: every rank's lines, prefixed by the agent with their rank);
  3. the agent's end: rank 0's return value (each rank's with return_all), or the failing
     rank's exception raised here, its traceback and the agent's cause attached;
  4. whatever happens (an interrupt included), the agent and its ranks are stopped and waited
     for, and the directory is removed, before launch() returns or raises.

The directory's files (written by one side, read by the other once the ranks are gone):
  call.pkl            {"format", "call": cloudpickle bytes of (fn, args, kwargs), "return_all",
                       "lines": {filename: [source lines]}} (plain pickle)
  result-R.pkl        rank R's return value (cloudpickle), written atomically when fn returned
  error-R-A.pkl       rank R's failure in attempt A (TORCHELASTIC_RESTART_COUNT): {"type",
                       "message", "traceback", "exception": cloudpickle bytes or None,
                       "why_not": why the exception could not be pickled}
  status.json         the agent's --status-file (docs/status.md), unless status_file= says
"""

import json
import os
import re
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

__all__ = ["launch", "LaunchError", "RankFailed"]

FORMAT = 1  # of call.pkl; _launched.py refuses another
AGENT_ENV = "SPAWNPOINT_AGENT"
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_ENTRY = os.path.join(_PACKAGE_DIR, "_launched.py")
# <prefix>/share/spawnpoint, where the agent ships this package (python/spawnpoint) and
# cloudpickle (python-deps), with itself in <prefix>/bin.
_SHARE_DIR = os.path.dirname(os.path.dirname(_PACKAGE_DIR))
STOP_MARGIN = 30.0  # seconds past the grace period an interrupted agent gets before SIGKILL
MAX_SHIPPED_SOURCE = 4 << 20  # bytes of notebook cell source sent for the ranks' tracebacks


class LaunchError(RuntimeError):
    """The launch failed without a rank's failure to show: no agent, bad input, a machine that
    cannot run the job, an agent stopped from outside, a rank with no result.
    `exit_code` is the agent's (None when it never ran), `agent_lines` its last own lines."""

    def __init__(self, message, exit_code=None, agent_lines=()):
        super().__init__(message)
        self.exit_code = exit_code
        self.agent_lines = list(agent_lines)


class RankFailed(LaunchError):
    """A rank failed and the job was not restarted (or was out of restarts).

    `rank`, `exit_code` (the rank's), `signal`, `reason` (the agent's cause: UserError,
    OOMKilled, Killed, ...), `cause` (the agent's message), `restarts`, `exception_type` (the
    rank's exception, e.g. "ValueError", or None), `traceback` (the rank's formatted traceback
    text, or the rank's last log lines when it died without one), `failure` (the status
    document's lastFailure, docs/status.md). When the rank's exception could be rebuilt here,
    launch() raises that exception instead, with this one as its __cause__."""

    def __init__(self, message, rank, failure, traceback_text, exception_type, restarts,
                 agent_exit_code=None, agent_lines=()):
        super().__init__(message, agent_exit_code, agent_lines)
        self.rank = rank
        self.failure = dict(failure or {})
        self.exit_code = self.failure.get("exitCode")
        self.agent_exit_code = agent_exit_code
        self.signal = self.failure.get("signal")
        self.reason = self.failure.get("reason")
        self.cause = self.failure.get("message")
        self.restarts = restarts
        self.exception_type = exception_type
        self.traceback = traceback_text


LaunchError.__module__ = RankFailed.__module__ = "spawnpoint"  # as users name them


def launch(fn, *args, nprocs=1, gpus=False, backend="auto", max_restarts=0, return_all=False,
           kwargs=None, agent=None, spec=None, env=None, name=None, master_port=0,
           metrics_addr="127.0.0.1:0", status_file=None, grace_period=10, agent_args=()):
    """Runs fn(*args, **kwargs) on `nprocs` ranks spawned by spawnpoint-agent on this machine
    and returns rank 0's return value (a list of every rank's, in rank order, with
    return_all=True).

    fn, args and kwargs go to the ranks by value (cloudpickle), so functions, classes and
    lambdas defined in notebook cells (the kernel's __main__) work; return values come back
    the same way. Each rank has torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR, MASTER_PORT) and SPAWNPOINT_BACKEND, so `torch.distributed.
    init_process_group(os.environ["SPAWNPOINT_BACKEND"])` joins the job's process group; the
    ranks run this interpreter (sys.executable) in the current directory, with sys.path as
    PYTHONPATH.

    nprocs        ranks (>= 1)
    gpus          False: CPU ranks; True: one GPU per rank, assigned by the agent
    backend       auto (nccl with GPUs, else gloo) | gloo | nccl: the job's spec.backend
    max_restarts  whole-gang restarts on a retryable failure (spec.restartPolicy.maxRestarts;
                  fn runs again from the start on every rank)
    kwargs        fn's keyword arguments
    agent         the spawnpoint-agent binary; default: $SPAWNPOINT_AGENT, the agent this
                  package ships with (bin/ beside share/spawnpoint/python), then PATH
    spec          more TrainingJob spec fields, merged into the generated one
                  (docs/trainingjob.md), e.g. {"loader": {"workersPerRank": 2}}
    env           {name: value} more environment variables for the ranks
    name          the job's name (default: from fn's)
    master_port   the rendezvous port (default 0: the agent picks a free one)
    metrics_addr  the agent's --metrics-addr (default a free port on 127.0.0.1; "off": none)
    status_file   keep the agent's status document (docs/status.md) at this path
    grace_period  seconds from SIGTERM to SIGKILL when the agent stops ranks
    agent_args    more flags for `spawnpoint-agent run`

    A rank's exception is raised here: the same exception when it can be rebuilt, with a
    RankFailed (the rank's traceback text and the agent's cause) as its __cause__, else that
    RankFailed. KeyboardInterrupt (interrupting the cell) stops the agent and every rank,
    removes the launch's files and is raised again.
    """
    if not callable(fn):
        raise TypeError("spawnpoint.launch: fn must be callable, not %s" % type(fn).__name__)
    if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
        raise ValueError("spawnpoint.launch: nprocs must be an integer >= 1, not %r" % (nprocs,))
    if not isinstance(gpus, bool):
        raise TypeError("spawnpoint.launch: gpus must be True (one GPU per rank) or False, "
                        "not %r" % (gpus,))
    if not isinstance(max_restarts, int) or isinstance(max_restarts, bool) or max_restarts < 0:
        raise ValueError("spawnpoint.launch: max_restarts must be an integer >= 0, not %r"
                         % (max_restarts,))
    if backend not in ("auto", "gloo", "nccl"):
        raise ValueError("spawnpoint.launch: backend must be auto, gloo or nccl, not %r"
                         % (backend,))
    agent_path = find_agent(agent)
    cloudpickle = _cloudpickle(agent_path)
    kwargs = dict(kwargs or {})
    call = _pickle_call(cloudpickle, fn, args, kwargs)

    workdir = tempfile.mkdtemp(prefix="spawnpoint-launch-")
    agent_proc = None
    try:
        job_name = name or job_name_for(fn)
        manifest = make_manifest(
            job_name, nprocs, gpus, backend, max_restarts,
            command=[sys.executable, _ENTRY, workdir], cwd=os.getcwd(),
            env=rank_environment(sys.path, env), spec=spec)
        status_path = status_file or os.path.join(workdir, "status.json")
        _write(os.path.join(workdir, "job.json"), json.dumps(manifest, indent=2).encode())
        _write(os.path.join(workdir, "call.pkl"), _call_record(call, return_all))
        command = [agent_path, "run", "-f", os.path.join(workdir, "job.json"),
                   "--master-port", str(int(master_port)), "--metrics-addr", str(metrics_addr),
                   "--status-file", status_path, "--grace-period", str(grace_period)]
        command += [str(a) for a in agent_args]
        _say("%s on %d %s rank%s, backend %s, %s: %s" % (
            _describe(fn), nprocs, "GPU" if gpus else "CPU", "" if nprocs == 1 else "s",
            backend if backend != "auto" else ("nccl" if gpus else "gloo"), sys.executable,
            shlex.join(command)))
        agent_proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, bufsize=0)
        pump = _Pump(agent_proc)
        try:
            pump.run()
        except BaseException as err:  # KeyboardInterrupt, mostly: nothing may be left behind
            _stop(agent_proc, pump, grace_period, "interrupted" if isinstance(
                err, KeyboardInterrupt) else "%s here" % type(err).__name__)
            raise
        exit_code = agent_proc.wait()
        return _outcome(workdir, status_path, exit_code, nprocs, return_all, pump.agent_lines)
    finally:
        if agent_proc is not None:
            if agent_proc.poll() is None:  # an error, or an interrupt, before the pump ran
                _stop(agent_proc, None, grace_period, "stopped early")
            agent_proc.stdout.close()
            agent_proc.stderr.close()
        shutil.rmtree(workdir, ignore_errors=True)


def find_agent(agent=None):
    """The spawnpoint-agent to run: `agent`, else $SPAWNPOINT_AGENT, else the one beside this
    package (<prefix>/bin with the package in <prefix>/share/spawnpoint/python), else PATH's.
    Raises LaunchError naming every place looked at."""
    tried = []
    for where, path in (("agent=", agent), ("$" + AGENT_ENV, os.environ.get(AGENT_ENV))):
        if path:
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return os.path.abspath(path)
            raise LaunchError("spawnpoint.launch: %s names %s, which is not an executable file"
                              % (where, path))
        tried.append("%s (not set)" % where)
    beside = os.path.join(os.path.dirname(os.path.dirname(_SHARE_DIR)), "bin",
                          "spawnpoint-agent")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    tried.append(beside)
    on_path = shutil.which("spawnpoint-agent")
    if on_path:
        return os.path.abspath(on_path)
    tried.append("PATH")
    raise LaunchError("spawnpoint.launch: no spawnpoint-agent found; looked at %s. Pass agent=, "
                      "set %s to the agent's path (build/bin/spawnpoint-agent after make build, "
                      "or bin/spawnpoint-agent of the agent bundle), or put it on PATH"
                      % (", ".join(tried), AGENT_ENV))


def job_name_for(fn):
    """A TrainingJob name (lowercase letters, digits and '-', starting with a letter, at most
    52 characters) made from fn's name: train_model -> train-model, <lambda> -> lambda."""
    base = getattr(fn, "__name__", None) or type(fn).__name__
    base = re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-")
    base = re.sub(r"^[^a-z]+", "", base)[:52].rstrip("-")
    return base or "launch"


def rank_environment(path, env):
    """The ranks' environment on top of the caller's (which the agent passes on): PYTHONPATH
    as the caller's sys.path (the current directory for ''), so the ranks and their loader
    workers import what the caller can, and `env`'s names. Returns [{"name", "value"}]."""
    entries = []
    for entry in path:
        entry = os.path.abspath(entry) if entry else os.getcwd()
        if entry not in entries:
            entries.append(entry)
    merged = {"PYTHONPATH": os.pathsep.join(entries)}
    for key, value in (env or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError("spawnpoint.launch: env must map str to str; %r: %r" % (key, value))
        merged[key] = value
    return [{"name": k, "value": v} for k, v in merged.items()]


def make_manifest(name, nprocs, gpus, backend, max_restarts, command, cwd, env, spec=None):
    """The TrainingJob (docs/trainingjob.md) of one launch, as a dict: one node, `nprocs` ranks
    (one GPU each with gpus), the trainer container running `command` in `cwd` with `env`,
    `spec` merged on top (a nested dict merges key by key; the trainer's command, working
    directory and environment are the launcher's and cannot be replaced)."""
    job_spec = {
        "nodes": 1,
        "gpusPerNode": nprocs if gpus else 0,
        "backend": backend,
        "template": {"spec": {"containers": [{
            "name": "trainer", "command": list(command), "workingDir": cwd, "env": env}]}},
        "restartPolicy": {"maxRestarts": max_restarts},
    }
    if not gpus:
        job_spec["procsPerNode"] = nprocs
    if spec:
        if not isinstance(spec, dict):
            raise TypeError("spawnpoint.launch: spec must be a dict of TrainingJob spec fields")
        if "template" in spec:
            raise ValueError("spawnpoint.launch: spec.template is the launcher's (the ranks run "
                             "fn); give the ranks' environment with env=")
        for key in ("nodes", "gpusPerNode", "procsPerNode"):
            if key in spec:
                raise ValueError("spawnpoint.launch: spec.%s: say nprocs= and gpus= instead"
                                 % key)
        _merge(job_spec, spec)
    return {"apiVersion": "spawnpoint.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": name}, "spec": job_spec}


def _merge(into, extra):
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _cloudpickle(agent_path):
    """This environment's cloudpickle, else the copy shipped beside this package or beside the
    agent (share/spawnpoint/python-deps), appended to sys.path (the ranks get the same path,
    so both sides use the same version)."""
    try:
        import cloudpickle
        return cloudpickle
    except ImportError:
        pass
    candidates = [os.path.join(_SHARE_DIR, "python-deps"),
                  os.path.join(os.path.dirname(os.path.dirname(agent_path)), "share",
                               "spawnpoint", "python-deps")]
    for deps in candidates:
        if os.path.isdir(os.path.join(deps, "cloudpickle")):
            if deps not in sys.path:
                sys.path.append(deps)
            import cloudpickle
            return cloudpickle
    raise LaunchError("spawnpoint.launch: no cloudpickle: this Python has none and neither %s "
                      "holds one (the agent ships it there; scripts/install-deps.sh fetches "
                      "it), or pip install cloudpickle" % " nor ".join(candidates))


def _pickle_call(cloudpickle, fn, args, kwargs):
    try:
        return dumps_keeping_filenames(cloudpickle, (fn, tuple(args), kwargs))
    except Exception as err:
        raise LaunchError("spawnpoint.launch: %s or its arguments cannot be sent to the ranks "
                          "(cloudpickle: %s: %s); what fn uses must be picklable: create locks, "
                          "open files and connections inside fn" % (
                              _describe(fn), type(err).__name__, err)) from err


def dumps_keeping_filenames(cloudpickle, obj):
    """cloudpickle.dumps(obj), but code objects keep their co_filename: cloudpickle 3 writes
    "<dynamic-code>" there, and a rank's traceback would show neither the file nor the line of
    a function defined in the caller. Where this cloudpickle lacks the names it takes (its
    Pickler's dispatch_table and its code reducer), plain cloudpickle.dumps."""
    import collections
    import io
    import pickle
    import types

    base = getattr(cloudpickle, "Pickler", None)
    reduce_code = getattr(getattr(cloudpickle, "cloudpickle", None), "_code_reduce", None)
    table = getattr(base, "dispatch_table", None)
    if base is None or reduce_code is None or not isinstance(table, collections.abc.Mapping):
        return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)

    def code_reduce(code):
        make, args = reduce_code(code)
        args = list(args)
        for i, arg in enumerate(args):
            if isinstance(arg, str) and arg == "<dynamic-code>":
                args[i] = code.co_filename
                break
        return make, tuple(args)

    class Pickler(base):
        dispatch_table = collections.ChainMap({types.CodeType: code_reduce}, table)

    buffer = io.BytesIO()
    Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


def _call_record(call, return_all):
    """call.pkl: what _launched.py reads (plain pickle; only the call needs cloudpickle)."""
    import linecache
    import pickle

    lines, size = {}, 0
    for filename, entry in list(linecache.cache.items()):
        # Source with no file behind it (IPython's cells, named /tmp/ipykernel_PID/N.py), so
        # the ranks' tracebacks show the lines of functions defined in cells.
        if len(entry) != 4 or not isinstance(entry[2], list) or os.path.exists(filename):
            continue
        size += sum(len(line) for line in entry[2])
        if size > MAX_SHIPPED_SOURCE:
            break
        lines[filename] = list(entry[2])
    return pickle.dumps({"format": FORMAT, "call": call, "return_all": bool(return_all),
                         "lines": lines}, protocol=pickle.HIGHEST_PROTOCOL)


def _write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def _describe(fn):
    return "%s()" % (getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
                     or type(fn).__name__)


def _say(message):
    stream = sys.stderr
    stream.write("[spawnpoint] launch: %s\n" % message)
    stream.flush()


class _Pump:
    """Copies the agent's stdout and stderr to this process's sys.stdout and sys.stderr, line
    by line, as they come; keeps the agent's own last lines (its stderr but the ranks') for
    errors.
    Runs on the caller's thread (a KeyboardInterrupt lands in run())."""

    KEEP = 40

    def __init__(self, proc):
        self.proc = proc
        self.selector = selectors.DefaultSelector()
        self.partial = {}
        self.agent_lines = []
        for pipe, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
            os.set_blocking(pipe.fileno(), False)
            self.selector.register(pipe.fileno(), selectors.EVENT_READ, name)
            self.partial[name] = b""

    def run(self, deadline=None):
        """Until both pipes are closed, or the agent has exited and nothing more is there to
        read (a stray process of its may hold a pipe), or `deadline` (time.monotonic())."""
        while self.selector.get_map():
            timeout = 0.5
            if deadline is not None:
                timeout = min(timeout, deadline - time.monotonic())
                if timeout <= 0:
                    return
            events = self.selector.select(timeout)
            if not events and self.proc.poll() is not None:
                self._drain()
                return
            for key, _ in events:
                self._read(key.fd, key.data)
        self._flush_partial()

    def _read(self, fd, name):
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        self._take(fd, name, data)

    def _take(self, fd, name, data):
        if not data:  # end of file
            self.selector.unregister(fd)
            self._emit(name, self.partial[name], final=True)
            self.partial[name] = b""
            return
        *lines, self.partial[name] = (self.partial[name] + data).split(b"\n")
        for line in lines:
            self._emit(name, line)

    def _drain(self):
        """What the pipes hold now, without waiting for more."""
        for fd, key in list(self.selector.get_map().items()):
            while fd in self.selector.get_map():
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    break
                self._take(fd, key.data, data)
        self._flush_partial()

    def _flush_partial(self):
        for name, rest in self.partial.items():
            if rest:
                self._emit(name, rest, final=True)
                self.partial[name] = b""

    def _emit(self, name, line, final=False):
        if final and not line:
            return
        text = line.decode("utf-8", "replace")
        if name == "stderr" and not text.startswith("[rank "):
            self.agent_lines = (self.agent_lines + [text])[-self.KEEP:]
        stream = sys.stdout if name == "stdout" else sys.stderr
        stream.write(text + "\n")
        stream.flush()


def _stop(proc, pump, grace_period, why):
    """Stops the agent with SIGTERM (it stops every rank, SIGTERM then SIGKILL after the grace
    period, and reaps them and their descendants; SIGINT would do the same, but a process
    started where SIGINT is ignored inherits that), copying its last lines, and waits for it;
    SIGKILL if it has not ended STOP_MARGIN seconds past the grace period. A further
    KeyboardInterrupt meanwhile does not cut the stop short."""
    _say("%s: stopping the agent and its ranks" % why)
    try:
        proc.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + float(grace_period) + STOP_MARGIN
    while True:
        try:
            if pump is not None:
                pump.run(deadline)
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            return
        except KeyboardInterrupt:
            continue
        except subprocess.TimeoutExpired:
            _say("the agent did not stop within %.0f s: killed"
                 % (float(grace_period) + STOP_MARGIN))
            proc.kill()
            proc.wait()
            return


def _outcome(workdir, status_path, exit_code, nprocs, return_all, agent_lines):
    """What the agent's end means for the caller: the result, or the exception to raise."""
    import pickle

    status = _read_status(status_path)
    if exit_code == 0:
        results = []
        for rank in range(nprocs if return_all else 1):
            path = os.path.join(workdir, "result-%d.pkl" % rank)
            try:
                with open(path, "rb") as f:
                    results.append(pickle.load(f))
            except FileNotFoundError:
                raise LaunchError("spawnpoint.launch: rank %d exited 0 without returning from fn "
                                  "(os._exit?): no result" % rank, exit_code, agent_lines)
        return results if return_all else results[0]
    failure = (status or {}).get("lastFailure")
    if exit_code == 1 and failure and failure.get("rank", -1) >= 0:
        raise _rank_failure(workdir, failure, status, exit_code, agent_lines)
    what = ("the agent was stopped by signal %d" % (exit_code - 128) if exit_code > 128
            else "bad input (exit code 2)" if exit_code == 2
            else "the agent failed (exit code %d)" % exit_code)
    raise LaunchError("spawnpoint.launch: %s%s" % (
        what, "".join("\n  " + line for line in agent_lines[-3:])),
                      exit_code, agent_lines)


def _read_status(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _rank_failure(workdir, failure, status, agent_exit_code, agent_lines):
    """The exception for the failing rank: the rank's own one, rebuilt, with a RankFailed as
    its __cause__; else that RankFailed."""
    import pickle

    rank = failure["rank"]
    restarts = status.get("restarts", 0)
    record = None
    try:
        with open(os.path.join(workdir, "error-%d-%d.pkl" % (rank, restarts)), "rb") as f:
            record = pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError):
        pass
    cause = "%s: %s" % (failure.get("reason"), failure.get("message"))
    if restarts:
        cause += " (after %d restart%s)" % (restarts, "" if restarts == 1 else "s")
    for line in reversed(agent_lines):  # the agent's last line says why it did not restart
        said = re.search(r"\(not restarted: (.*)\)$", line)
        if said:
            cause += "; not restarted: %s" % said.group(1)
            break
    if record is not None:
        exception_type = record["type"]
        text = _name_cells(record["traceback"])
        headline = "%s: %s" % (record["type"], record["message"]) if record["message"] else \
            record["type"]
    else:
        exception_type = failure.get("exception")
        text = failure.get("logTail") or ""
        headline = failure.get("message") or "failed"
    message = "rank %d failed: %s\nthe agent's cause: %s" % (rank, headline, cause)
    if text.strip():
        message += "\n\nrank %d's %s:\n%s" % (
            rank, "traceback" if record is not None else "last lines", text.rstrip("\n"))
    exc = None
    why_not = record.get("why_not") if record else None
    if record is not None and record.get("exception") is not None:
        try:
            exc = pickle.loads(record["exception"])
            if not isinstance(exc, BaseException):
                why_not, exc = "not an exception: %r" % type(exc), None
        except Exception as err:
            why_not = "%s: %s" % (type(err).__name__, err)
    if record is not None and exc is None:
        message += "\n(rank %d's %s could not be rebuilt here: %s)" % (rank, exception_type,
                                                                       why_not)
    failed = RankFailed(message, rank, failure, text, exception_type, restarts, agent_exit_code,
                        agent_lines)
    if exc is None:
        return failed
    exc.__cause__ = failed
    if hasattr(exc, "add_note"):  # 3.11: said at the exception itself too
        exc.add_note("(raised on rank %d; its traceback is above)" % rank)
    return exc


def _name_cells(text):
    """A traceback's frames of IPython cells named as IPython names them, `Cell In [5], line
    6` rather than `File "/tmp/ipykernel_PID/N.py", line 6`; text as it is outside IPython."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    cells = getattr(getattr(shell, "compile", None), "_filename_map", None)
    if not isinstance(cells, dict):
        return text
    for filename, number in cells.items():
        if isinstance(number, int):
            text = text.replace('File "%s", line' % filename, "Cell In [%d], line" % number)
    return text
