"""The event lines of the bench's trainers (bench/restart_vs_torchrun.py reads them)."""

import os
import time


def stamp(line):
    """One event line, appended to the file BENCH_EVENTS names (the bench reads it there,
    whatever the launcher does with stdout) and printed."""
    with open(os.environ["BENCH_EVENTS"], "a") as f:
        f.write(line + "\n")
    print(line, flush=True)


def phase(rank, attempt, name, wall=None):
    """`bench phase rank=R attempt=A name=N wall=T` (T: time.time() now, or `wall`)."""
    stamp("bench phase rank=%s attempt=%d name=%s wall=%.6f" % (
        rank, attempt, name, time.time() if wall is None else wall))
