"""Unit tests of the shim's rank side (agent/python/spawnpoint_rank), without torch.

RankEnvTest: RankEnv.from_environ and current(). LoaderPolicyTest: policy.loader_defaults,
every branch of the DataLoader policy. (test_libuv.py: the USE_LIBUV rule.) Run through
run_shim_tests.py (ctest).
"""

import contextlib
import dataclasses
import io
import multiprocessing
import os
import subprocess
import sys
import types
import unittest
import unittest.mock

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("SPAWNPOINT_SOURCE_DIR") or os.path.dirname(os.path.dirname(HERE))
SHIM_DIR = os.path.join(SOURCE_DIR, "agent", "python")

sys.path.insert(0, SHIM_DIR)
try:
    from spawnpoint_rank import _rendezvous, _standby, env as rank_env, policy
    from spawnpoint_rank._report import FORK_WARNING
    from spawnpoint_rank.env import RankEnv
finally:
    sys.path.remove(SHIM_DIR)

FULL = {"SPAWNPOINT_SHIM": "1", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
        "SPAWNPOINT_LOADER_WORKERS": "2", "SPAWNPOINT_LOADER_PERSISTENT_WORKERS": "0",
        "SPAWNPOINT_LOADER_PREFETCH_FACTOR": "3", "SPAWNPOINT_LOADER_TIMEOUT_SECONDS": "7.5",
        "SPAWNPOINT_SHIM_DEBUG": "1"}


def no_cpus():
    raise AssertionError("the affinity was asked for although it is not needed")


