"""Tests of agent/python/sitecustomize.py, the start-up shim for Python trainers.

Every test starts real interpreters with the environment the agent gives a Python rank
(PYTHONPATH=<shim dir>:..., SPAWNPOINT_SHIM=1, SPAWNPOINT_LOADER_*), so the shim is loaded
by Python's own start-up exactly as in production. Run through run_shim_tests.py (ctest).
"""

import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("SPAWNPOINT_SOURCE_DIR") or os.path.dirname(os.path.dirname(HERE))
SHIM_DIR = os.path.join(SOURCE_DIR, "agent", "python")
SHIM_FILE = os.path.realpath(os.path.join(SHIM_DIR, "sitecustomize.py"))
PROBE = os.path.join(HERE, "shim_probe.py")
PYTHON = sys.executable  # the interpreter ctest runs us with (/usr/bin/python3: it has torch)
TIMEOUT = 90  # a hung worker fails the test instead of hanging ctest
# How pickle words a lambda it cannot pickle: "Can't pickle local object" up to Python 3.12
# and again from 3.14, "Can't get local object" in 3.13.
LOCAL_OBJECT = r"Can't (pickle|get) local object"
# The shim's note on a torch without libuv (Debian 13's 2.6): a line besides the loader's.
LIBUV_NOTE = "spawnpoint-shim: set USE_LIBUV=0"

# A sitecustomize that stands for the one the shim must chain to: it logs one line per
# process it runs in.
CHAINED_SITECUSTOMIZE = textwrap.dedent("""\
    import os
    with open(os.environ["CHAIN_LOG"], "a") as f:
        f.write("%d\\n" % os.getpid())
    CHAINED_MARK = "chained"
""")


def clean_environment():
    """The test's environment without anything that would change what the shim sees."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SPAWNPOINT_")
           and k not in ("PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONWARNINGS",
                         "PYTHONINSPECT", "PYTHONSAFEPATH", "PYTHONVERBOSE")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # keep __pycache__ out of the source tree
    return env


def run_python(args, cwd, pythonpath=(SHIM_DIR,), active=True, env=None, check=True):
    """Runs PYTHON with the environment the agent gives a Python rank (or not, active=False)."""
    full_env = clean_environment()
    if pythonpath:
        full_env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    if active:
        full_env["SPAWNPOINT_SHIM"] = "1"
    full_env.update(env or {})
    proc = subprocess.run([PYTHON] + list(args), cwd=cwd, env=full_env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=TIMEOUT)
    if check and proc.returncode != 0:
        raise AssertionError("%s exited with %d\nstdout:\n%s\nstderr:\n%s"
                             % (args, proc.returncode, proc.stdout, proc.stderr))
    return proc


def last_json_line(proc):
    return json.loads(proc.stdout.strip().splitlines()[-1])


class ShimTestCase(unittest.TestCase):
    def setUp(self):
        # Every process runs in a fresh directory, so nothing depends on where ctest runs.
        self.tmp = tempfile.mkdtemp(prefix="spawnpoint-shim-test-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def run_python(self, args, **kwargs):
        return run_python(args, self.tmp, **kwargs)

    def run_json(self, code, **kwargs):
        """Runs code as a script file (spawn needs a real __main__ file) and returns the
        JSON document it printed last."""
        script = os.path.join(self.tmp, "script.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent(code))
        proc = self.run_python([script], **kwargs)
        return last_json_line(proc), proc

    def make_chained(self, name="chained", source=CHAINED_SITECUSTOMIZE):
        directory = os.path.join(self.tmp, name)
        os.mkdir(directory)
        with open(os.path.join(directory, "sitecustomize.py"), "w") as f:
            f.write(source)
        return directory

    def chain_log(self):
        path = os.path.join(self.tmp, "chain.log")
        if not os.path.exists(path):
            return path, []
        with open(path) as f:
            return path, [int(line) for line in f.read().split()]


# What a script sees right after start-up, before it imports anything itself.
STARTUP_REPORT = """
    import json, os, sys
    shim = sys.modules.get("sitecustomize")
    chained = getattr(shim, "chained_sitecustomize", None)
    print(json.dumps({
        "pid": os.getpid(),
        "shim_file": os.path.realpath(shim.__file__) if shim else None,
        "shim_active": bool(getattr(shim, "shim_active", False)),
        "chained_file": os.path.realpath(chained.__file__) if chained else None,
        "chained_mark": getattr(chained, "CHAINED_MARK", None),
        "torch_loaded": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")),
        "multiprocessing_loaded": "multiprocessing" in sys.modules,
        "shim_finders": sum(1 for f in sys.meta_path if getattr(f, "_spawnpoint_shim", False)),
    }))
