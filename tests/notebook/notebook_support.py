"""What test_launch.py and test_notebook.py share: the agent and the spawnpoint package under
test, the environment a launching process gets, and the checks that a launch left nothing
behind (no process, no file under its TMPDIR)."""

import os
import shutil
import tempfile
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "scripts")
TIMEOUT = 600  # ranks and loader workers import torch on a loaded 2-core machine
MARKER = "NOTEBOOK_TEST_MARKER"  # in the launching process's environment, so in every
                                 # process it starts: how leftovers are found


def agent():
    """The spawnpoint-agent under test (run_notebook_tests.py --agent)."""
    return os.environ["SPAWNPOINT_TEST_AGENT"]


def python_dir():
    """The directory holding the spawnpoint package under test: the build's
    share/spawnpoint/python, as the agent ships it (run_notebook_tests.py --python-dir)."""
    return os.environ["SPAWNPOINT_TEST_PYTHON_DIR"]


def launching_environment(tmpdir, marker):
    """The environment of a process that calls spawnpoint.launch, set up as docs/notebooks.md
    says: PYTHONPATH names the package's directory. SPAWNPOINT_AGENT only where the agent under
    test is not the one beside the package (a source-tree package); TMPDIR private, so that
    what a launch leaves there is seen."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SPAWNPOINT_")
           and k not in ("PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONWARNINGS",
                         "PYTHONINSPECT", "PYTHONSAFEPATH", "PYTHONVERBOSE",
                         "PYTHONUNBUFFERED")}  # the launcher makes the ranks' output prompt
    env["PYTHONPATH"] = python_dir()
    beside = os.path.join(python_dir(), os.pardir, os.pardir, os.pardir, "bin",
                          "spawnpoint-agent")
    if not os.path.exists(beside) or not os.path.samefile(beside, agent()):
        env["SPAWNPOINT_AGENT"] = agent()
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ in the source tree
    env["TMPDIR"] = tmpdir
    env[MARKER] = marker
    return env


def new_marker():
    return uuid.uuid4().hex


def processes_with(marker, exclude=()):
    """[(pid, command line)] of the live processes whose environment holds MARKER=marker, but
    the pids in exclude. A zombie has no environment left to read: it runs nothing."""
    needle = ("%s=%s" % (MARKER, marker)).encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in exclude or int(name) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                environ = f.read().split(b"\0")
            with open("/proc/%s/cmdline" % name, "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if needle in environ:
            found.append((int(name), cmdline.strip()))
    return found


class PrivateDirs:
    """A test's directories: `tmp` (the launching process's TMPDIR, which must stay empty) and
    `work` (the test's own files)."""

    def __init__(self, test):
        root = tempfile.mkdtemp(prefix="spawnpoint-notebook-test-")
        test.addCleanup(shutil.rmtree, root, True)
        self.tmp = os.path.join(root, "tmp")
        self.work = os.path.join(root, "work")
        os.mkdir(self.tmp)
        os.mkdir(self.work)

    def left_in_tmp(self):
        found = []
        for dirpath, dirnames, filenames in os.walk(self.tmp):
            found += [os.path.join(dirpath, n) for n in dirnames + filenames]
        return sorted(found)
