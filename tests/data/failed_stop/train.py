"""A rank for tests/agent/failed_stop_test.cc, written like a Lightning trainer where it
matters: its SIGTERM handler raises (the process runs on, through its exception, its atexit
handlers and the interpreter's finalization). Without torch.

It prints `started pid=P attempt=A`, writes RUN_DIR/ready-<rank> (the test's sign that the
handler is in place), then idles. In attempt 0 the rank FAILING_RANK (argv[2]), once the file
RUN_DIR/go exists, SIGKILLs itself; attempt 1 ends at once with status 0. At exit it leaves:
`atexit ran pid=P` from its atexit handler, left in stdout's buffer (whoever ends the process
must flush it), a record buffered in a logging.MemoryHandler (written to RUN_DIR/log-<pid>
only when logging shuts down), and, when the interpreter finalizes, `finalized pid=P` from a
module global's __del__.
Usage: train.py RUN_DIR FAILING_RANK."""
import atexit
import logging
import logging.handlers
import os
import signal
import sys
import time

run_dir, failing = sys.argv[1], int(sys.argv[2])
rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])


class Finalized:
    def __del__(self):
        os.write(1, b"finalized pid=%d\n" % os.getpid())


keep = Finalized()
target = logging.FileHandler(os.path.join(run_dir, "log-%d" % os.getpid()))
logging.getLogger().addHandler(logging.handlers.MemoryHandler(1000, logging.CRITICAL, target))
logging.getLogger().setLevel(logging.INFO)


def on_sigterm(signum, frame):
    raise RuntimeError("SIGTERM received: stopping like Lightning's handler")


signal.signal(signal.SIGTERM, on_sigterm)
atexit.register(lambda: print("atexit ran pid=%d" % os.getpid()))  # not flushed
print("started pid=%d attempt=%d" % (os.getpid(), attempt), flush=True)
open(os.path.join(run_dir, "ready-%d" % rank), "w").close()
logging.info("logged before exit pid=%d", os.getpid())
if attempt > 0:
    sys.exit(0)
while True:
    if rank == failing and os.path.exists(os.path.join(run_dir, "go")):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.02)
