"""The rank side's private names (agent/python/spawnpoint_rank/_private.py) in this root's
Python and torch: `python -m spawnpoint_rank._private_audit` with the bundle's shim, so that a
name an older or newer torch lacks (torch 1.7 has no worker.HAS_NUMPY) fails here, not as a
loader pool that is off in a user's job. Lightning is not in these roots; its names are
checked by tests/frameworks/private_names_under_frameworks.py.

    private_names_in_root.py
"""

import os
import subprocess
import sys

import foreign_common as fc


def main():
    fc.suite()
    shim = os.path.join(fc.BUNDLE, "share", "spawnpoint", "python")
    if not os.path.isdir(os.path.join(shim, "spawnpoint_rank")):
        print("FAIL: no spawnpoint_rank in the bundle's %s" % shim)
        return 1
    command = [sys.executable, "-m", "spawnpoint_rank._private_audit"]
    print("$ PYTHONPATH=%s %s" % (shim, " ".join(command)), flush=True)
    return subprocess.call(command, env=dict(os.environ, PYTHONPATH=shim))


if __name__ == "__main__":
    sys.exit(main())
