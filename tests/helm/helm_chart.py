"""What the chart tests of this folder share: the tools folder's helm (helm3 or helm4, its homes
in a temporary directory of its own), the chart rendered or refused with values, and main(),
which reads --source-dir and --helm and runs the calling script's test cases (a run with no
test, or with a skipped one, fails)."""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import yaml

NS = "spawnpoint-system"
RELEASE = "spawnpoint"
ARGS = None  # --source-dir, --helm: set by main()
HELM_HOME = None


def chart():
    return os.path.join(ARGS.source_dir, "charts", "spawnpoint")


def helm(*argv):
    """(exit status, stdout, stderr) of the tools folder's helm, its homes in a temporary
    directory."""
    home = HELM_HOME
    env = dict(os.environ, HOME=home, HELM_CACHE_HOME=home + "/cache",
               HELM_CONFIG_HOME=home + "/config", HELM_DATA_HOME=home + "/data")
    env.pop("KUBECONFIG", None)
    p = subprocess.run([os.path.join(ARGS.source_dir, ".tools", "bin", ARGS.helm)] + list(argv),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                       env=env, timeout=120)
    return p.returncode, p.stdout, p.stderr


def render(*values):
    """The chart's documents from `helm template` with `values` (--set ... arguments)."""
    code, out, err = helm("template", RELEASE, chart(), "--namespace", NS, *values)
    if code != 0:
        raise AssertionError("helm template %s failed:\n%s" % (" ".join(values), err))
    return [d for d in yaml.safe_load_all(out) if d]


def refusal(*values):
    """helm template's error for values the chart must refuse."""
    code, out, err = helm("template", RELEASE, chart(), "--namespace", NS, *values)
    if code == 0:
        raise AssertionError("helm template %s rendered; expected a refusal" % " ".join(values))
    return err


def main():
    global ARGS, HELM_HOME
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--helm", required=True, help="helm3 or helm4 (in REPO/.tools/bin)")
    ARGS, rest = parser.parse_known_args()
    HELM_HOME = tempfile.mkdtemp(prefix="spawnpoint-helm-home-")
    try:
        program = unittest.main(module="__main__", argv=[sys.argv[0]] + rest, verbosity=2,
                                exit=False)
    finally:
        shutil.rmtree(HELM_HOME, ignore_errors=True)
    result = program.result
    sys.exit(0 if result.wasSuccessful() and result.testsRun > 0 and not result.skipped else 1)
