"""The rank's side of spawnpoint.launch(): `python .../spawnpoint/_launched.py DIR`.

The trainer command of the job launcher.py makes, run by path (not `-m`), so a rank runs the
copy of this file that the caller's package has, whatever package the agent's shim brings.
It reads DIR/call.pkl (the format is launcher.py's), calls fn(*args, **kwargs) once, and
writes what came of it for the caller: DIR/result-R.pkl (rank 0's, or every rank's with
return_all), or DIR/error-R-A.pkl (the exception, its traceback, for attempt A) and the same
traceback on stderr, where the agent reads the rank's cause; exit status 1 then, without the
interpreter's finalization (_end says why). Nothing else
crosses: the rank's environment is the job's (torchrun's variables, SPAWNPOINT_BACKEND,
PYTHONPATH as the caller's sys.path). Standard library only, and the caller's cloudpickle.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
FORMAT = 1  # launcher.FORMAT
FAILED = 1  # the exit status of a rank whose fn raised (the agent's cause: the traceback's)


def main(argv):
    _leave_package_dir()
    if len(argv) != 2:
        sys.stderr.write("usage: %s DIR (run by spawnpoint.launch)\n" % argv[0])
        return 2
    workdir = argv[1]
    rank = int(os.environ.get("RANK", "0"))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    for stream in (sys.stdout, sys.stderr):  # each line reaches the caller as it is printed
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)
    import pickle

    with open(os.path.join(workdir, "call.pkl"), "rb") as f:
        record = pickle.load(f)
    if record.get("format") != FORMAT:
        sys.stderr.write("spawnpoint.launch: call.pkl has format %r, this rank reads %d: the "
                         "caller's spawnpoint package and %s differ\n"
                         % (record.get("format"), FORMAT, __file__))
        return 2
    _add_source_lines(record.get("lines", {}))
    try:
        fn, args, kwargs = pickle.loads(record["call"])
    except BaseException as exc:
        return _failed(workdir, rank, attempt, exc,
                       "could not rebuild the launched function on rank %d" % rank)
    try:
        result = fn(*args, **kwargs)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
        result = None
    except BaseException as exc:
        return _failed(workdir, rank, attempt, exc, None)
    if rank == 0 or record.get("return_all"):
        try:
            data = _dumps(result)
        except Exception as exc:
            try:
                raise TypeError("rank %d's return value (%s) cannot be sent back: %s: %s"
                                % (rank, type(result).__name__, type(exc).__name__, exc)) from exc
            except TypeError as err:
                return _failed(workdir, rank, attempt, err, None)
        _write_atomically(os.path.join(workdir, "result-%d.pkl" % rank), data)
    return 0


def _leave_package_dir():
    """A script's directory leads sys.path: this package's, whose modules are not top-level."""
    if sys.path and sys.path[0] and os.path.realpath(sys.path[0]) == os.path.realpath(_HERE):
        del sys.path[0]


def _add_source_lines(lines):
    """The caller's source with no file behind it, for tracebacks; no mtime, so that
    linecache.checkcache() keeps the entries rather than look for the files."""
    import linecache

    for filename, source in lines.items():
        linecache.cache.setdefault(filename, (sum(map(len, source)), None, source, filename))


def _dumps(obj):
    import pickle

    try:
        import cloudpickle
    except ImportError:  # the caller had it from a path the rank lacks: plain pickle then
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _failed(workdir, rank, attempt, exc, context):
    """Writes error-R-A.pkl and the traceback on stderr (without this file's frames); FAILED."""
    import pickle
    import traceback

    tb = exc.__traceback__
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) == os.path.abspath(
            __file__):
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    if context:
        text = "%s:\n%s" % (context, text)
    cls = type(exc)
    name = cls.__qualname__ if cls.__module__ in ("builtins", "__main__") else \
        "%s.%s" % (cls.__module__, cls.__qualname__)
    try:
        message = str(exc)
    except Exception as err:
        message = "<str() failed: %s>" % err
    try:
        pickled, why_not = _dumps(exc), None
    except Exception as err:
        pickled, why_not = None, "%s: %s" % (type(err).__name__, err)
    record = {"type": name, "message": message, "traceback": text, "exception": pickled,
              "why_not": why_not}
    _write_atomically(os.path.join(workdir, "error-%d-%d.pkl" % (rank, attempt)),
                      pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL))
    sys.stderr.write(text)
    sys.stderr.flush()
    return FAILED


def _write_atomically(path, data):
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def _end(code):
    """Ends a rank whose fn raised right after its exit handlers (atexit: logging, the shim's
    wait for gloo's threads) and stdout and stderr are flushed, without the interpreter's
    finalization, as the agent ends the ranks it stops. Finalization tears torch down (0.1 s
    to 0.7 s measured) and closes the process group's connections on the way: a peer waiting
    in a collective then failed, and exited, before this rank did, and the agent could take
    the peer's CollectiveError for the cause. Exiting at once, the connections close with the
    exit, and this rank's failure is seen first."""
    run_exit_handlers = getattr(__import__("atexit"), "_run_exitfuncs", None)
    if run_exit_handlers is None:  # not CPython: finalize as usual
        sys.exit(code)
    run_exit_handlers()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


if __name__ == "__main__":
    status = main(sys.argv)
    if status == FAILED:
        _end(status)
    sys.exit(status)
