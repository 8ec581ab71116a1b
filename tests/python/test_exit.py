"""Unit tests of the shim's exit handler (spawnpoint_rank/_exit.py): the settling loop on a
fake clock, the /proc reader on fake and real task folders, and the handler registered through
the bootstrap on a fake torch. The real race it closes (a gloo worker freeing a tensor while
the interpreter finalizes) is run by frameworks_gloo_exit on torch 2.6. Run through
run_shim_tests.py (ctest).
"""

import os
import subprocess
import sys
import tempfile
import threading
import time
import types
import unittest

from test_rank_side import SHIM_DIR  # and spawnpoint_rank, from SHIM_DIR, in sys.modules

from spawnpoint_rank import _exit  # noqa: E402


class ExitTest(unittest.TestCase):
    def settle(self, answers, step=0.005, limit=0.2):
        slept, answers = [], list(answers)
        total = _exit.settle(lambda: answers.pop(0) if answers else True, slept.append,
                             step, limit)
        return total, slept

    def test_settle_sleeps_until_no_other_thread_is_runnable(self):
        total, slept = self.settle([True, True, False])
        self.assertEqual(slept, [0.005] * 3)
        self.assertAlmostEqual(total, 0.015)

    def test_settle_sleeps_once_when_nothing_else_runs(self):
        # Once: a worker waiting for the GIL is not runnable until the GIL is released.
        self.assertEqual(self.settle([False])[1], [0.005])

    def test_settle_is_bounded_by_its_limit(self):
        total, slept = self.settle([], step=0.005, limit=0.2)  # always runnable
        self.assertEqual(len(slept), 40)
        self.assertAlmostEqual(total, 0.2)

    def fake_dist(self, available=True, initialized=True, error=None):
        def is_initialized():
            if error is not None:
                raise error
            return initialized
        return types.SimpleNamespace(is_available=lambda: available,
                                     is_initialized=is_initialized)

    def test_handler_settles_only_with_a_process_group(self):
        cases = ((self.fake_dist(), 1), (self.fake_dist(initialized=False), 0),
                 (self.fake_dist(available=False), 0))
        for dist, sleeps in cases:
            slept = []
            _exit.at_exit(dist, others_runnable=lambda: [], sleep=slept.append)
            self.assertEqual(len(slept), sleeps)

    def test_handler_never_raises(self):
        slept = []
        self.assertIsNone(_exit.at_exit(self.fake_dist(error=RuntimeError("torch is gone")),
                                        others_runnable=lambda: [], sleep=slept.append))
        self.assertEqual(slept, [])

        def broken_reader():
            raise OSError("no /proc")
        self.assertIsNone(_exit.at_exit(self.fake_dist(), others_runnable=broken_reader,
                                        sleep=slept.append))

    def test_runnable_tasks_reads_the_state_after_the_command_name(self):
        with tempfile.TemporaryDirectory(prefix="spawnpoint-tasks-") as tasks:
            stats = {"10": "10 (python3) R 1 10 10 0",     # the caller itself
                     "11": "11 (gloo worker) R 1 10 10 0",
                     "12": "12 (pt_main_thread) S 1 10 10 0",
                     "13": "13 (odd) R (x)) S 1 10 10 0",  # a command name with ") R ("
                     "14": "14 (omp) D 1 10 10 0"}
            for tid, stat in stats.items():
                os.makedirs(os.path.join(tasks, tid))
                with open(os.path.join(tasks, tid, "stat"), "w") as f:
                    f.write(stat + "\n")
            os.makedirs(os.path.join(tasks, "15"))  # ended between listdir and open
            self.assertEqual(_exit.runnable_tasks(tasks, own_tid=10), [11])
            self.assertEqual(sorted(_exit.runnable_tasks(tasks, own_tid=99)), [10, 11])
        self.assertEqual(_exit.runnable_tasks("/nonexistent/task", own_tid=1), [])

    def test_runnable_tasks_on_this_process(self):
        # This thread is running, but never listed; a thread blocked on an event is not runnable.
        release = threading.Event()
        blocked = threading.Thread(target=release.wait)
        blocked.start()
        try:
            self.assertNotIn(threading.get_native_id(), _exit.runnable_tasks())
            # Polled: the thread is runnable until it reaches its wait.
            deadline = time.monotonic() + 30
            while blocked.native_id in _exit.runnable_tasks():
                self.assertLess(time.monotonic(), deadline, "the blocked thread stays runnable")
                time.sleep(0.01)
        finally:
            release.set()
            blocked.join()

    def test_handler_runs_at_exit_of_a_trainer_under_the_shim(self):
        with tempfile.TemporaryDirectory(prefix="spawnpoint-fake-torch-") as tmp:
            os.makedirs(os.path.join(tmp, "torch", "distributed"))
            with open(os.path.join(tmp, "torch", "__init__.py"), "w") as f:
                f.write("__version__ = '1.13.0'\nimport torch.distributed\n")
            with open(os.path.join(tmp, "torch", "distributed", "__init__.py"), "w") as f:
                f.write(FAKE_DISTRIBUTED)
            env = {k: v for k, v in os.environ.items() if not k.startswith("SPAWNPOINT_")}
            env.update(PYTHONPATH=os.pathsep.join((SHIM_DIR, tmp)), SPAWNPOINT_SHIM="1",
                       PYTHONDONTWRITEBYTECODE="1")
            trainer = ("import atexit, torch, torch.distributed as dist\n"
                       "dist.init_process_group()\n"
                       "atexit.register(print, 'trainer handler', flush=True)\n"
                       "print('trained', flush=True)\n")
            proc = subprocess.run([sys.executable, "-c", trainer], cwd=tmp, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  universal_newlines=True, timeout=60)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            # The shim's handler ran after the trainer's own, and asked about the group.
            self.assertEqual(proc.stdout.splitlines(),
                             ["trained", "trainer handler", "asked: initialized"], proc.stderr)
            env["SPAWNPOINT_SHIM"] = "0"
            proc = subprocess.run([sys.executable, "-c", trainer], cwd=tmp, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  universal_newlines=True, timeout=60)
            self.assertEqual(proc.stdout.splitlines(), ["trained", "trainer handler"],
                             proc.stderr)


FAKE_DISTRIBUTED = """\
_initialized = []


class TCPStore(object):
    pass


def is_available():
    return True


def init_process_group():
    _initialized.append(True)


def is_initialized():
    print("asked: %s" % ("initialized" if _initialized else "none"), flush=True)
    return bool(_initialized)
"""


if __name__ == "__main__":
    unittest.main()
