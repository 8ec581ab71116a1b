"""No silent skips (issue 38): a test that did not run must not pass for one that did.

    python3 no_silent_skips_test.py --source-dir REPO [unittest args]

SkipReportTest: scripts/test-skips.py on the junit file of a real ctest run (a hand-written
CTestTestfile.cmake: a pass, a failure, a SKIP_RETURN_CODE skip, a GoogleTest skip through
SKIP_REGULAR_EXPRESSION as gtest_discover_tests sets it, a disabled test, a failed fixture's
dependant) lists each test that did not run with its reason, and its --check fails on one
outside the allowlist. RunnerExitStatusTest: tests/python/run_shim_tests.py and
tests/cluster/cluster_fixture.py exit 77 (ctest's Skipped) when a test skipped itself, and
fail when a module is installed but cannot be imported or its import crashes; fake numpy and
torch modules first on PYTHONPATH stand for a machine without them.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

ARGS = None
SKIP = 77


def source(*parts):
    return os.path.join(ARGS.source_dir, *parts)


def run(command, env=None, cwd=None, timeout=240):
    """(exit status, stdout and stderr together)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    p = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, env=full_env, cwd=cwd, timeout=timeout)
    return p.returncode, p.stdout


# One test of each outcome ctest knows. "[  SKIPPED ]" is what GoogleTest prints for GTEST_SKIP
# (exit 0); gtest_discover_tests gives every test this SKIP_REGULAR_EXPRESSION.
CTEST_FILE = r'''
add_test(passes "/bin/sh" "-c" "exit 0")
add_test(fails "/bin/sh" "-c" "exit 1")
add_test(allowed_skip "/bin/sh" "-c" "echo 'SKIP: needs a widget this machine lacks'; exit 77")
set_tests_properties(allowed_skip PROPERTIES SKIP_RETURN_CODE 77)
add_test(root_skip "/bin/sh" "-c" "echo 'SKIP: needs root'; exit 77")
set_tests_properties(root_skip PROPERTIES SKIP_RETURN_CODE 77)
add_test(Suite.GtestSkip "/bin/sh" "-c" "printf '[ RUN      ] Suite.GtestSkip\\nx.cc:3: Skipped\\nno torch here\\n\\n[  SKIPPED ] Suite.GtestSkip (0 ms)\\n'")
set_tests_properties(Suite.GtestSkip PROPERTIES SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
add_test(switched_off "/bin/sh" "-c" "exit 0")
set_tests_properties(switched_off PROPERTIES DISABLED TRUE)
add_test(setup_fails "/bin/sh" "-c" "exit 1")
set_tests_properties(setup_fails PROPERTIES FIXTURES_SETUP widget)
add_test(needs_setup "/bin/sh" "-c" "exit 0")
set_tests_properties(needs_setup PROPERTIES FIXTURES_REQUIRED widget)
'''


class SkipReportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="spawnpoint-skips-")
        with open(os.path.join(cls.dir, "CTestTestfile.cmake"), "w") as f:
            f.write(CTEST_FILE)
        cls.junit = os.path.join(cls.dir, "junit.xml")
        code, cls.ctest_out = run(["ctest", "--output-junit", cls.junit], cwd=cls.dir)
        assert code != 0, "ctest passed a run with a failing test:\n" + cls.ctest_out
        cls.allowlist = cls.write("allow.txt", "# comment\n\nallowed_skip  the widget is optional\n")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    @classmethod
    def write(cls, name, text):
        path = os.path.join(cls.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def report(self, *args):
        return run([sys.executable, source("scripts", "test-skips.py"), "--junit", self.junit]
                   + list(args))

    def test_a_skip_outside_the_allowlist_fails_the_check(self):
        code, out = self.report("--allowlist", self.allowlist, "--check")
        self.assertEqual(code, 1, out)
        self.assertIn("skips: total=8 not_run=5 allowlisted=1 outside=4", out.splitlines()[-1])
        self.assertIn("4 outside the allowlist", out)
        for name in ("root_skip", "Suite.GtestSkip", "switched_off", "needs_setup"):
            self.assertRegex(out, r"\n  \S.* %s: .*\[NOT in %s\]" % (name, self.allowlist))

    def test_each_test_that_did_not_run_is_listed_with_its_kind_and_reason(self):
        code, out = self.report("--allowlist", self.allowlist)
        self.assertEqual(code, 0, out)  # listing only: make test's status is ctest's
        self.assertIn("== ctest: 8 tests, 5 skipped or not run:", out)
        self.assertIn("  skipped  root_skip: needs root [NOT in", out)
        self.assertIn("  skipped  Suite.GtestSkip: no torch here [NOT in", out)
        self.assertIn("  disabled switched_off: ctest's DISABLED property [NOT in", out)
        self.assertIn("  not run  needs_setup: Fixture dependency failed: Failed test "
                      "dependencies: setup_fails [NOT in", out)
        self.assertIn("  skipped  allowed_skip: needs a widget this machine lacks "
                      "[allowlisted (%s:3: the widget is optional)]" % self.allowlist, out)
        for ran in ("passes", "fails", "setup_fails"):
            self.assertNotIn(" %s:" % ran, out)

    def test_skips_all_allowlisted_pass_the_check(self):
        allow = self.write("allow_all.txt", "allowed_skip optional\nroot_skip we are not root\n"
                           "Suite.* GoogleTest's skips\nswitched_off off on purpose\n"
                           "needs_* its fixture is optional here\n")
        code, out = self.report("--allowlist", allow, "--check")
        self.assertEqual(code, 0, out)
        self.assertIn("skips: total=8 not_run=5 allowlisted=5 outside=0", out)

    def test_no_junit_means_the_tests_did_not_run(self):
        missing = os.path.join(self.dir, "absent.xml")
        code, out = run([sys.executable, source("scripts", "test-skips.py"), "--junit", missing,
                         "--check"])
        self.assertEqual(code, 1, out)
        self.assertIn("the tests did not run", out)
        code, out = run([sys.executable, source("scripts", "test-skips.py"), "--junit", missing])
        self.assertEqual(code, 0, out)

    def test_an_allowlist_entry_without_a_reason_is_an_error_naming_its_line(self):
        allow = self.write("no_reason.txt", "allowed_skip optional\n# c\nroot_skip\n")
        code, out = self.report("--allowlist", allow)
        self.assertEqual(code, 2, out)
        self.assertIn("%s:3: entry 'root_skip' has no reason" % allow, out)

    def test_also_files_are_printed_when_they_exist(self):
        summary = self.write("chaos-summary.txt", "chaos seed=1 missed=0\n")
        code, out = self.report("--also", summary, "--also", os.path.join(self.dir, "absent"))
        self.assertEqual(code, 0, out)
        self.assertIn("\nchaos seed=1 missed=0\n", out)

    def test_the_repos_allowlist_is_short_and_every_entry_has_a_reason(self):
        code, out = self.report("--allowlist", source("tests", "skip-allowlist.txt"))
        self.assertEqual(code, 0, out)
        with open(source("tests", "skip-allowlist.txt")) as f:
            entries = [l for l in f if l.strip() and not l.startswith("#")]
        self.assertLessEqual(len(entries), 10, "a long allowlist is a list of silent skips")


class RunnerExitStatusTest(unittest.TestCase):
    def setUp(self):
        self.fakes = tempfile.mkdtemp(prefix="spawnpoint-fake-modules-")

    def tearDown(self):
        shutil.rmtree(self.fakes)

    def fake(self, name, body):
        with open(os.path.join(self.fakes, name + ".py"), "w") as f:
            f.write(textwrap.dedent(body))

    def not_installed(self, *names):
        for name in names:  # what `import name` raises when it is not installed
            self.fake(name, "raise ModuleNotFoundError(\"No module named '%s'\", name=%r)\n"
                      % (name, name))

    def shim_tests(self, *args):
        return run([sys.executable, source("tests", "python", "run_shim_tests.py"),
                    "--source-dir", ARGS.source_dir] + list(args),
                   env={"PYTHONPATH": self.fakes})

    def test_a_test_that_skipped_itself_exits_77_and_is_named(self):
        self.not_installed("numpy", "torch")
        code, out = self.shim_tests("BatchCodecTest")
        self.assertEqual(code, SKIP, out)
        self.assertRegex(out, r"SKIP: test_batch_codec\.BatchCodecTest\.test_\w+: numpy is not "
                         r"installed")

    def test_a_module_installed_but_broken_fails(self):
        self.not_installed("torch")  # so that only the tests import numpy
        self.fake("numpy", "raise ImportError('libopenblas.so.0: cannot open shared object file')\n")
        code, out = self.shim_tests("BatchCodecTest")
        self.assertEqual(code, 1, out)
        self.assertIn("libopenblas.so.0", out)

    def test_a_missing_dependency_of_an_installed_module_fails(self):
        self.not_installed("torch")  # so that only the tests import numpy
        self.fake("numpy", "import numpy_core_absent_dependency\n")
        code, out = self.shim_tests("BatchCodecTest")
        self.assertEqual(code, 1, out)
        self.assertIn("numpy_core_absent_dependency", out)

    def test_an_import_that_crashes_fails(self):
        self.not_installed("torch")  # so that only the tests import numpy
        self.fake("numpy", "import os\nos.abort()\n")
        code, out = self.shim_tests("BatchCodecTest")
        self.assertNotIn(code, (0, SKIP), out)

    def test_torch_cases_without_torch_are_a_skip(self):
        self.not_installed("numpy", "torch")
        code, out = self.shim_tests("--require-torch", "BatchCodecTorchTest")
        self.assertEqual(code, SKIP, out)
        self.assertIn("SKIP: test_batch_codec.BatchCodecTorchTest.", out)

    def test_a_class_that_needs_the_agent_run_without_it_is_a_skip(self):
        self.not_installed("numpy", "torch")
        code, out = self.shim_tests("ForkScriptTest")
        self.assertEqual(code, SKIP, out)
        self.assertIn("needs --agent", out)

    def test_passing_tests_exit_0(self):
        self.not_installed("numpy", "torch")  # RankEnvTest needs neither
        code, out = self.shim_tests("RankEnvTest")
        self.assertEqual(code, 0, out)

    def cluster_script(self, body):
        path = os.path.join(self.fakes, "cluster_case.py")
        with open(path, "w") as f:
            f.write(textwrap.dedent("""\
                import sys, unittest
                sys.path.insert(0, %r)
                import cluster_fixture
                class Case(unittest.TestCase):
                %s
                if __name__ == "__main__":
                    cluster_fixture.main()
                """) % (source("tests", "cluster"), textwrap.indent(textwrap.dedent(body), "    ")))
        return run([sys.executable, path, "--source-dir", ARGS.source_dir])

    def test_cluster_fixture_exits_77_on_a_skip(self):
        code, out = self.cluster_script("""\
            def test_a(self):
                pass
            def test_b(self):
                self.skipTest("needs a cluster this machine lacks")
            """)
        self.assertEqual(code, SKIP, out)
        self.assertIn("SKIP: __main__.Case.test_b: needs a cluster this machine lacks", out)

    def test_cluster_fixture_exits_0_when_all_ran_and_1_on_a_failure(self):
        code, out = self.cluster_script("def test_a(self):\n    pass\n")
        self.assertEqual(code, 0, out)
        code, out = self.cluster_script("def test_a(self):\n    self.fail('no')\n")
        self.assertEqual(code, 1, out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    program = unittest.main(argv=[sys.argv[0]] + rest, verbosity=2, exit=False)
    # This file's own tests never skip: a skip here would be the silent pass it tests against.
    result = program.result
    sys.exit(0 if result.wasSuccessful() and result.testsRun and not result.skipped else 1)