class RankEnvTest(unittest.TestCase):
    def parse(self, affinity=no_cpus, **variables):
        return RankEnv.from_environ({"SPAWNPOINT_LOADER_" + k.upper(): v
                                     for k, v in variables.items()}, affinity)

    def test_good_values(self):
        self.assertEqual(RankEnv.from_environ(FULL, no_cpus), RankEnv(
            rank=3, local_rank=1, world_size=4, loader_workers=2, persistent_workers=False,
            prefetch_factor=3, timeout_s=7.5, debug=True, problems=()))

    def test_nothing_set(self):
        self.assertEqual(RankEnv.from_environ({}, no_cpus), RankEnv(
            rank=0, local_rank=0, world_size=1, loader_workers=None, persistent_workers=False,
            prefetch_factor=None, timeout_s=None, debug=False, problems=()))

    def test_blanks_are_stripped_and_empty_is_unset(self):
        parsed = self.parse(workers=" 4 ", prefetch_factor="", timeout_seconds="  ")
        self.assertEqual((parsed.loader_workers, parsed.prefetch_factor, parsed.timeout_s),
                         (4, None, None))
        for on, off in (("1", "0"), ("true", "false"), ("YES", "No"), ("on", "off")):
            self.assertTrue(self.parse(persistent_workers=on).persistent_workers, on)
            self.assertFalse(self.parse(persistent_workers=off).persistent_workers, off)

    def test_auto_workers(self):
        self.assertEqual(self.parse(workers="auto", cpus="3").loader_workers, 3)
        self.assertEqual(self.parse(workers="AUTO", cpus="20").loader_workers, 8)
        self.assertEqual(self.parse(lambda: 5, workers="auto").loader_workers, 5)
        self.assertEqual(self.parse(lambda: 0, workers="auto").loader_workers, 1)
        self.assertEqual(RankEnv.from_environ({"SPAWNPOINT_LOADER_WORKERS": "auto"}).loader_workers,
                         min(len(os.sched_getaffinity(0)), 8))
        # CPUS is read for "auto" only.
        self.assertEqual(self.parse(workers="2", cpus="lots").problems, ())

    def test_each_bad_value_is_one_problem_naming_the_variable_and_what_is_allowed(self):
        L = "SPAWNPOINT_LOADER_"
        cases = [  # environment, field, its value, the one problem
            ({L + "WORKERS": "lots"}, "loader_workers", None,
             L + "WORKERS='lots': not an integer >= 0 or auto"),
            ({L + "WORKERS": "-1"}, "loader_workers", None,
             L + "WORKERS='-1': not an integer >= 0 or auto"),
            ({L + "WORKERS": "auto", L + "CPUS": "0"}, "loader_workers", 6,
             L + "CPUS='0': not a positive integer"),
            ({L + "PERSISTENT_WORKERS": "maybe"}, "persistent_workers", False,
             L + "PERSISTENT_WORKERS='maybe': not 0 or 1"),
            ({L + "PREFETCH_FACTOR": "0"}, "prefetch_factor", None,
             L + "PREFETCH_FACTOR='0': not a number >= 1"),
            ({L + "PREFETCH_FACTOR": "2.5"}, "prefetch_factor", None,
             L + "PREFETCH_FACTOR='2.5': not a number >= 1"),
            ({L + "TIMEOUT_SECONDS": "0"}, "timeout_s", None,
             L + "TIMEOUT_SECONDS='0': not a number > 0"),
            ({L + "TIMEOUT_SECONDS": "soon"}, "timeout_s", None,
             L + "TIMEOUT_SECONDS='soon': not a number > 0"),
            ({"RANK": "x"}, "rank", 0, "RANK='x': not an integer >= 0"),
            ({"LOCAL_RANK": "-2"}, "local_rank", 0, "LOCAL_RANK='-2': not an integer >= 0"),
            ({"WORLD_SIZE": "0"}, "world_size", 1, "WORLD_SIZE='0': not an integer >= 1"),
            ({"RANK": "4", "WORLD_SIZE": "2"}, "rank", 0, "RANK=4: not below WORLD_SIZE=2"),
        ]
        for environ, field, expected, problem in cases:
            parsed = RankEnv.from_environ(environ, lambda: 6)
            self.assertEqual(parsed.problems, ("ignoring " + problem,), environ)
            self.assertEqual(getattr(parsed, field), expected, environ)

    def test_frozen(self):
        with self.assertRaises(dataclasses.FrozenInstanceError):
            RankEnv().rank = 1

    def test_current_is_none_outside_an_agent_started_rank(self):
        for value in (None, "0", "yes"):
            environ = dict(FULL)
            environ.pop("SPAWNPOINT_SHIM")
            if value is not None:
                environ["SPAWNPOINT_SHIM"] = value
            self.assertIsNone(rank_env.current(environ), value)

    def test_current_parses_once_and_again_only_after_a_change(self):
        environ = dict(FULL)
        first = rank_env.current(environ)
        self.assertEqual(first, RankEnv.from_environ(FULL))
        environ["UNRELATED"] = "1"
        self.assertIs(rank_env.current(environ), first)
        environ["SPAWNPOINT_LOADER_WORKERS"] = "5"
        self.assertEqual(rank_env.current(environ).loader_workers, 5)

    def test_current_reports_each_problem_once(self):
        environ = {"SPAWNPOINT_SHIM": "1", "SPAWNPOINT_LOADER_WORKERS": "once-only"}
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            for workers in ("once-only", "2", "once-only"):
                environ["SPAWNPOINT_LOADER_WORKERS"] = workers
                rank_env.current(environ)
        self.assertEqual(stderr.getvalue(), "spawnpoint-shim: ignoring "
                         "SPAWNPOINT_LOADER_WORKERS='once-only': not an integer >= 0 or auto\n")

    def test_every_hook_loads_without_torch(self):
        # The bootstrap's hooks resolve to functions of the package beside it, in a fresh
        # interpreter with the shim's environment, and importing them imports no torch.
        code = ("import sitecustomize, sys\n"
                "for target in sitecustomize._HOOKS.values():\n"
                "    assert callable(sitecustomize._hook_function(target)), target\n"
                "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPAWNPOINT_")}
        env.update(PYTHONPATH=SHIM_DIR, SPAWNPOINT_SHIM="1", PYTHONDONTWRITEBYTECODE="1")
        proc = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
        self.assertEqual((proc.returncode, proc.stdout, proc.stderr), (0, "[]\n", ""))


JOB = RankEnv(loader_workers=2, prefetch_factor=3, timeout_s=30.0)
# What the job fills in by default: persistence is left to the code, as under torchrun.
ALL_FROM_JOB = {"num_workers": 2, "multiprocessing_context": "spawn", "prefetch_factor": 3}