"""


SPAWN_DEFAULT_SCRIPT = """
    import json, multiprocessing, os, sys, warnings

    def child():
        # A spawned child is a new image running spawn_main; a forked one is not.
        with open("/proc/self/cmdline", "rb") as f:
            sys.exit(0 if b"spawn_main" in f.read() else 3)

    if __name__ == "__main__":
        out = {"allow_none": multiprocessing.get_start_method(allow_none=True),
               "default": multiprocessing.get_context().get_start_method()}
        p = multiprocessing.Process(target=child)
        p.start(); p.join()
        out["child_exit"] = p.exitcode
        multiprocessing.set_start_method("spawn")   # the usual DDP-script call
        multiprocessing.set_start_method("spawn")   # again: a no-op, not an error
        out["after_user_spawn"] = multiprocessing.get_start_method()
        try:
            multiprocessing.set_start_method("forkserver")
            out["second_choice"] = "accepted"
        except RuntimeError as err:                 # stock behaviour kept
            out["second_choice"] = str(err)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            multiprocessing.set_start_method("fork", force=True)
        out["after_user_fork"] = multiprocessing.get_start_method()
        out["fork_warnings"] = [(w.category.__name__, str(w.message), w.lineno)
                                for w in caught]
        print(json.dumps(out))
"""


class StartupTest(ShimTestCase):
    """Start-up behaviour: no torch needed."""

    def test_active_shim_imports_neither_torch_nor_multiprocessing(self):
        report, _ = self.run_json(STARTUP_REPORT)
        self.assertEqual(report["shim_file"], SHIM_FILE)
        self.assertTrue(report["shim_active"])
        self.assertEqual(report["shim_finders"], 1)
        self.assertEqual(report["torch_loaded"], [])
        self.assertFalse(report["multiprocessing_loaded"])

    def test_inactive_without_spawnpoint_shim(self):
        for value in (None, "0", "yes"):
            env = {} if value is None else {"SPAWNPOINT_SHIM": value}
            report, _ = self.run_json(STARTUP_REPORT + """
    import multiprocessing
    print(json.dumps(multiprocessing.get_context().get_start_method()))
