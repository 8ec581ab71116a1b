"""What the two-node failure scripts share: files in the directory given as their first
argument are the only rendezvous of their ranks (no torch), every wait ends within a minute,
and a rank fails as gloo does when a peer's connections close."""
import os
import sys
import time

DEADLINE = time.monotonic() + 60


def path(name):
    return os.path.join(sys.argv[1], name)


def wait_for(condition):
    while not condition():
        if time.monotonic() > DEADLINE:
            sys.exit("timed out")
        time.sleep(0.01)


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def write(name, text):
    """Writes the file whole (a rename), so a reader never sees it half written."""
    with open(path(name) + ".tmp", "w") as f:
        f.write(text)
    os.rename(path(name) + ".tmp", path(name))


def read_pid(name):
    wait_for(lambda: os.path.exists(path(name)))
    with open(path(name)) as f:
        return int(f.read())


GLOO = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
        "Connection closed by peer [127.0.0.1]:29500")


def fail_like_gloo(*_):
    """Prints what a rank whose peer vanished prints, and exits 1 (also a signal handler)."""
    print("Traceback (most recent call last):", file=sys.stderr)
    print('  File "train.py", line 12, in <module>', file=sys.stderr)
    print(GLOO, file=sys.stderr, flush=True)
    os._exit(1)