class LoaderPolicyTest(unittest.TestCase):
    def decide(self, env=JOB, explicit=None, iterable=False, daemonic=False, **kwargs):
        return policy.loader_defaults(env, explicit or {}, iterable, daemonic, **kwargs)

    def test_no_job_workers_and_no_code_workers_change_nothing(self):
        self.assertEqual(self.decide(RankEnv()), ({}, []))
        # prefetch_factor and timeout only apply to a loader with workers.
        self.assertEqual(self.decide(RankEnv(prefetch_factor=3, timeout_s=30.0)), ({}, []))
        self.assertEqual(self.decide(RankEnv(loader_workers=0)), ({}, []))

    def test_job_workers_are_applied_when_the_code_left_zero(self):
        for explicit in ({}, {"num_workers": 0}):
            kwargs, notes = self.decide(explicit=explicit)
            self.assertEqual(kwargs, ALL_FROM_JOB, explicit)
            self.assertEqual(policy.debug_line(notes), (
                "set num_workers=0->2 (job), multiprocessing_context='spawn', "
                "prefetch_factor=3 (job)"))
            self.assertEqual(policy.warnings_in(notes), [])

    def test_the_codes_own_choices_are_kept(self):
        kwargs, notes = self.decide(explicit={"num_workers": 3, "persistent_workers": False,
                                              "prefetch_factor": 2, "timeout": 0})
        self.assertEqual(kwargs, {"multiprocessing_context": "spawn"})
        self.assertEqual(policy.debug_line(notes), (
            "set multiprocessing_context='spawn'; kept: num_workers=3, "
            "persistent_workers=False, prefetch_factor=2, timeout=0"))
        kwargs, _ = self.decide(explicit={"num_workers": 3, "multiprocessing_context": "spawn"})
        self.assertNotIn("multiprocessing_context", kwargs)

    def test_code_workers_without_a_job(self):
        kwargs, notes = self.decide(RankEnv(), {"num_workers": 2})
        self.assertEqual(kwargs, {"multiprocessing_context": "spawn"})
        self.assertEqual(policy.debug_line(notes), "set multiprocessing_context='spawn'; "
                         "kept: num_workers=2")

    def test_never_for_an_iterable_dataset(self):
        kwargs, notes = self.decide(iterable=True)
        self.assertEqual(kwargs, {})
        self.assertEqual(notes, [policy.KEPT + "num_workers=0 (IterableDataset: the job's 2 "
                                 "workers would each replay the stream)"])
        # The code's own workers still get spawn and persistence.
        kwargs, _ = self.decide(explicit={"num_workers": 2}, iterable=True)
        self.assertEqual(kwargs["multiprocessing_context"], "spawn")

    def test_never_in_a_daemonic_process(self):
        kwargs, notes = self.decide(daemonic=True)
        self.assertEqual(kwargs, {})
        self.assertEqual(policy.debug_line(notes),
                         "unchanged; kept: num_workers=0 (daemonic process: no children allowed)")

    def test_persistence_is_the_codes_unless_the_job_turns_it_on(self):
        kwargs, _ = self.decide(RankEnv(loader_workers=2))
        self.assertEqual(kwargs, {"num_workers": 2, "multiprocessing_context": "spawn"})
        kwargs, notes = self.decide(RankEnv(loader_workers=2, persistent_workers=True))
        self.assertEqual(kwargs, {"num_workers": 2, "multiprocessing_context": "spawn",
                                  "persistent_workers": True})
        self.assertIn("persistent_workers=True (job)", policy.debug_line(notes))
        kwargs, _ = self.decide(RankEnv(loader_workers=2, persistent_workers=True),
                                {"persistent_workers": False})
        self.assertNotIn("persistent_workers", kwargs)

    def test_explicit_fork_is_honoured_with_a_warning_note(self):
        fork_object = multiprocessing.get_context("fork")  # told by its get_start_method()
        for context, shown in (("fork", "'fork'"), (fork_object, "'fork'")):
            kwargs, notes = self.decide(explicit={"multiprocessing_context": context})
            self.assertNotIn("multiprocessing_context", kwargs)
            self.assertEqual(kwargs["num_workers"], 2)
            self.assertIn("kept: multiprocessing_context=" + shown, policy.debug_line(notes))
            self.assertEqual(policy.warnings_in(notes), [FORK_WARNING])
        _, notes = self.decide(explicit={"multiprocessing_context": "forkserver"})
        self.assertEqual(policy.warnings_in(notes), [])

    def test_only_arguments_this_torch_accepts(self):
        kwargs, notes = self.decide(accepted={"num_workers", "prefetch_factor"})
        self.assertEqual(kwargs, {"num_workers": 2, "prefetch_factor": 3})
        self.assertEqual(policy.debug_line(notes),
                         "set num_workers=0->2 (job), prefetch_factor=3 (job)")

    def test_the_jobs_timeout_is_never_passed_to_the_dataloader(self):
        # torch's timeout= makes one slow batch fatal to the rank; the job's timeoutSeconds
        # means "replace the hung worker", which the agent's pool does.
        for explicit in ({}, {"num_workers": 2}):
            kwargs, notes = self.decide(explicit=explicit)
            self.assertNotIn("timeout", kwargs)
            self.assertNotIn("timeout", policy.debug_line(notes))
        kwargs, notes = self.decide(explicit={"timeout": 5})
        self.assertNotIn("timeout", kwargs)
        self.assertIn("kept: timeout=5", policy.debug_line(notes))

    def test_the_pool_replaces_a_worker_after_the_codes_timeout_or_else_the_jobs(self):
        self.assertEqual(policy.job_timeout_s(JOB, 0), 30.0)
        self.assertEqual(policy.job_timeout_s(JOB, 2.5), 2.5)
        self.assertEqual(policy.job_timeout_s(RankEnv(), 0), 0.0)
        self.assertEqual(policy.job_timeout_s(None, 0), 0.0)

    def test_odd_num_workers_are_left_to_torch(self):
        for odd in (None, -1, "2"):
            kwargs, notes = self.decide(explicit={"num_workers": odd})
            self.assertEqual(kwargs, {}, odd)
            self.assertEqual(notes, [policy.KEPT + "num_workers=%r" % (odd,)])