""", active=False, env=env)
            self.assertEqual(report, "fork", value)  # CPython's own Linux default, untouched
        report, _ = self.run_json(STARTUP_REPORT, active=False)
        self.assertEqual(report["shim_file"], SHIM_FILE)
        self.assertFalse(report["shim_active"])
        self.assertEqual(report["shim_finders"], 0)

    def test_spawn_is_the_default_and_user_choices_still_work(self):
        report, proc = self.run_json(SPAWN_DEFAULT_SCRIPT)
        self.assertIsNone(report["allow_none"])  # nothing is "set": user code may set it
        self.assertEqual(report["default"], "spawn")
        self.assertEqual(report["child_exit"], 0, "the default Process was not spawned")
        self.assertEqual(report["after_user_spawn"], "spawn")
        self.assertEqual(report["second_choice"], "context has already been set")
        self.assertEqual(report["after_user_fork"], "fork")
        self.assertEqual(len(report["fork_warnings"]), 1)
        category, message, lineno = report["fork_warnings"][0]
        self.assertEqual(category, "RuntimeWarning")
        self.assertIn("Cannot re-initialize CUDA in forked subprocess", message)
        # Attributed to the script's own set_start_method("fork") line.
        fork_line = [i for i, line in enumerate(textwrap.dedent(SPAWN_DEFAULT_SCRIPT).splitlines(), 1)
                     if 'set_start_method("fork"' in line]
        self.assertEqual([lineno], fork_line)

    def test_chains_to_sitecustomize_later_on_the_path_exactly_once(self):
        chained = self.make_chained()
        log, _ = self.chain_log()
        for active in (True, False):
            report, _ = self.run_json(STARTUP_REPORT, pythonpath=(SHIM_DIR, chained),
                                      active=active, env={"CHAIN_LOG": log})
            self.assertEqual(report["shim_active"], active)
            self.assertEqual(report["chained_file"],
                             os.path.realpath(os.path.join(chained, "sitecustomize.py")))
            self.assertEqual(report["chained_mark"], "chained")
            _, pids = self.chain_log()
            self.assertEqual(pids.count(report["pid"]), 1, pids)
        self.assertEqual(len(self.chain_log()[1]), 2)

    def test_chaining_never_recurses(self):
        # The shim's directory again, through a symlink, and a second copy of the shim in
        # another directory, all before the sitecustomize to chain to.
        link = os.path.join(self.tmp, "link")
        os.symlink(SHIM_DIR, link)
        copy = os.path.join(self.tmp, "copy")
        os.mkdir(copy)
        shutil.copy(SHIM_FILE, copy)
        chained = self.make_chained()
        log, _ = self.chain_log()
        report, _ = self.run_json(STARTUP_REPORT, pythonpath=(SHIM_DIR, SHIM_DIR, link, copy, chained),
                                  env={"CHAIN_LOG": log})
        self.assertEqual(report["shim_file"], SHIM_FILE)
        self.assertTrue(report["shim_active"])
        self.assertEqual(report["shim_finders"], 1, "two copies of the shim both installed hooks")
        _, pids = self.chain_log()
        self.assertEqual(pids, [report["pid"]])

    def test_chains_to_the_system_sitecustomize(self):
        # Whatever this interpreter imports as sitecustomize without the shim (Debian:
        # /usr/lib/python3.X/sitecustomize.py) is what the shim must chain to.
        proc = self.run_python(["-c", "import sitecustomize, os; "
                                      "print(os.path.realpath(sitecustomize.__file__))"],
                               pythonpath=(), active=False, check=False)
        expected = proc.stdout.strip() if proc.returncode == 0 else None
        report, _ = self.run_json(STARTUP_REPORT)
        self.assertEqual(report["chained_file"], expected)

    def test_failing_chained_sitecustomize_is_reported_like_site_does(self):
        chained = self.make_chained(source="raise ValueError('broken on purpose')\n")
        report, proc = self.run_json(STARTUP_REPORT, pythonpath=(SHIM_DIR, chained))
        self.assertIn("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                      "ValueError: broken on purpose", proc.stderr)
        self.assertTrue(report["shim_active"])
        self.assertIsNone(report["chained_file"])


class LoaderArgsTest(ShimTestCase):
    """DataLoader arguments under job settings: one process builds every loader (no workers
    are started); each test checks one scenario of shim_probe.py's `args` mode."""

    report = None

    @classmethod
    def setUpClass(cls):
        with tempfile.TemporaryDirectory(prefix="spawnpoint-shim-test-") as tmp:
            proc = run_python([PROBE, "args"], tmp, env={"SPAWNPOINT_SHIM_DEBUG": "1"})
        cls.report = last_json_line(proc)
        cls.stderr = proc.stderr

    def scenario(self, name):
        return self.report["scenarios"][name]

    def value(self, name):
        return self.scenario(name)["value"]

    def assertLoader(self, name, **expected):
        value = self.value(name)
        self.assertEqual({k: value.get(k) for k in expected}, expected, name)
        self.assertEqual(self.scenario(name)["warnings"], [], name)

    def test_no_job_workers_changes_nothing(self):
        from torch.utils.data import DataLoader  # stock: this process has no shim

        self.assertLoader("no_job_workers", num_workers=0, context=None,
                          persistent_workers=False, timeout=0,
                          prefetch_factor=DataLoader([0]).prefetch_factor)  # 2; None since 2.0

    def test_job_workers_when_the_code_left_zero(self):
        # The job's timeoutSeconds (30 here) is never passed: 0 is torch's own default.
        # Persistence stays the code's (torch's default False), as under torchrun.
        self.assertLoader("job_workers", batch_size=4, num_workers=2, context="spawn",
                          persistent_workers=False, prefetch_factor=3, timeout=0)
        self.assertLoader("job_workers_explicit_zero", num_workers=2, context="spawn",
                          persistent_workers=False)

    def test_positional_arguments(self):
        # DataLoader(ds, 2, False, None, None, 3): num_workers=3 is the code's choice.
        self.assertLoader("positional_workers", batch_size=2, num_workers=3, context="spawn",
                          persistent_workers=False)
        # Positional 0 workers and a positional timeout=7.5 the shim must keep.
        self.assertLoader("positional_zero_workers", batch_size=2, num_workers=2,
                          context="spawn", persistent_workers=False, timeout=7.5)

    def test_code_workers_get_spawn_without_job(self):
        self.assertLoader("code_workers_without_job", num_workers=2, context="spawn",
                          persistent_workers=False, prefetch_factor=2, timeout=0)

    def test_explicit_fork_is_honoured_with_a_warning(self):
        for name in ("explicit_fork", "explicit_fork_context_object"):
            value, warnings = self.value(name), self.scenario(name)["warnings"]
            self.assertEqual(value["context"], "fork", name)
            self.assertEqual(value["num_workers"], 2, name)
            self.assertFalse(value["persistent_workers"], name)
            self.assertEqual(len(warnings), 1, name)
            self.assertEqual(warnings[0]["category"], "RuntimeWarning")
            self.assertIn("'fork'", warnings[0]["message"])
            self.assertEqual(warnings[0]["file"], "shim_probe.py")  # points at the trainer

    def test_explicit_choices_are_kept(self):
        self.assertLoader("explicit_not_persistent", num_workers=2, context="spawn",
                          persistent_workers=False)
        self.assertLoader("explicit_prefetch_timeout", num_workers=2, prefetch_factor=2,
                          timeout=0)

    def test_pin_memory_is_left_to_the_code(self):
        # The job's SPAWNPOINT_LOADER_PIN_MEMORY=1 does not turn it on behind the code's back.
        self.assertLoader("pin_memory_untouched", num_workers=2, pin_memory=False)

    def test_job_can_turn_persistence_on(self):
        self.assertLoader("job_not_persistent", num_workers=2, context="spawn",
                          persistent_workers=False)
        self.assertLoader("job_persistent", num_workers=2, context="spawn",
                          persistent_workers=True)

    def test_auto_workers(self):
        self.assertLoader("auto_small", num_workers=3)
        self.assertLoader("auto_large", num_workers=8)
        value = self.value("auto_affinity")
        self.assertEqual(value["num_workers"], min(value["affinity"], 8))

    def test_iterable_dataset_gets_no_job_workers(self):
        self.assertLoader("iterable_dataset", num_workers=0, context=None, persistent_workers=False)

    def test_invalid_job_values_are_reported_once_and_ignored(self):
        without, with_code_workers = self.value("invalid_job_values")
        self.assertEqual(without["num_workers"], 0)
        self.assertEqual(with_code_workers["num_workers"], 1)
        self.assertEqual(with_code_workers["prefetch_factor"], 2)
        self.assertEqual(self.stderr.count(
            "spawnpoint-shim: ignoring SPAWNPOINT_LOADER_WORKERS='lots'"), 1, self.stderr)
        self.assertEqual(self.stderr.count(
            "spawnpoint-shim: ignoring SPAWNPOINT_LOADER_PREFETCH_FACTOR='0'"), 1, self.stderr)

    def test_wrong_call_is_reported_by_torch(self):
        value = self.value("wrong_call")
        self.assertEqual(value["error"], "TypeError")
        self.assertIn("no_such_argument", value["message"])

    def test_signature_is_preserved(self):
        value = self.value("signature")
        self.assertTrue(value["patched"], "DataLoader.__init__ was not wrapped at all")
        self.assertEqual(value["wrapped"], value["original"])
        self.assertIn("num_workers: int = 0", value["wrapped"])

    def test_subclass_calling_super(self):
        self.assertLoader("subclass", batch_size=2, num_workers=2, context="spawn",
                          persistent_workers=False)

    def test_unpicklable_dataset_with_job_workers_falls_back_to_the_main_process(self):
        self.assertEqual(self.value("unpicklable_job_workers"), [0, 10, 20, 30])
        warnings = self.scenario("unpicklable_job_workers")["warnings"]
        self.assertEqual(len(warnings), 1)
        self.assertIn("runs in the main process", warnings[0]["message"])
        self.assertRegex(warnings[0]["message"], LOCAL_OBJECT)

    def test_unpicklable_dataset_with_code_workers_explains_spawn(self):
        value = self.value("unpicklable_code_workers")
        self.assertEqual(value["error"], "RuntimeError")
        self.assertIn("'spawn'", value["message"])
        self.assertIn("multiprocessing_context='fork'", value["message"])
        self.assertRegex(value["cause"], LOCAL_OBJECT)

    def test_debug_line_per_loader(self):
        lines = [l for l in self.stderr.splitlines() if l.startswith("spawnpoint-shim: DataLoader(")]
        pid = self.report["pid"]
        self.assertTrue(all(("in pid %d:" % pid) in l for l in lines), lines)
        # One line per DataLoader built: one per scenario, except that "signature" builds
        # none, "wrong_call" fails in torch before the line, "invalid_job_values" builds two.
        built = len(self.report["scenarios"]) - 2 + 1
        self.assertEqual(len(lines), built, "\n".join(lines))
        self.assertIn("set num_workers=0->2 (job), multiprocessing_context='spawn', "
                      "prefetch_factor=3 (job)",
                      self.stderr)
        self.assertIn("kept: num_workers=2, multiprocessing_context='fork'", self.stderr)


