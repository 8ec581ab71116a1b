"""Post-import hook for torch.distributed: USE_LIBUV=0 where this torch has no libuv,
_exit.py's handler that lets the process group's threads finish before the interpreter does,
the collectives' timing (_collective.py) and an env:// rendezvous that does not lose a second
to rank 0's store starting late (_rendezvous.py).

`patch(distmod)` is called by the bootstrap (sitecustomize.py) right after torch.distributed
is first executed (which `import torch` does); call it only from there. Since torch 2.4 a
TCPStore server uses libuv unless USE_LIBUV=0, and a torch built without libuv (Debian 13's
2.6) then fails every env:// or tcp:// rendezvous with "use_libuv was requested but PyTorch
was build without libuv support". So, per policy.libuv_decision: USE_LIBUV set by the user
is kept; on torch older than 2.4 (1.13 has neither libuv nor USE_LIBUV) nothing happens;
otherwise the hook finds out whether TCPStore has libuv and, if not, sets
os.environ['USE_LIBUV'] = '0' (read by torch at rendezvous, not at import) and says so once
on stderr. Multiprocessing children (torch's own spawned loader workers) are left alone, the
probe included: they inherit the rank's USE_LIBUV and do not rendezvous
(multiprocessing_child() tells them by the interpreter's command line, not by sys.argv).

The probe: torch exposes no build flag for libuv (TCPStore.libuvBackend is a property of a
store, and torch.__config__.show() does not list it); TCPStore's constructor checks it before
it touches a socket. So the probe asks for a libuv server store on port 0 (an ephemeral port,
its client on 127.0.0.1, no workers waited for): without libuv that fails at once with the
message above; with libuv the store starts and is closed again (a few ms, once per process
that imports torch, multiprocessing children excepted). Any other outcome counts as "unknown"
and changes nothing, which is also the right answer for a torch with libuv.
"""

import datetime
import os
import sys

from . import _collective, _exit, _rendezvous
from ._report import report_once
from .policy import DISABLE, PROBE, libuv_decision

NOTE = ("set USE_LIBUV=0: this torch %s was built without libuv, and its TCPStore "
        "rendezvous would fail ('use_libuv was requested but PyTorch was build without libuv "
        "support'); set USE_LIBUV yourself to override")


def probe_libuv(tcp_store):
    """True/False: whether tcp_store (torch.distributed.TCPStore) has the libuv backend;
    None when the probe could not tell."""
    try:
        store = tcp_store(host_name="127.0.0.1", port=0, world_size=None, is_master=True,
                          timeout=datetime.timedelta(seconds=10), wait_for_workers=False,
                          use_libuv=True)
    except Exception as err:  # "...was build (built) without libuv support"
        return False if "without libuv" in str(err) else None
    return bool(getattr(store, "libuvBackend", True))


def apply_libuv_policy(torch_version, probe, environ, say):
    """Runs policy.libuv_decision, calling probe() only if the decision needs it; on DISABLE
    sets environ['USE_LIBUV'] = '0' and passes the note to say(). Returns the decision."""
    decision = libuv_decision(torch_version, None, environ)
    if decision == PROBE:
        decision = libuv_decision(torch_version, probe(), environ)
    if decision == DISABLE:
        environ["USE_LIBUV"] = "0"
        say(NOTE % torch_version)
    return decision


_decision = None  # apply_libuv_policy's, in this process


def attempt_environment_taken():
    """A released standby rank (sitecustomize): its USE_LIBUV=0, set in the standby's
    environment, set again in the attempt's unless that one sets USE_LIBUV."""
    if _decision == DISABLE and "USE_LIBUV" not in os.environ:
        os.environ["USE_LIBUV"] = "0"


_patched = False  # patch() did its work in this process


def multiprocessing_child(orig_argv=None, argv=None, current=None):
    """Whether this process is a child multiprocessing started (spawn or forkserver), as
    seen while it imports torch (in spawn.prepare(), or unpickling its target). Not from
    sys.argv alone: prepare() has already replaced it with the parent's. The interpreter's
    own command line (sys.orig_argv, Python 3.10+) still carries --multiprocessing-fork (or
    the forkserver's main); before 3.10, the current process object is marked as
    inheriting while spawn's _main() prepares it. The arguments are seams for tests."""
    if orig_argv is None:
        orig_argv = getattr(sys, "orig_argv", None) or []
    args = list(orig_argv) + list(sys.argv if argv is None else argv)
    if "--multiprocessing-fork" in args or any("multiprocessing.forkserver" in str(a)
                                               for a in args):
        return True
    if current is None:
        process = sys.modules.get("multiprocessing.process")
        current = process.current_process() if process is not None else None
    return bool(getattr(current, "_inheriting", False))


def patch(distmod):
    torch = sys.modules.get("torch")
    tcp_store = getattr(distmod, "TCPStore", None)
    if torch is None or tcp_store is None or multiprocessing_child():
        return
    global _patched
    _patched = True
    _exit.register(distmod)
    _collective.patch_functions(distmod)
    _rendezvous.patch_init(distmod)
    # torch is still being imported: its __version__ may not be set yet, torch.version's is.
    version = getattr(torch, "__version__", None) or getattr(
        sys.modules.get("torch.version"), "__version__", "")
    global _decision
    _decision = apply_libuv_policy(str(version), lambda: probe_libuv(tcp_store), os.environ,
                                   report_once)
