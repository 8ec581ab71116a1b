"""What a trainer's script defines, sent to loader workers by value: cloudpickle.

A forked worker inherits the script's classes, functions and lambdas; a spawned one must get
them through pickle, which names them by module and so makes the worker import the script
(running its top level again) and cannot name a lambda or a local function at all.
cloudpickle sends them by value instead (code, closure and the globals they use), which is how
a fork-written script, with no main guard and a lambda collate_fn, runs on spawned workers.

The trainer's environment's own cloudpickle is used when it has one (the rank and its workers
run the same interpreter and sys.path, so both sides load the same version); otherwise the
copy the agent ships beside the shim, bin/../share/spawnpoint/python-deps (pinned by
scripts/install-tools.sh), appended to sys.path, after everything of the trainer's.
Thread-safe after the first call (imports hold the import lock).
"""

import os
import sys

DEPS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        os.pardir, "python-deps")
_missing = []  # [reason] once cloudpickle was found missing
_last_error = []  # [why the last dumps() fell back to plain pickle]


def cloudpickle():
    """The cloudpickle module, or None when neither the environment nor the agent has one."""
    module = sys.modules.get("cloudpickle")
    if module is not None:
        return module
    if _missing:
        return None
    try:
        import cloudpickle as module
        return module
    except ImportError:
        pass
    deps = os.path.normpath(DEPS_DIR)
    if os.path.isdir(os.path.join(deps, "cloudpickle")) and deps not in sys.path:
        sys.path.append(deps)
    try:
        import cloudpickle as module
        return module
    except ImportError as err:
        _missing.append(str(err))
        return None


def dumps(obj, protocol):
    """(bytes, True) pickled by cloudpickle (what __main__ and closures define, by value), or
    (bytes, False) by plain pickle when cloudpickle is missing or cannot pickle obj (e.g. a
    global of the script it would have to copy holds a lock) and plain pickle can. Raises what
    plain pickle raises when neither can."""
    import pickle

    module = cloudpickle()
    if module is not None:
        try:
            return module.dumps(obj, protocol=protocol), True
        except Exception as err:
            _last_error[:] = ["cloudpickle: %s: %s" % (type(err).__name__, err)]
    else:
        _last_error[:] = ["no cloudpickle (%s)" % (_missing[0] if _missing else "?")]
    return pickle.dumps(obj, protocol=protocol), False


def why_not():
    """Why the last dumps() was not by value, or None."""
    return _last_error[0] if _last_error else (_missing[0] if _missing else None)