# /proc/net/tcp as the kernel writes it: a header, then sl local rem st ...
TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:7531 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1
   1: 0100007F:9C40 0100007F:7531 01 00000000:00000000 00:00000000 00000000     0        0 2
"""
TCP6 = """\
  sl  local_address                         remote_address                        st ...
   0: 00000000000000000000000000000000:2710 00000000000000000000000000000000:0000 0A ...
"""


class RendezvousTest(unittest.TestCase):
    """_rendezvous.py: a non-zero rank of node 0 joins env:// once rank 0's store listens."""

    def test_listening_ports_are_read_from_both_tables(self):
        # 0x7531 = 30001 listens; 0x9C40 = 40000 is an established client; 0x2710 = 10000 (v6)
        self.assertEqual(_rendezvous.listening_ports([TCP, TCP6]), {30001, 10000})
        self.assertEqual(_rendezvous.listening_ports(["garbage", ""]), set())

    def test_which_calls_wait(self):
        env = {"RANK": "1", "GROUP_RANK": "0", "MASTER_PORT": "30001"}
        wait = _rendezvous.store_port_to_wait_for
        self.assertEqual(wait(("gloo",), {}, env), 30001)
        self.assertEqual(wait((), {"backend": "nccl", "init_method": "env://"}, env), 30001)
        self.assertIsNone(wait(("gloo",), {}, dict(env, RANK="0")), "rank 0 hosts the store")
        self.assertIsNone(wait(("gloo",), {}, dict(env, GROUP_RANK="1")), "another node's")
        self.assertIsNone(wait(("gloo", "tcp://h:1"), {}, env), "the code's own init_method")
        self.assertIsNone(wait(("gloo",), {"store": object()}, env), "the code's own store")
        self.assertIsNone(wait(("gloo", None, None, 2, 0), {}, env), "rank=0 passed")
        self.assertEqual(wait(("gloo",), {"rank": 1}, dict(env, RANK="0")), 30001)
        self.assertIsNone(wait(("gloo",), {}, dict(env, MASTER_PORT="x")))

    def test_waits_until_the_port_listens_and_no_longer_than_the_limit(self):
        now = [0.0]
        polls = []

        def tables():
            polls.append(now[0])
            return [TCP] if now[0] >= 1.0 else ["header\n"]

        def sleep(s):
            now[0] += s

        self.assertTrue(_rendezvous.wait_for_listener(30001, tables, lambda: now[0], sleep))
        self.assertGreaterEqual(now[0], 1.0)
        self.assertLess(now[0], 1.0 + 2 * _rendezvous.POLL_S)  # found at the next poll
        now[0] = 0.0
        self.assertFalse(_rendezvous.wait_for_listener(4, tables, lambda: now[0], sleep,
                                                       limit_s=3.0))
        self.assertLess(now[0], 3.0 + 2 * _rendezvous.POLL_S)
        self.assertFalse(_rendezvous.wait_for_listener(30001, lambda: [], lambda: 0.0, sleep),
                         "no tables: nothing to wait for")

    def test_init_process_group_is_wrapped_once_and_waits_first(self):
        calls = []

        def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1,
                               rank=-1, store=None):
            calls.append(("init", backend))

        c10d = types.SimpleNamespace(init_process_group=init_process_group)
        dist = types.SimpleNamespace(init_process_group=init_process_group,
                                     distributed_c10d=c10d)
        _rendezvous.patch_init(dist)
        _rendezvous.patch_init(dist)
        self.assertIs(dist.init_process_group, c10d.init_process_group)
        waited = []
        original = _rendezvous.wait_for_listener
        _rendezvous.wait_for_listener = lambda port: (waited.append(port), calls.append("wait"))
        try:
            with unittest.mock.patch.dict(os.environ, {"RANK": "1", "GROUP_RANK": "0",
                                                      "MASTER_PORT": "30001"}):
                dist.init_process_group("gloo")
        finally:
            _rendezvous.wait_for_listener = original
        self.assertEqual(calls, ["wait", ("init", "gloo")])
        self.assertEqual(waited, [30001])