def samples(loader):
    return [s for epoch in loader["epochs"] for s in epoch]


def worker_pids(epoch):
    return {s["pid"] for s in epoch}


class WorkerAssertions(object):
    def assertSpawned(self, sample, parent_pid):
        self.assertTrue(sample["exec_spawn_main"], sample)        # a new process image
        self.assertFalse(sample["inherited_parent_state"], sample)  # not a copy of the parent
        self.assertEqual(sample["main_module"], "__mp_main__", sample)
        self.assertEqual(sample["start_method"], "spawn", sample)
        self.assertEqual(sample["ppid"], parent_pid, sample)

    def assertForked(self, sample, parent_pid):
        self.assertFalse(sample["exec_spawn_main"], sample)
        self.assertTrue(sample["inherited_parent_state"], sample)
        self.assertEqual(sample["ppid"], parent_pid, sample)


class WorkersTest(WorkerAssertions, ShimTestCase):
    """Real DataLoader workers, observed from inside the workers."""

    def run_probe(self, loaders, **kwargs):
        proc = self.run_python([PROBE, "workers", json.dumps({"loaders": loaders})], **kwargs)
        return last_json_line(proc), proc

    def test_num_workers_2_are_spawned_and_persistent_when_the_job_says(self):
        chained = self.make_chained()
        log, _ = self.chain_log()
        result, proc = self.run_probe(
            [{"kwargs": {"batch_size": None, "num_workers": 2}, "samples": 4, "epochs": 2}],
            pythonpath=(SHIM_DIR, chained), env={"CHAIN_LOG": log, "SPAWNPOINT_SHIM_DEBUG": "1",
                                                 "SPAWNPOINT_LOADER_PERSISTENT_WORKERS": "1"})
        loader = result["loaders"][0]
        self.assertEqual((loader["context"], loader["persistent_workers"]), ("spawn", True))
        first, second = loader["epochs"]
        self.assertEqual([s["index"] for s in first], [0, 1, 2, 3])
        self.assertEqual([s["index"] for s in second], [0, 1, 2, 3])
        for sample in samples(loader):
            self.assertSpawned(sample, result["pid"])
            # The workers ran the shim at their own start-up: active, harmless.
            self.assertEqual(sample["shim_file"], SHIM_FILE)
            self.assertTrue(sample["shim_active"])
        self.assertEqual({s["worker_id"] for s in first}, {0, 1})
        self.assertEqual(len(worker_pids(first)), 2)
        self.assertEqual(worker_pids(first), worker_pids(second), "workers were not persistent")
        # The chained sitecustomize ran exactly once in the trainer and in each worker.
        _, pids = self.chain_log()
        counts = collections.Counter(pids)
        self.assertTrue(all(n == 1 for n in counts.values()), counts)
        self.assertLessEqual(worker_pids(first) | {result["pid"]}, set(counts))
        debug = [l for l in proc.stderr.splitlines() if l.startswith("spawnpoint-shim:")
                 and not l.startswith(LIBUV_NOTE)]
        self.assertEqual(debug, ["spawnpoint-shim: DataLoader(ProbeDataset) in pid %d: set "
                                 "multiprocessing_context='spawn', persistent_workers=True "
                                 "(job); kept: num_workers=2" % result["pid"]])

    def test_explicit_fork_and_explicit_non_persistence_are_respected(self):
        result, proc = self.run_probe([
            # The code chose fork: honoured (with a warning), still made persistent.
            {"kwargs": {"batch_size": None, "num_workers": 2, "multiprocessing_context": "fork"}},
            # The code chose non-persistent workers: honoured, still spawned. Workers from
            # the job (the code left num_workers at 0).
            {"kwargs": {"batch_size": None, "persistent_workers": False}, "samples": 2},
        ], env={"SPAWNPOINT_LOADER_WORKERS": "1", "PROBE_INNER_LOADER": "1",
                "SPAWNPOINT_LOADER_PERSISTENT_WORKERS": "1"})
        forked, fresh = result["loaders"]
        self.assertEqual((forked["context"], forked["persistent_workers"]), ("fork", True))
        for sample in samples(forked):
            self.assertForked(sample, result["pid"])
        self.assertEqual(worker_pids(forked["epochs"][0]), worker_pids(forked["epochs"][1]))
        self.assertEqual(len(worker_pids(forked["epochs"][0])), 2)
        self.assertIn("RuntimeWarning: spawnpoint: the 'fork' start method", proc.stderr)

        self.assertEqual((fresh["num_workers"], fresh["context"], fresh["persistent_workers"]),
                         (1, "spawn", False))
        for sample in samples(fresh):
            self.assertSpawned(sample, result["pid"])
        for sample in samples(forked) + samples(fresh):
            self.assertEqual(sample["inner_loader_workers"], 0, "job workers inside a worker")
        first, second = (worker_pids(e) for e in fresh["epochs"])
        self.assertEqual(len(first), 1)
        self.assertTrue(first.isdisjoint(second), "a non-persistent worker survived its epoch")

    def test_inactive_shim_changes_nothing(self):
        result, proc = self.run_probe(
            [{"kwargs": {"batch_size": None, "num_workers": 2}}],
            active=False, env={"SPAWNPOINT_LOADER_WORKERS": "4", "SPAWNPOINT_SHIM_DEBUG": "1"})
        loader = result["loaders"][0]
        self.assertEqual((loader["num_workers"], loader["context"], loader["persistent_workers"]),
                         (2, None, False))
        for sample in samples(loader):
            self.assertForked(sample, result["pid"])  # CPython's Linux default
            self.assertFalse(sample["shim_active"])
        self.assertTrue(worker_pids(loader["epochs"][0]).isdisjoint(worker_pids(loader["epochs"][1])))
        self.assertNotIn("spawnpoint-shim", proc.stderr)


