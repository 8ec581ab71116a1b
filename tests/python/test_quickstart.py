"""The README's Python quick start, run as it is written (ctest: python_quickstart), and the
other examples/python manifests (ExamplesTest).

The lines between `<!-- quickstart` and `<!-- quickstart end -->` in README.md are run one by
one from the repository root, as a user on a fresh Debian 12 machine runs them: PATH is
Debian's default (so `python3` is /usr/bin/python3 with python3-torch, as `make deps`
installs it, whatever interpreter the test machine puts first on PATH) and nothing of the
test's environment that would change the agent or the shim is kept. Only `build/bin/` is
rewritten to the build under test when that is not <root>/build. The run must train
examples/python/train_ddp.py on the agent's loader pool with both ranks ending in step.
"""

import os
import re
import shlex
import subprocess
import unittest

from test_shim import SOURCE_DIR, clean_environment

FRESH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TIMEOUT = 600


def quickstart_commands(readme):
    """The shell lines of the quick start block (comments and blank lines dropped)."""
    with open(readme) as f:
        text = f.read()
    match = re.search(r"<!-- quickstart\b[^\n]*-->\n```sh\n(.*?)```\n<!-- quickstart end -->",
                      text, re.S)
    if match is None:
        raise AssertionError("README.md has no quick start block between the markers")
    lines = []
    for line in match.group(1).splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            lines.append(line)
    return lines


@unittest.skipUnless(os.environ.get("SPAWNPOINT_AGENT_BIN"), "needs --agent (the built spawnpoint-agent)")
class QuickStartTest(unittest.TestCase):
    def test_the_readmes_python_quick_start_trains_on_the_pool(self):
        commands = quickstart_commands(os.path.join(SOURCE_DIR, "README.md"))
        self.assertEqual([shlex.split(c)[:2] for c in commands],
                         [["build/bin/spawnpoint-agent", "plan"],
                          ["build/bin/spawnpoint-agent", "run"]], commands)
        bin_dir = os.path.dirname(os.environ["SPAWNPOINT_AGENT_BIN"])
        env = clean_environment()
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PATH"] = FRESH_PATH
        outputs = []
        for command in commands:
            argv = shlex.split(command)
            if argv[0].startswith("build/bin/"):
                argv[0] = os.path.join(bin_dir, argv[0][len("build/bin/"):])
            proc = subprocess.run(argv, cwd=SOURCE_DIR, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, universal_newlines=True,
                                  timeout=TIMEOUT)
            self.assertEqual(proc.returncode, 0, "%s:\n%s" % (command, proc.stdout))
            outputs.append(proc.stdout)
        plan, run = outputs
        self.assertIn("examples/python/train_ddp.py", plan)
        finals = dict(re.findall(r"final rank=(\d) .*params=([0-9a-f]+)", run))
        self.assertEqual(sorted(finals), ["0", "1"], run)
        self.assertEqual(finals["0"], finals["1"], "the replicas diverged:\n" + run)
        self.assertEqual(len(re.findall(r"epoch \d/3 .*workers=_PoolDataLoaderIter", run)), 3,
                         run)
        self.assertIn("all nodes succeeded", run)
        self.assertNotIn("runs on torch's own workers", run)



@unittest.skipUnless(os.environ.get("SPAWNPOINT_AGENT_BIN"), "needs --agent (the built spawnpoint-agent)")
class ExamplesTest(unittest.TestCase):
    def test_the_torchvision_example_trains_on_the_pool(self):
        env = clean_environment()
        env["PATH"] = FRESH_PATH
        proc = subprocess.run([os.environ["SPAWNPOINT_AGENT_BIN"], "run",
                               "examples/python/torchvision.yaml", "--metrics-addr", "off"],
                              cwd=SOURCE_DIR, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, universal_newlines=True,
                              timeout=TIMEOUT)
        self.assertEqual(proc.returncode, 0, proc.stdout)
        finals = dict(re.findall(r"final rank=(\d) .*params=([0-9a-f]+)", proc.stdout))
        self.assertEqual(sorted(finals), ["0", "1"], proc.stdout)
        self.assertEqual(finals["0"], finals["1"], proc.stdout)
        self.assertEqual(len(re.findall(r"epoch \d/2 .*workers=_PoolDataLoaderIter",
                                        proc.stdout)), 2, proc.stdout)


if __name__ == "__main__":
    unittest.main()
