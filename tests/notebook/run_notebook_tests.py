"""Runs test classes (or Class.test_method) of test_launch.py and test_notebook.py for ctest.

    run_notebook_tests.py --agent BIN --python-dir DIR [--require MODULE]... TEST...

--agent is the built spawnpoint-agent; --python-dir the directory holding the spawnpoint
package under test (the build's share/spawnpoint/python, beside the agent as it ships).
Exit status: 0 all passed, 1 a failure (or nothing ran), 77 skipped: a --require'd module is
not installed in this interpreter (torch; ipykernel, nbclient, nbformat, jupyter_client for a
real kernel), named on a "SKIP:" line. scripts/install-deps.sh installs every one, and
.ci/run fails on a skip outside tests/skip-allowlist.txt. A module that is installed but fails
to import is a failure, not a skip.
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
    parser.add_argument("--agent", required=True)
    parser.add_argument("--python-dir", required=True)
    parser.add_argument("--require", action="append", default=[])
    parser.add_argument("tests", nargs="+")
    args = parser.parse_args()

    missing = [m for m in args.require if importlib.util.find_spec(m) is None]
    if missing:
        print("SKIP: %s has no %s; install them with scripts/install-deps.sh (Debian's "
              "python3-torch, python3-ipykernel, python3-nbclient, python3-nbformat, "
              "python3-jupyter-client)" % (sys.executable, ", ".join(missing)))
        return SKIP
    if not os.access(args.agent, os.X_OK):
        print("FAIL: %s is not an executable; build spawnpoint-agent first" % args.agent)
        return 1
    if not os.path.isfile(os.path.join(args.python_dir, "spawnpoint", "launcher.py")):
        print("FAIL: %s holds no spawnpoint package with its launcher" % args.python_dir)
        return 1
    os.environ["SPAWNPOINT_TEST_AGENT"] = os.path.abspath(args.agent)
    os.environ["SPAWNPOINT_TEST_PYTHON_DIR"] = os.path.abspath(args.python_dir)
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    # jupyter_client's kernel specs import ipykernel, whose debugpy warns about frozen modules.
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import test_launch
    import test_notebook
    modules = [test_launch, test_notebook]
    if any(n.startswith("LightningNotebookTest") for n in args.tests):
        import test_lightning_notebook  # Lightning: in the frameworks environment only

        modules.append(test_lightning_notebook)

    suite = unittest.TestSuite()
    for name in args.tests:
        module = next(m for m in modules if hasattr(m, name.split(".")[0]))
        suite.addTest(unittest.defaultTestLoader.loadTestsFromName(name, module))
    started = time.monotonic()
    result = unittest.TextTestRunner(stream=sys.stdout, verbosity=2).run(suite)
    print("%s: %d tests in %.1f s" % (", ".join(args.tests), result.testsRun,
                                      time.monotonic() - started))
    if not result.wasSuccessful() or result.testsRun == 0:
        return 1
    for test, reason in result.skipped:  # unittest counts a skip as a success
        print("SKIP: %s: %s" % (test.id(), reason))
    return SKIP if result.skipped else 0


if __name__ == "__main__":
    sys.exit(main())
