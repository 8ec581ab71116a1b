"""Unit tests of the shim's USE_LIBUV rule (policy.libuv_decision and the torch.distributed
hook, spawnpoint_rank/_distributed.py), with fakes in place of torch 2.x (none is installed
here). Run through run_shim_tests.py (ctest).
"""

import os
import subprocess
import sys
import tempfile
import types
import unittest

from test_rank_side import SHIM_DIR  # and spawnpoint_rank, from SHIM_DIR, in sys.modules

from spawnpoint_rank import _distributed, policy  # noqa: E402


class LibuvTest(unittest.TestCase):
    def test_decision(self):
        cases = [
            ("2.6.0+cpu", None, {}, policy.PROBE),
            ("2.6.0+cpu", False, {}, policy.DISABLE),
            ("2.6.0+cpu", True, {}, policy.KEEP),
            ("2.4.0a0+git1234", False, {}, policy.DISABLE),
            ("10.1", False, {}, policy.DISABLE),
            ("2.6.0", False, {"USE_LIBUV": "1"}, policy.KEEP),  # the user's choice
            ("2.6.0", False, {"USE_LIBUV": ""}, policy.KEEP),
            ("2.6.0", None, {"USE_LIBUV": "0"}, policy.KEEP),
            ("2.3.1", False, {}, policy.KEEP),     # libuv was opt-in before 2.4
            ("1.13.0a0", None, {}, policy.KEEP),   # Debian 12: no libuv, no USE_LIBUV
            ("1.7.1", False, {}, policy.KEEP),
            ("", None, {}, policy.KEEP),
            ("unknown", False, {}, policy.KEEP),
        ]
        for version, has_libuv, environ, expected in cases:
            self.assertEqual(policy.libuv_decision(version, has_libuv, environ), expected,
                             (version, has_libuv, environ))

    def apply(self, version, has_libuv, environ):
        probes, said = [], []
        decision = _distributed.apply_libuv_policy(
            version, lambda: probes.append(1) or has_libuv, environ, said.append)
        return decision, len(probes), said

    def test_apply(self):
        environ = {}
        decision, probes, said = self.apply("2.6.0", False, environ)
        self.assertEqual((decision, probes, environ), (policy.DISABLE, 1, {"USE_LIBUV": "0"}))
        self.assertEqual(len(said), 1)
        self.assertIn("set USE_LIBUV=0: this torch 2.6.0 was built without libuv", said[0])
        # The probe runs only when its answer matters.
        for version, environ, probes_expected in (("1.13.0a0", {}, 0),
                                                  ("2.6.0", {"USE_LIBUV": "1"}, 0),
                                                  ("2.6.0", {}, 1)):
            decision, probes, said = self.apply(version, True, environ)
            self.assertEqual((decision, probes, said), (policy.KEEP, probes_expected, []))
            self.assertNotEqual(environ.get("USE_LIBUV"), "0")

    def test_probe(self):
        calls = []

        def store(result):
            def tcp_store(**kwargs):
                calls.append(kwargs)
                if isinstance(result, Exception):
                    raise result
                return result
            return tcp_store
        self.assertIs(_distributed.probe_libuv(store(RuntimeError(LIBUV_MISSING))), False)
        self.assertIsNone(_distributed.probe_libuv(store(RuntimeError("Address in use"))))
        backend = types.SimpleNamespace(libuvBackend=True)
        self.assertIs(_distributed.probe_libuv(store(backend)), True)
        self.assertEqual({k: calls[0][k] for k in ("host_name", "port", "is_master", "use_libuv")},
                         {"host_name": "127.0.0.1", "port": 0, "is_master": True, "use_libuv": True})

    def test_child_detection(self):
        child = _distributed.multiprocessing_child
        # A spawned child: its interpreter's command line, sys.argv already the parent's.
        spawn_argv = [sys.executable, "-c", "from multiprocessing.spawn import spawn_main; "
                      "spawn_main(tracker_fd=5, pipe_handle=7)", "--multiprocessing-fork"]
        self.assertTrue(child(orig_argv=spawn_argv, argv=["train.py"]))
        self.assertTrue(child(orig_argv=[sys.executable, "-c", "from multiprocessing.forkserver "
                                         "import main; main(5, 6, ['__main__'])"],
                              argv=["train.py"]))
        # Python 3.9 has no orig_argv: the process object spawn's _main() marks.
        inheriting = types.SimpleNamespace(_inheriting=True)
        self.assertTrue(child(orig_argv=[], argv=["train.py"], current=inheriting))
        self.assertFalse(child(orig_argv=[sys.executable, "train.py"], argv=["train.py"],
                               current=types.SimpleNamespace()))

    def test_a_spawned_child_of_the_trainer_is_not_patched_and_says_nothing(self):
        # The DataLoader workers torch spawns (and any multiprocessing child) import the
        # trainer's script, and so torch, while spawn prepares them: the hook must not
        # register its exit handler, time collectives or probe libuv there.
        for method in ("spawn", "forkserver"):
            with tempfile.TemporaryDirectory(prefix="spawnpoint-fake-torch-") as tmp:
                self.write_fake_torch(tmp)
                with open(os.path.join(tmp, "train.py"), "w") as f:
                    f.write(SPAWNING_TRAINER)
                env = self.shim_env(tmp, "2.6.0")
                proc = subprocess.run([sys.executable, "train.py", method], cwd=tmp, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      universal_newlines=True, timeout=120)
                self.assertEqual(proc.stdout, "rank patched=True child patched=False\n",
                                 (method, proc.stderr))
                # Said once, by the rank: the child inherits USE_LIBUV=0 and probes nothing.
                self.assertEqual(proc.stderr.count("set USE_LIBUV=0"), 1, proc.stderr)

    def write_fake_torch(self, tmp):
        os.makedirs(os.path.join(tmp, "torch", "distributed"))
        with open(os.path.join(tmp, "torch", "__init__.py"), "w") as f:
            f.write("import os\n__version__ = os.environ['FAKE_TORCH_VERSION']\n"
                    "import torch.distributed\n")
        with open(os.path.join(tmp, "torch", "distributed", "__init__.py"), "w") as f:
            f.write(FAKE_DISTRIBUTED)

    def shim_env(self, tmp, version, environ=None):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("SPAWNPOINT_") and k != "USE_LIBUV"}
        env.update(environ or {}, PYTHONPATH=os.pathsep.join((SHIM_DIR, tmp)),
                   SPAWNPOINT_SHIM="1", PYTHONDONTWRITEBYTECODE="1", FAKE_TORCH_VERSION=version)
        return env

    def test_hook_through_the_bootstrap_on_a_fake_torch(self):
        # A stand-in torch package whose TCPStore lacks libuv as Debian 13's 2.6 does,
        # imported by a trainer under the shim's environment.
        with tempfile.TemporaryDirectory(prefix="spawnpoint-fake-torch-") as tmp:
            self.write_fake_torch(tmp)
            for version, environ, expected in (("2.6.0", {}, "0"),
                                               ("2.6.0", {"USE_LIBUV": "1"}, "1"),
                                               ("1.13.0a0", {}, None)):
                env = self.shim_env(tmp, version, environ)
                proc = subprocess.run(
                    [sys.executable, "-c", "import os, torch; print(os.environ.get('USE_LIBUV'))"],
                    cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    universal_newlines=True, timeout=60)
                self.assertEqual(proc.stdout, "%s\n" % expected, proc.stderr)
                said = [l for l in proc.stderr.splitlines() if l.startswith("spawnpoint-shim:")]
                self.assertEqual(len(said), 1 if expected == "0" else 0, proc.stderr)
                if said:
                    self.assertIn("set USE_LIBUV=0: this torch 2.6.0 was built without libuv",
                                  said[0])


SPAWNING_TRAINER = """\
import multiprocessing
import os
import sys

import torch  # the fake: under the shim, the torch.distributed hook runs here, and again in
              # the spawned child, which imports this file as __mp_main__
from spawnpoint_rank import _distributed


def child(queue):
    queue.put(_distributed._patched)


if __name__ == "__main__":
    ctx = multiprocessing.get_context(sys.argv[1])
    queue = ctx.Queue()
    worker = ctx.Process(target=child, args=(queue,))
    worker.start()
    print("rank patched=%s child patched=%s" % (_distributed._patched, queue.get(timeout=60)))
    worker.join()
"""

LIBUV_MISSING = "use_libuv was requested but PyTorch was build without libuv support"
FAKE_DISTRIBUTED = """\
class TCPStore(object):
    def __init__(self, *args, **kwargs):
        raise RuntimeError(%r)
""" % LIBUV_MISSING


if __name__ == "__main__":
    unittest.main()
