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

from two_nodes import alive, fail_like_gloo, path, read_pid, wait_for, write

EXCEPTION = "the rank's own failure, printed before its peer's"
FINALIZING = 0.15


def finalize():
    # CPython printed the traceback before it began to finalize, which runs this.
    write("traceback-printed", "")
    rank0 = read_pid("rank0.pid")
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
    fail_like_gloo()


main()