class StandbyModuleTest(unittest.TestCase):
    """_standby.py's pure parts: what a standby preloads, and what a rank writes for it."""

    def setUp(self):
        import tempfile

        self.tmp = tempfile.mkdtemp(prefix="spawnpoint-standby-test-")
        self.addCleanup(__import__("shutil").rmtree, self.tmp, True)

    def test_modules_to_preload_are_the_learned_list_else_torchs_usual(self):
        self.assertEqual(_standby.modules_to_preload({}), list(_standby.DEFAULT_MODULES))
        path = os.path.join(self.tmp, "rank-0.modules")
        with open(path, "w") as f:
            f.write("# learned\ntorch\n\ntorchvision.models\n")
        self.assertEqual(_standby.modules_to_preload({_standby.MODULES_ENV: path}),
                         ["torch", "torchvision.models"])
        missing = {_standby.MODULES_ENV: os.path.join(self.tmp, "none")}
        self.assertEqual(_standby.modules_to_preload(missing), list(_standby.DEFAULT_MODULES))

    def test_the_preload_runs_at_idle_priority_unless_the_job_asks_for_normal(self):
        from spawnpoint_rank import _preload

        idle = _preload.at_idle_priority
        self.assertTrue(idle({}, _standby.PRIORITY_ENV))
        self.assertTrue(idle({_standby.PRIORITY_ENV: "idle"}, _standby.PRIORITY_ENV))
        self.assertFalse(idle({_standby.PRIORITY_ENV: "normal"}, _standby.PRIORITY_ENV))

    def test_the_modules_wait_until_the_loader_workers_have_each_served_a_batch(self):
        # The agent prepares the standby once the file is written: not while the rank's
        # loader workers may still be importing on its CPUs.
        from spawnpoint_rank import _pool, _progress

        saved = (_pool.iterators_served, _pool.workers_warm)
        self.addCleanup(lambda: (setattr(_pool, "iterators_served", saved[0]),
                                 setattr(_pool, "workers_warm", saved[1])))
        _pool.iterators_served, _pool.workers_warm = False, False
        self.assertFalse(_progress._pool_workers_starting())  # no loader on the pool
        _pool.iterators_served = True
        self.assertTrue(_progress._pool_workers_starting())
        _pool.workers_warm = True
        self.assertFalse(_progress._pool_workers_starting())

    def test_the_script_is_argv0_or_the_modules_source(self):
        script = os.path.join(self.tmp, "train.py")
        open(script, "w").close()
        self.assertEqual(_standby.script_path([script, "--lr", "1"], {}), script)
        self.assertIsNone(_standby.script_path(["-c", "pass"], {}))
        self.assertIsNone(_standby.script_path([os.path.join(self.tmp, "gone.py")], {}))
        self.assertTrue(_standby.script_path(["-m"], {_standby.MAIN_ENV: "json.tool"})
                        .endswith(os.path.join("json", "tool.py")))

    def test_a_rank_writes_its_library_modules_not_its_own(self):
        script_dir = os.path.join(self.tmp, "job")
        os.makedirs(script_dir)
        own = types.ModuleType("my_model")
        own.__file__ = os.path.join(script_dir, "my_model.py")
        sys.modules["my_model"] = own
        self.addCleanup(sys.modules.pop, "my_model", None)
        path = os.path.join(self.tmp, "rank-0.modules")
        names = _standby.learn_modules(path, os.path.join(script_dir, "train.py"))
        with open(path) as f:
            self.assertEqual(f.read().split(), names)
        self.assertIn("json", names)
        self.assertIn("unittest.mock", names)
        self.assertNotIn("my_model", names)
        self.assertNotIn("__main__", names)
        self.assertNotIn("sitecustomize", names, "the standby imports it as it preloads")
        self.assertFalse(any(n.startswith("spawnpoint_rank") for n in names))
        self.assertLess(names.index("unittest"), names.index("unittest.mock"), "packages first")


if __name__ == "__main__":
    unittest.main()
