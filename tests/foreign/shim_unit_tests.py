"""The shim's own tests (tests/python, through its run_shim_tests.py) on this root's Python and
torch: the rank side's parsing and policies, the start-up shim, the DataLoader arguments and
spawned workers, the Python loader worker, and AgentTest with the bundle's agent. What runs
in a trainer's process must load in any trainer image (CPython 3.9-3.13, torch 1.7-2.x).

    shim_unit_tests.py [TestClass...]     default: every class below
"""

import os
import subprocess
import sys

import foreign_common as fc

CLASSES = ["RankEnvTest", "LoaderPolicyTest", "LibuvTest", "BatchCodecTest",
           "BatchCodecTorchTest", "FramesTest", "WorkerSetupTest", "StartupTest",
           "LoaderArgsTest", "WorkersTest", "AgentTest"]


def main():
    fc.suite()
    runner = os.path.join(fc.SOURCE, "tests", "python", "run_shim_tests.py")
    if not os.path.isfile(runner):
        print("FAIL: %s is missing; run_foreign_test.sh binds the sources there" % runner)
        return 1
    # The root has torch: a test that skips for want of it would hide a failure.
    command = [sys.executable, runner, "--require-torch", "--source-dir", fc.SOURCE,
               "--agent", fc.AGENT] + (sys.argv[1:] or CLASSES)
    print("$ " + " ".join(command), flush=True)
    rc = subprocess.call(command)
    return 1 if rc == 77 else rc


if __name__ == "__main__":
    sys.exit(main())