AGENT_JOB = """\
apiVersion: spawnpoint.dev/v1alpha1
kind: TrainingJob
metadata: {name: python-shim}
spec:
  nodes: 1
  gpusPerNode: 0
  procsPerNode: 1
  backend: gloo
  template:
    spec:
      containers:
        - name: trainer
          image: unused
          command: %s
  loader:
    workersPerRank: 2
    timeoutSeconds: 60
    persistentWorkers: true  # asked for here (the default is the code's choice)
    pythonPool: false  # the shim's own defaults; test_pool_agent.py covers the pool
  restartPolicy: {maxRestarts: 0}
"""


@unittest.skipUnless(os.environ.get("SPAWNPOINT_AGENT_BIN"), "needs --agent (the built spawnpoint-agent)")
class AgentTest(WorkerAssertions, ShimTestCase):
    """A Python trainer whose DataLoader leaves num_workers at 0, run by `spawnpoint-agent
    run` with workersPerRank: 2 and pythonPool: false (torch's own workers, with the shim's
    defaults), the shim found where the agent ships it (bin/../share/spawnpoint/python)."""

    def test_python_rank_under_the_agent_gets_spawned_persistent_workers(self):
        spec = {"loaders": [{"kwargs": {"batch_size": None}, "samples": 4, "epochs": 2}]}
        job = os.path.join(self.tmp, "job.yaml")
        with open(job, "w") as f:
            f.write(AGENT_JOB % json.dumps([PYTHON, PROBE, "workers", json.dumps(spec)]))
        env = clean_environment()
        env["SPAWNPOINT_SHIM_DEBUG"] = "1"
        proc = subprocess.run([os.environ["SPAWNPOINT_AGENT_BIN"], "run", "-f", job,
                               "--gpu-backend", "none", "--master-port", "0"],
                              cwd=self.tmp, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, timeout=TIMEOUT)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        reports = [line.split("] ", 1)[1] for line in proc.stdout.splitlines()
                   if line.startswith("[rank 0] {")]
        self.assertEqual(len(reports), 1, proc.stdout)
        result = json.loads(reports[0])
        loader = result["loaders"][0]
        self.assertEqual((loader["num_workers"], loader["context"], loader["persistent_workers"]),
                         (2, "spawn", True))
        for sample in samples(loader):
            self.assertSpawned(sample, result["pid"])
            self.assertTrue(sample["shim_active"])
            self.assertTrue(sample["shim_file"].endswith("/share/spawnpoint/python/sitecustomize.py"),
                            sample["shim_file"])
        first, second = (worker_pids(e) for e in loader["epochs"])
        self.assertEqual(len(first), 2)
        self.assertEqual(first, second, "workers were not persistent")
        with open(samples(loader)[0]["shim_file"]) as shipped, open(SHIM_FILE) as source:
            self.assertEqual(shipped.read(), source.read(), "the agent ships a stale shim")
        self.assertIn("set num_workers=0->2 (job), multiprocessing_context='spawn', "
                      "persistent_workers=True (job), prefetch_factor=2 (job)",
                      proc.stderr + proc.stdout)


if __name__ == "__main__":
    unittest.main()
