"""Two ranks on two local nodes: node 1's rank raises an uncaught exception and is still
finalizing (an atexit handler stands for torch's teardown or a loader pool's shutdown) when
node 0's rank fails as gloo does once a peer's connections close. The gang's stop reaches
node 1's agent while its rank is alive but past its traceback. argv: <dir>. No torch: files
in <dir> are the only rendezvous.

Rank 1 stays FINALIZING seconds after rank 0 is gone (reaped: its agent has reported it to
the gang's coordinator, which stops node 1 at once): long enough that the stop finds it
alive, and well inside the half second node 1's agent waits for a rank that printed a
traceback (agent/run/gang_stop_check.h).
"""
import atexit
import os
import sys
import time

EXCEPTION = "the rank's own failure, printed before its peer's"
GLOO = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
        "Connection closed by peer [127.0.0.1]:29500")
FINALIZING = 0.15
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
    with open(path(name) + ".tmp", "w") as f:
        f.write(text)
    os.rename(path(name) + ".tmp", path(name))


def finalize():
    # CPython printed the traceback before it began to finalize, which runs this.
    write("traceback-printed", "")
    wait_for(lambda: os.path.exists(path("rank0.pid")))
    with open(path("rank0.pid")) as f:
        rank0 = int(f.read())
    wait_for(lambda: not alive(rank0))
    time.sleep(FINALIZING)


def main():
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        sys.exit("a failed attempt of this job is not to be restarted")
    if os.environ["RANK"] == "1":
        atexit.register(finalize)
        raise RuntimeError(EXCEPTION)
    wait_for(lambda: os.path.exists(path("traceback-printed")))
    write("rank0.pid", str(os.getpid()))
    print("Traceback (most recent call last):", file=sys.stderr)
    print('  File "train.py", line 12, in <module>', file=sys.stderr)
    print(GLOO, file=sys.stderr, flush=True)
    os._exit(1)


main()
