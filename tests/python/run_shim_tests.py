"""Runs the test classes of test_shim.py, test_rank_side.py, test_libuv.py, test_exit.py,
test_batch_codec.py, test_loader_worker.py, test_pool_agent.py, test_progress.py and
test_mp_spawn.py for ctest,
without pytest.

    run_shim_tests.py [--require-torch] [--source-dir DIR] [--agent BIN] TestClass...

Exit status: 0 all passed, 1 a failure (or no test ran), 77 skipped: --require-torch and this
interpreter has no torch, or any test skipped itself (a skipIf/skipUnless: numpy or torch not
installed, no --agent), each named on a "SKIP:" line. ctest reports 77 as Skipped
(SKIP_RETURN_CODE) and .ci/run fails on a skip outside tests/skip-allowlist.txt;
scripts/install-deps.sh installs python3-torch and python3-numpy, so CI runs them all.
"""

import argparse
import importlib.util
import os
import sys
import time
import unittest

SKIP = 77


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--require-torch", action="store_true")
    parser.add_argument("--source-dir")
    parser.add_argument("--agent", help="the built spawnpoint-agent, for AgentTest")
    parser.add_argument("tests", nargs="+")
    args = parser.parse_args()

    if args.require_torch and importlib.util.find_spec("torch") is None:
        print("SKIP: %s has no torch; install python3-torch (scripts/install-deps.sh) to run "
              "the Python shim tests" % sys.executable)
        return SKIP
    if args.source_dir:
        os.environ["SPAWNPOINT_SOURCE_DIR"] = os.path.abspath(args.source_dir)
    if args.agent:
        if not os.access(args.agent, os.X_OK):
            print("FAIL: %s is not an executable; build spawnpoint-agent first" % args.agent)
            return 1
        os.environ["SPAWNPOINT_AGENT_BIN"] = os.path.abspath(args.agent)
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import test_batch_codec
    import test_exit
    import test_fork_scripts
    import test_libuv
    import test_lightning
    import test_loader_worker
    import test_mp_spawn
    import test_pool_agent
    import test_private_names
    import test_progress
    import test_quickstart
    import test_rank_side
    import test_shim
    import test_torchrun_parity

    suite = unittest.TestSuite()
    for name in args.tests:  # a class of any of these modules, by its name
        modules = (test_rank_side, test_libuv, test_exit, test_batch_codec, test_loader_worker,
                   test_pool_agent, test_lightning, test_fork_scripts, test_quickstart,
                   test_progress, test_torchrun_parity, test_private_names, test_mp_spawn)
        module = next((m for m in modules if hasattr(m, name.split(".")[0])), test_shim)
        suite.addTest(unittest.defaultTestLoader.loadTestsFromName(name, module))
    started = time.monotonic()
    result = unittest.TextTestRunner(stream=sys.stdout, verbosity=2).run(suite)
    print("%s: %d tests in %.1f s" % (", ".join(args.tests), result.testsRun,
                                      time.monotonic() - started))
    return exit_status(result)


def exit_status(result):
    """0 passed, 1 failed or nothing ran, 77 (SKIP) when a test was skipped: unittest counts a
    skipped test as a success, which would let ctest record a test that never ran as Passed."""
    if not result.wasSuccessful() or result.testsRun == 0:
        return 1
    for test, reason in result.skipped:
        print("SKIP: %s: %s" % (test.id(), reason))
    return SKIP if result.skipped else 0


if __name__ == "__main__":
    sys.exit(main())
