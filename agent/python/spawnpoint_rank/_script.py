"""The trainer's script as spawned children see it: does this call come from a line of the
script that a child would run again?

Under spawn every child process (a DataLoader worker, a multiprocessing Pool's worker) imports
the parent's main script under the name __mp_main__ before it does its work, so it runs the
script's top level again, minus what sits under `if __name__ == "__main__":`. A script written
for fork often has no such guard: its child then calls init_process_group a second time (a
port clash) or starts processes of its own while it is bootstrapping. `unguarded_call()` tells
the parent before it spawns anything, so the shim can say so in one line.

Pure Python, standard library only, imported only when a process is about to be spawned.
Thread-safe (the parsed scripts are cached under a lock).
"""

import ast
import os
import sys
import threading

_lock = threading.Lock()
_parsed = {}  # path -> (mtime, size, [(first line, last line, guarded)]) of top-level statements


def _mentions_name(test):
    """Whether an if statement's test reads __name__ (`__name__ == "__main__"`, reversed,
    `!=` with an else, `in (...)`): a guard a child evaluates differently."""
    return any(isinstance(node, ast.Name) and node.id == "__name__" for node in ast.walk(test))


def _statements(path):
    """[(first line, last line, guarded)] of the script's top-level statements, or None when
    it cannot be read or parsed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (st.st_mtime_ns, st.st_size)
    with _lock:
        cached = _parsed.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None
    out = []
    for node in tree.body:
        last = getattr(node, "end_lineno", None) or node.lineno
        guarded = isinstance(node, ast.If) and _mentions_name(node.test)
        out.append((node.lineno, last, guarded))
    if sys.version_info < (3, 8):  # no end_lineno: a statement ends where the next begins
        out = [(first, (out[i + 1][0] - 1 if i + 1 < len(out) else 1 << 30), guarded)
               for i, (first, _, guarded) in enumerate(out)]
    with _lock:
        _parsed[path] = (key, out)
    return out


def main_script():
    """The path a spawned child would run as __mp_main__, or None (an interactive session,
    `python -c`, or a main module without a file: children run nothing of it)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or not isinstance(path, str) or not path.endswith(".py"):
        return None
    if getattr(sys.flags, "interactive", 0):
        return None
    return os.path.abspath(path)


def unguarded_call(depth=1):
    """(script path, line) when the caller's stack runs through a top-level statement of the
    main script that is not under an `if __name__ ...:` test (so a spawned child, importing
    the script, would run that statement too); None otherwise, or when it cannot tell.
    `depth` frames of the caller are skipped (they are the shim's own)."""
    main = sys.modules.get("__main__")
    path = main_script()
    if path is None:
        return None
    from . import _private

    if _private.missing("unguarded_script"):
        return None  # said once: cannot tell
    try:
        frame = sys._getframe(depth + 1)
    except ValueError:
        return None
    namespace = main.__dict__
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is namespace:
            break
        frame = frame.f_back
    if frame is None:
        return None
    line = frame.f_lineno
    statements = _statements(path)
    if statements is None:
        return None
    for first, last, guarded in statements:
        if first <= line <= last:
            return None if guarded else (path, line)
    return None


def advice(where, what, loader=False):
    """The one line the shim says when `what` (e.g. "starts DataLoader workers") comes from
    the unguarded line `where` of the script; `loader`: for a DataLoader, which the agent's
    loader pool would have served without the guard."""
    path, line = where
    return ("%s:%d %s at the script's top level; under spawn each child process imports the "
            "script and would run it again (a second init_process_group, more children). Put "
            "the training under `if __name__ == \"__main__\":`%s" % (
                os.path.basename(path), line, what,
                " (the agent's loader pool, loader.pythonPool: true, needs no guard)"
                if loader else ""))
