"""At interpreter exit: torch.distributed's native threads finish before finalization starts.

`register(distmod)` is called by the torch.distributed hook (_distributed.patch), once per
process, while torch is being imported; the atexit handler it adds therefore runs after every
handler the trainer or its libraries register later (atexit runs them last-in, first-out).

Why: a collective's tensors are released by the process group's worker thread (gloo's) just
after the trainer's wait() has returned. When the trainer had already dropped its own
reference (`dist.all_reduce(torch.tensor(x))`, as Lightning's reductions do), that release
frees a Python object and so takes the GIL. If the main thread has begun to finalize the
interpreter by then, CPython ends the worker with pthread_exit, whose unwinding through
torch's noexcept destructors calls std::terminate: a rank that finished its work dies with
SIGABRT, "terminate called without an active exception" (pytorch/pytorch#190489, open; a
torch fix registering destroy_process_group at exit, #179291, was abandoned). On a busy
machine the worker may wait for a CPU long enough to lose that race. Measured with Debian
13's torch 2.6 on 2 busy cores: a 2-rank gloo script that exits right after 200 all_reduces
crashed in 4 of 80 rank exits, with this handler in 0 of 160; as 2-rank jobs under the agent
(frameworks_gloo_exit, 12 jobs a run) every one of 4 runs without the handler had a job fail,
none of 5 with it (one of them beside two busy loops). Lightning's DDP tests of this project
failed so in about 1 of 30 runs.

What the handler does, only when a default process group exists: it sleeps in short steps
(each releases the GIL, so a worker waiting for it finishes) until no other thread of the
process is runnable, at least one step and at most LIMIT seconds (a thread that stays busy,
an OpenMP pool spinning, only costs that bound). destroy_process_group() is not the fix: in
torch 2.6 the gloo group's destructor waits for its workers while holding the GIL (a
deadlock with the release above, seen here), and a DDP model keeps the group alive anyway.
"""

import atexit
import os
import threading
import time

STEP = 0.005  # seconds per sleep
LIMIT = 0.2   # seconds at most, per process exit

_registered = []


def settle(others_runnable, sleep, step=STEP, limit=LIMIT):
    """Sleeps `step` at a time until others_runnable() is false, at least once and for at most
    `limit` in all; returns the time slept (the sum of the steps)."""
    slept = 0.0
    while True:
        sleep(step)
        slept += step
        if slept >= limit - 1e-9 or not others_runnable():
            return slept


def runnable_tasks(task_dir="/proc/self/task", own_tid=None):
    """The thread ids under task_dir (Linux's /proc/<pid>/task) in state R, but own_tid (this
    thread by default); [] where /proc cannot be read."""
    if own_tid is None:
        own_tid = threading.get_native_id()
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return []
    runnable = []
    for tid in tids:
        try:
            with open(os.path.join(task_dir, tid, "stat")) as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        # "tid (comm) S ...": comm may hold spaces and parentheses; the state follows the last ')'.
        fields = stat[stat.rfind(")") + 1:].split()
        if fields and fields[0] == "R" and tid != str(own_tid):
            runnable.append(int(tid))
    return runnable


def at_exit(distmod, others_runnable=runnable_tasks, sleep=time.sleep):
    """The handler: settle() when distmod has an initialized default process group. Never
    raises: the process is exiting, and its exit status is the trainer's."""
    try:
        if not (distmod.is_available() and distmod.is_initialized()):
            return None
        return settle(lambda: bool(others_runnable()), sleep)
    except Exception:
        return None


def register(distmod):
    """Adds the atexit handler for distmod (torch.distributed), once per process."""
    if not _registered:
        _registered.append(distmod)
        atexit.register(at_exit, distmod)
