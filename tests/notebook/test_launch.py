"""spawnpoint.launch() from a plain Python process, against the real agent (issue 37).

LaunchTest (torch, --agent): scripts/*.py run as __main__ by /usr/bin/python3, as a notebook
kernel's cells would define their objects there: a function, a Dataset class and a lambda on 2
CPU ranks doing a gloo all_reduce, after the caller ran a torch op on OpenMP threads; rank 0's
result and every rank's; output streamed while the ranks run; an exception on rank 1 raised in
the caller with its traceback and the agent's cause; a killed rank, with and without
max_restarts; SIGINT to the launching process mid-run. After each, no process of the launch
is left and its TMPDIR is empty.

LauncherUnitTest (no torch, no agent run): finding the agent, the manifest, `import spawnpoint`
importing neither the launcher nor torch.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import unittest

from notebook_support import (SCRIPTS, TIMEOUT, PrivateDirs, agent, launching_environment,
                              new_marker, processes_with, python_dir)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ports import free_port  # noqa: E402  (tests/support/ports.py)

PYTHON = sys.executable  # /usr/bin/python3, with torch 1.13


def result_of(output):
    lines = [l for l in output.splitlines() if l.startswith("RESULT ")]
    if len(lines) != 1:
        raise AssertionError("expected one RESULT line in:\n%s" % output)
    return json.loads(lines[0][len("RESULT "):])


class LaunchTest(unittest.TestCase):
    def setUp(self):
        self.dirs = PrivateDirs(self)
        self.marker = new_marker()

    def run_script(self, script, *args):
        proc = subprocess.run([PYTHON, os.path.join(SCRIPTS, script)] + [str(a) for a in args],
                              cwd=self.dirs.work, env=launching_environment(self.dirs.tmp,
                                                                           self.marker),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=TIMEOUT)
        self.output = "stdout:\n%s\nstderr:\n%s" % (proc.stdout, proc.stderr)
        self.assertEqual(proc.returncode, 0, self.output)
        self.assert_nothing_left()
        return proc

    def assert_nothing_left(self):
        self.assertEqual(processes_with(self.marker), [], self.output)
        self.assertEqual(self.dirs.left_in_tmp(), [], self.output)

    def test_objects_defined_in_main_run_on_two_gloo_ranks(self):
        go_file = os.path.join(self.dirs.work, "go")
        proc = self.run_script("train_in_main.py", go_file, free_port())
        result = result_of(proc.stdout)
        rank0 = result["rank0"]
        # 0+1+4+...+49 = 140, doubled by the lambda collate_fn, summed over 2 ranks; + offset.
        self.assertEqual(rank0["total"], 560.0 + 1000, self.output)
        self.assertEqual((rank0["rank"], rank0["world"], rank0["backend"]), (0, 2, "gloo"))
        # The Dataset class and the lambda reached the agent's loader workers by value.
        self.assertEqual(rank0["iterator"], "_PoolDataLoaderIter", self.output)
        self.assertTrue(result["dataset_is_the_callers_class"], result)
        self.assertEqual(result["return_all"], [1, 11])
        self.assertEqual(result["status"], {"phase": "Succeeded", "ranks": 2, "restarts": 0,
                                            "job": "lambda"})
        self.assertRegex(proc.stderr, r"\[spawnpoint\] train: metrics on "
                                      r"http://127\.0\.0\.1:\d+/metrics")
        self.assertEqual(result["caller_threads"], 2)
        self.assertEqual(result["streamed_rank_lines"], ["[rank 0]", "[rank 1]"])
        # Said once per launch, plainly: ranks, backend, the command and its manifest.
        said = [l for l in proc.stderr.splitlines() if l.startswith("[spawnpoint] launch: ")]
        self.assertEqual(len(said), 2, proc.stderr)
        self.assertIn("train() on 2 CPU ranks, backend gloo, %s: " % PYTHON, said[0])
        self.assertIn(" run -f ", said[0])
        self.assertIn("/job.json", said[0])
        self.assertIn("<lambda>() on 2 CPU ranks", said[1])
        self.assertIn("[rank 1] total 560.0", proc.stdout)

    def test_failures_are_raised_with_the_ranks_traceback_and_the_agents_cause(self):
        proc = self.run_script("rank_fails.py", free_port())
        result = result_of(proc.stdout)

        raised = result["exception"]["raised"]
        self.assertEqual(raised["type"], "Refused", self.output)
        self.assertTrue(raised["is_callers_class"])
        self.assertEqual(raised["str"], "rank one refuses")
        self.assertEqual(raised["cause_type"], "RankFailed")
        failed = raised["failed"]
        self.assertEqual((failed["rank"], failed["exit_code"], failed["reason"]),
                         (1, 1, "UserError"), failed)
        self.assertEqual(failed["exception_type"], "Refused")
        # The rank's own frames, with their file and source line (not cloudpickle's
        # "<dynamic-code>"), and none of the launcher's.
        self.assertIn("rank_fails.py\", line", failed["traceback"])
        self.assertIn('raise Refused("rank one refuses")', failed["traceback"])
        self.assertIn("in check_rank", failed["traceback"])
        self.assertNotIn("_launched.py", failed["traceback"])
        self.assertIn("the agent's cause: UserError: uncaught exception", failed["str"])
        self.assertIn("; not restarted: exit code 1 is not retryable", failed["str"])
        # ... and the rank's lines came through as it failed.
        self.assertIn('[rank 1]     raise Refused("rank one refuses")', proc.stderr)
        # Rank 1 ended after its exit handlers, without finalization (which closes its gloo
        # connections before its exit: rank 0's CollectiveError could come first).
        self.assertIn("[rank 1] rank 1's exit handlers ran\n", proc.stdout)
        self.assertNotIn("rank 1 was finalized", proc.stdout)

        raised = result["unpicklable"]["raised"]
        self.assertEqual(raised["type"], "RankFailed", self.output)
        failed = raised["failed"]
        self.assertEqual((failed["rank"], failed["reason"], failed["exception_type"]),
                         (1, "UserError", "Locked"))
        self.assertIn('raise Locked("rank one holds a lock")', failed["traceback"])
        self.assertIn("rank 1's Locked could not be rebuilt here", failed["str"])
        self.assertIn("lock", failed["str"].split("could not be rebuilt here")[1])

        raised = result["unreturnable"]["raised"]
        self.assertEqual((raised["type"], raised["cause_type"]), ("TypeError", "RankFailed"))
        self.assertEqual(raised["failed"]["rank"], 0)
        self.assertIn("rank 0's return value (lock) cannot be sent back: TypeError: cannot pickle",
                      raised["str"])

        raised = result["killed"]["raised"]
        self.assertEqual(raised["type"], "RankFailed", self.output)
        failed = raised["failed"]
        self.assertEqual((failed["rank"], failed["reason"], failed["signal"], failed["exit_code"]),
                         (1, "Killed", "SIGKILL", 137), failed)
        self.assertEqual(failed["restarts"], 0)
        self.assertIn("the agent's cause: Killed: killed by SIGKILL; not restarted: "
                      "maxRestarts (0) reached", failed["str"])

        # max_restarts: the kill is retryable; the second attempt's results come back.
        self.assertEqual(result["restarted"], {"returned": [1, 1]}, self.output)
        self.assertIn("restart 1 of 1", proc.stderr)

    def test_sigint_stops_the_agent_and_every_rank_and_leaves_nothing(self):
        env = launching_environment(self.dirs.tmp, self.marker)
        proc = subprocess.Popen([PYTHON, os.path.join(SCRIPTS, "interrupted.py"),
                                 str(free_port())], cwd=self.dirs.work, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                universal_newlines=True)
        stderr = []
        reader = threading.Thread(target=lambda: stderr.extend(proc.stderr))
        reader.start()
        timer = threading.Timer(TIMEOUT, proc.kill)
        timer.start()
        try:
            training = set()
            lines = []
            for line in proc.stdout:  # the ranks' lines, as they come
                lines.append(line)
                if " training pid=" in line:
                    training.add(line.split("]")[0])
                if len(training) == 2:
                    break
            self.assertEqual(len(training), 2, "".join(lines))
            ranks = processes_with(self.marker, exclude=(proc.pid,))
            self.assertTrue(any("_launched.py" in cmd for _, cmd in ranks), ranks)
            proc.send_signal(signal.SIGINT)
            lines += proc.stdout.readlines()
            code = proc.wait()
        finally:
            timer.cancel()
            reader.join()
        self.output = "stdout:\n%s\nstderr:\n%s" % ("".join(lines), "".join(stderr))
        self.assert_nothing_left()
        self.assertEqual(code, 0, self.output)
        self.assertIn("KeyboardInterrupt raised\n", lines, self.output)
        self.assertIn("[spawnpoint] launch: interrupted: stopping the agent and its ranks\n",
                      stderr)


class LauncherUnitTest(unittest.TestCase):
    """The launcher's pure parts, imported from the package under test."""

    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, python_dir())
        import spawnpoint.launcher

        cls.launcher = spawnpoint.launcher

    def setUp(self):
        self.saved = os.environ.get("SPAWNPOINT_AGENT")
        self.addCleanup(self.restore)

    def restore(self):
        os.environ.pop("SPAWNPOINT_AGENT", None)
        if self.saved is not None:
            os.environ["SPAWNPOINT_AGENT"] = self.saved

    def test_import_spawnpoint_imports_neither_the_launcher_nor_torch(self):
        code = ("import sys, spawnpoint; print(sorted(m for m in ('torch', 'spawnpoint.launcher',"
                " 'subprocess') if m in sys.modules)); spawnpoint.launch; "
                "print('spawnpoint.launcher' in sys.modules)")
        out = subprocess.run([PYTHON, "-c", code], env=dict(os.environ, PYTHONPATH=python_dir()),
                             stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
        self.assertEqual(out, "[]\nTrue\n")

    def test_the_agent_is_found_by_argument_environment_beside_the_package_or_path(self):
        find = self.launcher.find_agent
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        fake = os.path.join(tmp, "spawnpoint-agent")
        with open(fake, "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(fake, 0o755)
        os.environ["SPAWNPOINT_AGENT"] = agent()
        self.assertEqual(find(fake), fake)
        self.assertEqual(find(), os.path.abspath(agent()))
        os.environ["SPAWNPOINT_AGENT"] = os.path.join(tmp, "nothing")
        with self.assertRaisesRegex(self.launcher.LaunchError,
                                    r"\$SPAWNPOINT_AGENT names .*nothing, which is not an "
                                    r"executable file"):
            find()
        del os.environ["SPAWNPOINT_AGENT"]
        # A package in <prefix>/share/spawnpoint/python finds <prefix>/bin/spawnpoint-agent.
        prefix = os.path.join(tmp, "prefix")
        package = os.path.join(prefix, "share", "spawnpoint", "python")
        shutil.copytree(os.path.join(python_dir(), "spawnpoint"),
                        os.path.join(package, "spawnpoint"))
        os.makedirs(os.path.join(prefix, "bin"))
        os.symlink(agent(), os.path.join(prefix, "bin", "spawnpoint-agent"))
        code = "import spawnpoint.launcher as l; print(l.find_agent())"
        env = dict(os.environ, PYTHONPATH=package, PATH="/usr/bin:/bin")
        out = subprocess.run([PYTHON, "-c", code], env=env, stdout=subprocess.PIPE,
                             universal_newlines=True, check=True).stdout
        self.assertEqual(out.strip(), os.path.join(prefix, "bin", "spawnpoint-agent"))
        # Then PATH; then a clear error naming every place looked at.
        os.remove(os.path.join(prefix, "bin", "spawnpoint-agent"))
        env["PATH"] = tmp + ":/usr/bin:/bin"
        out = subprocess.run([PYTHON, "-c", code], env=env, stdout=subprocess.PIPE,
                             universal_newlines=True, check=True).stdout
        self.assertEqual(out.strip(), fake)
        env["PATH"] = "/usr/bin:/bin"
        proc = subprocess.run([PYTHON, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("spawnpoint.LaunchError: spawnpoint.launch: no spawnpoint-agent found; "
                      "looked at agent= (not set), $SPAWNPOINT_AGENT (not set), %s, PATH. "
                      % os.path.join(prefix, "bin", "spawnpoint-agent"), proc.stderr)

    def test_the_manifest_is_an_ordinary_training_job(self):
        manifest = self.launcher.make_manifest(
            "train", 2, False, "auto", 1, ["/usr/bin/python3", "entry.py", "/d"], "/work",
            [{"name": "PYTHONPATH", "value": "/p"}],
            spec={"loader": {"workersPerRank": 2}, "restartPolicy": {"backoffSeconds": 0}})
        self.assertEqual(manifest, {
            "apiVersion": "spawnpoint.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": "train"},
            "spec": {"nodes": 1, "gpusPerNode": 0, "procsPerNode": 2, "backend": "auto",
                     "template": {"spec": {"containers": [{
                         "name": "trainer", "command": ["/usr/bin/python3", "entry.py", "/d"],
                         "workingDir": "/work", "env": [{"name": "PYTHONPATH", "value": "/p"}]}]}},
                     "restartPolicy": {"maxRestarts": 1, "backoffSeconds": 0},
                     "loader": {"workersPerRank": 2}}})
        gpu = self.launcher.make_manifest("g", 4, True, "auto", 0, ["p"], "/", [])
        self.assertEqual((gpu["spec"]["gpusPerNode"], "procsPerNode" in gpu["spec"]), (4, False))
        for bad in ({"template": {}}, {"procsPerNode": 3}):
            with self.assertRaises(ValueError):
                self.launcher.make_manifest("t", 2, False, "auto", 0, ["p"], "/", [], spec=bad)
        # The agent accepts it as it is.
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        path = os.path.join(tmp, "job.json")
        with open(path, "w") as f:
            json.dump(self.launcher.make_manifest(
                "train", 2, False, "auto", 1, [PYTHON, "-c", "pass"], tmp,
                self.launcher.rank_environment(["", "/x"], {"A": "b"})), f)
        plan = json.loads(subprocess.run([agent(), "plan", "-f", path, "--gpu-backend", "none"],
                                         stdout=subprocess.PIPE, check=True).stdout)
        env = plan[0]["ranks"][1]["env"]
        self.assertEqual((env["WORLD_SIZE"], env["RANK"], env["A"]), ("2", "1", "b"))
        self.assertTrue(env["PYTHONPATH"].endswith(os.pathsep.join([os.getcwd(), "/x"])), env)

    def test_job_names(self):
        name = self.launcher.job_name_for
        self.assertEqual(name(lambda: 0), "lambda")
        self.assertEqual(name(self.test_job_names), "test-job-names")

        def _2_Fit__():
            pass

        self.assertEqual(name(_2_Fit__), "fit")
        self.assertEqual(name(type("X" * 80, (), {"__call__": lambda s: 0})()), "x" * 52)
