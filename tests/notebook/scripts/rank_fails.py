"""Run as __main__ by test_launch.py: failures of launched ranks, as the caller sees them.

    rank_fails.py PORT

Prints one "RESULT <json>" line: for each case, the exception launch() raised (its type,
its __cause__, the RankFailed's fields) or what it returned.
  exception      rank 1 raises Refused, a class defined here: rebuilt in the caller; rank 1
                 ends after its atexit handlers, without the interpreter's finalization
  unpicklable    rank 1 raises an exception holding a lock: RankFailed instead
  unreturnable   fn returns a lock: a TypeError on rank 0 that says so
  killed         rank 1 SIGKILLs itself: RankFailed with the agent's cause (no traceback)
  restarted      the same with max_restarts=1: the second attempt's results come back
"""

import json
import os
import signal
import sys
import threading

import spawnpoint

PORT = int(sys.argv[1])


class Refused(Exception):
    pass


class Locked(Exception):
    def __init__(self, message):
        super().__init__(message)
        self.lock = threading.Lock()  # cloudpickle cannot pickle it


class Finalized:
    """Says when the interpreter's finalization destroys it."""

    def __del__(self, write=os.write):  # os's names are None by then
        write(1, b"rank 1 was finalized\n")


def check_rank(rank):
    if rank == 1:
        import atexit

        atexit.register(print, "rank 1's exit handlers ran")
        sys.modules["__main__"].finalized = Finalized()  # destroyed by finalization
        raise Refused("rank one refuses")


def refuse():
    import torch.distributed as dist

    dist.init_process_group("gloo")
    check_rank(dist.get_rank())
    dist.barrier()  # rank 0 waits here until the agent stops it


def locked():
    if os.environ["RANK"] == "1":
        raise Locked("rank one holds a lock")
    signal.pause()  # until the agent stops it


def unreturnable():
    return threading.Lock()


def killed():
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1 and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    return int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def describe(err):
    cause = err.__cause__ if isinstance(err.__cause__, spawnpoint.RankFailed) else err
    fields = {}
    if isinstance(cause, spawnpoint.RankFailed):
        fields = {k: getattr(cause, k) for k in ("rank", "exit_code", "signal", "reason", "cause",
                                                 "restarts", "exception_type", "traceback")}
        fields["str"] = str(cause)
    return {"type": type(err).__name__, "is_callers_class": type(err) in (Refused, Locked),
            "str": str(err), "cause_type": type(err.__cause__).__name__, "failed": fields}


def attempt(fn, **kwargs):
    try:
        return {"returned": spawnpoint.launch(fn, nprocs=2, master_port=PORT, **kwargs)}
    except Exception as err:
        return {"raised": describe(err)}


if __name__ == "__main__":
    print("RESULT " + json.dumps({
        "exception": attempt(refuse),
        "unpicklable": attempt(locked),
        "unreturnable": attempt(unreturnable),
        "killed": attempt(killed),
        "restarted": attempt(killed, max_restarts=1, return_all=True),
    }))
