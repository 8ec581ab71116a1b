"""Unit tests of the shim's Lightning hook (spawnpoint_rank/_lightning.py) on a fake
`_AcceleratorConnector` that resolves strategies the way lightning 2.6's does (no Lightning
is installed here; tests/frameworks runs the real one under the agent). Run through
run_shim_tests.py (ctest).
"""

import io
import os
import sys
import types
import unittest
from unittest import mock

from test_rank_side import SHIM_DIR  # noqa: F401  (and spawnpoint_rank, from SHIM_DIR)

from spawnpoint_rank import _lightning  # noqa: E402

RANK_ENV = {"SPAWNPOINT_SHIM": "1", "TORCHELASTIC_RUN_ID": "default/job", "RANK": "0",
            "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "NNODES": "1", "LOCAL_RANK": "0"}


class DDPStrategy(object):
    def __init__(self, start_method="popen"):
        self._start_method = start_method


def fake_module():
    """A module like lightning's accelerator_connector: __init__ resolves the flag."""

    class _AcceleratorConnector(object):
        def __init__(self, strategy, devices=2, num_nodes=1):
            self._strategy_flag = strategy
            self._parallel_devices = list(range(devices))
            self._num_nodes_flag = num_nodes
            if self._strategy_flag == "auto":
                self._strategy_flag = self._choose_strategy()
            self._check_strategy_and_fallback()
            # _init_strategy and _lazy_init_strategy: the strategy object makes its launcher.
            if hasattr(self._strategy_flag, "_configure_launcher"):
                self._strategy_flag._configure_launcher()

        def _choose_strategy(self):
            return "ddp" if len(self._parallel_devices) > 1 else "single"

        def _check_strategy_and_fallback(self):
            if self._strategy_flag:
                self._strategy_flag = self._strategy_flag

    module = types.ModuleType("lightning.pytorch.trainer.connectors.accelerator_connector")
    module._AcceleratorConnector = _AcceleratorConnector
    return module


def fake_ddp_module(renamed=False):
    """A module like lightning's strategies/ddp.py: DDPStrategy makes its launcher from its
    start method (a new Lightning that renamed _configure_launcher: `renamed`)."""

    class DDPStrategy(object):
        def __init__(self, start_method="popen"):
            self._start_method = start_method
            self._launcher = None

        def _configure_launcher(self):
            if self._start_method == "popen":
                self._launcher = ("_SubprocessScriptLauncher",)
            else:
                self._launcher = ("_MultiProcessingLauncher", self._start_method)

    if renamed:
        DDPStrategy._make_launcher = DDPStrategy._configure_launcher
        del DDPStrategy._configure_launcher
    module = types.ModuleType("lightning.pytorch.strategies.ddp")
    module.DDPStrategy = DDPStrategy
    return module


def library_strategy(base):
    """A library's DDPStrategy subclass that makes its own multiprocessing launcher, refusing
    start method popen (as RF-DETR's ddp_notebook does), and one that does not override it."""

    class _LibSpawnDDPStrategy(base):
        def _configure_launcher(self):
            if self._start_method == "popen":
                raise RuntimeError("this strategy does not support start_method='popen'")
            self._launcher = ("_LibLauncher", self._start_method)

    class DDPLibStrategy(base):
        pass

    return _LibSpawnDDPStrategy, DDPLibStrategy


class LightningHookTest(unittest.TestCase):
    def make(self, environ, *args, **kwargs):
        module = fake_module()
        err = io.StringIO()
        with mock.patch.dict(os.environ, environ, clear=True), mock.patch.object(sys, "stderr", err):
            _lightning.patch(module)
            _lightning.patch(module)  # a second call changes nothing
            connector = module._AcceleratorConnector(*args, **kwargs)
        return connector, err.getvalue()

    def make_with(self, ddp, environ, *args, **kwargs):
        """make(), with `ddp` as Lightning's imported strategies/ddp.py."""
        with mock.patch.dict(sys.modules, {"lightning.pytorch.strategies.ddp": ddp}):
            return self.make(environ, *args, **kwargs)

    def test_external_forms(self):
        cases = [("ddp", ("ddp", None)), ("ddp_spawn", ("ddp", "spawned")),
                 ("ddp_fork", ("ddp", "forked")), ("ddp_notebook", ("ddp", "forked")),
                 ("ddp_spawn_find_unused_parameters_true",
                  ("ddp_find_unused_parameters_true", "spawned")),
                 ("ddp_notebook_find_unused_parameters_false",
                  ("ddp_find_unused_parameters_false", "forked")),
                 ("ddp_spawnx", ("ddp_spawnx", None)), ("fsdp", ("fsdp", None))]
        for name, expected in cases:
            self.assertEqual(_lightning.external_form(name), expected, name)

    def test_maps_and_says_once_on_rank_0(self):
        for strategy, line in [
                ("ddp_notebook", "Lightning strategy ddp_notebook: the agent's 2 ranks run it "
                                 "(as ddp); nothing is forked"),
                ("ddp_spawn", "Lightning strategy ddp_spawn: the agent's 2 ranks run it (as "
                              "ddp); nothing is spawned"),
                ("ddp", "Lightning strategy ddp: the agent's 2 ranks run it; Lightning "
                        "launches nothing"),
                ("auto", "Lightning strategy auto (ddp): the agent's 2 ranks run it; "
                         "Lightning launches nothing")]:
            connector, said = self.make(RANK_ENV, strategy)
            self.assertEqual(connector._strategy_flag, "ddp", strategy)
            self.assertEqual(said, "spawnpoint-shim: %s\n" % line)
            connector, said = self.make(dict(RANK_ENV, RANK="1"), strategy)
            self.assertEqual(connector._strategy_flag, "ddp", strategy)
            self.assertEqual(said, "", "only rank 0 says it")

    def test_strategy_object(self):
        strategy = DDPStrategy("fork")
        connector, said = self.make(RANK_ENV, strategy)
        self.assertIs(connector._strategy_flag, strategy)
        self.assertEqual(strategy._start_method, "popen")
        self.assertIn("DDPStrategy(start_method='fork')", said)
        self.assertIn("nothing is forked", said)

    def test_a_subclass_with_its_own_launcher_gets_ddp_strategys(self):
        ddp = fake_ddp_module()
        own, _ = library_strategy(ddp.DDPStrategy)
        for start, verb in (("spawn", "spawned"), ("fork", "forked"), ("forkserver", "spawned")):
            strategy = own(start)
            connector, said = self.make_with(ddp, RANK_ENV, strategy)
            self.assertIs(connector._strategy_flag, strategy)
            self.assertEqual(strategy._start_method, "popen")
            self.assertEqual(strategy._launcher, ("_SubprocessScriptLauncher",),
                             "DDPStrategy's own _configure_launcher made the launcher")
            self.assertEqual(said, "spawnpoint-shim: Lightning strategy _LibSpawnDDPStrategy("
                             "start_method=%r): the agent's 2 ranks run it as DDPStrategy("
                             "start_method='popen') with DDPStrategy's own launcher (its "
                             "_configure_launcher is not used); nothing is %s\n" % (start, verb))
            strategy = own(start)
            connector, said = self.make_with(ddp, dict(RANK_ENV, RANK="1"), strategy)
            self.assertEqual((strategy._start_method, strategy._launcher, said),
                             ("popen", ("_SubprocessScriptLauncher",), ""),
                             "rank 1: mapped, silent")
        # Given "popen" by its user, it is left to its own launcher (which refuses it here).
        strategy = own("popen")
        with self.assertRaises(RuntimeError):
            self.make_with(ddp, RANK_ENV, strategy)
        self.assertNotIn("_configure_launcher", vars(strategy))
        self.assertEqual(strategy._start_method, "popen")

    def test_a_subclass_without_its_own_launcher_is_mapped_as_before(self):
        ddp = fake_ddp_module()
        _, plain = library_strategy(ddp.DDPStrategy)
        strategy = plain("spawn")
        connector, said = self.make_with(ddp, RANK_ENV, strategy)
        self.assertEqual(strategy._start_method, "popen")
        self.assertNotIn("_configure_launcher", vars(strategy))
        self.assertEqual(strategy._launcher, ("_SubprocessScriptLauncher",))
        self.assertEqual(said, "spawnpoint-shim: Lightning strategy DDPLibStrategy(start_method="
                               "'spawn'): the agent's 2 ranks run it (as DDPLibStrategy("
                               "start_method='popen')); nothing is spawned\n")

    def test_without_ddp_strategys_configure_launcher(self):
        # A new Lightning renamed it: said once; the object keeps its start method and its
        # own launcher, and Lightning's processes are refused where they would start.
        from spawnpoint_rank import _private, _report

        ddp = fake_ddp_module(renamed=True)
        own, plain = library_strategy(ddp.DDPStrategy)
        mp = types.ModuleType("torch.multiprocessing")
        mp.start_processes = lambda *args, **kwargs: None
        _report._reported.clear()
        _private._off.clear()
        _lightning._refusing[:] = []
        try:
            with mock.patch.dict(sys.modules, {"torch.multiprocessing": mp}):
                first, second = own("spawn"), own("spawn")
                said = self.make_with(ddp, RANK_ENV, first)[1] + self.make_with(
                    ddp, RANK_ENV, second)[1]
            off = [l for l in said.splitlines() if " is off: " in l]
            self.assertEqual(len(off), 1, said)
            self.assertIn("has no lightning.pytorch.strategies.ddp.DDPStrategy."
                          "_configure_launcher;", off[0])
            self.assertNotIn("Lightning strategy", said)
            for strategy in (first, second):
                self.assertEqual((strategy._start_method, strategy._launcher),
                                 ("spawn", ("_LibLauncher", "spawn")))
            self.assertTrue(getattr(mp.start_processes, "_spawnpoint_lightning", False),
                            "Lightning's processes are refused")
            # A subclass that does not override it is mapped as before, with nothing said.
            _report._reported.clear()
            strategy = plain("spawn")
            said = self.make_with(ddp, RANK_ENV, strategy)[1]
            self.assertEqual(strategy._start_method, "popen")
            self.assertNotIn(" is off: ", said)
            self.assertIn("(as DDPLibStrategy(start_method='popen')); nothing is spawned", said)
        finally:
            _report._reported.clear()
            _private._off.clear()
            _lightning._refusing[:] = []

    def test_nothing_outside_an_agent_rank(self):
        for environ in ({}, dict(RANK_ENV, SPAWNPOINT_SHIM="0"),
                        {k: v for k, v in RANK_ENV.items() if k != "TORCHELASTIC_RUN_ID"}):
            connector, said = self.make(environ, "ddp_fork", devices=4)
            self.assertEqual(connector._strategy_flag, "ddp_fork")
            self.assertEqual(said, "")

    def test_other_strategies_are_left_alone(self):
        connector, said = self.make(RANK_ENV, "fsdp")
        self.assertEqual((connector._strategy_flag, said), ("fsdp", ""))
        connector, said = self.make(RANK_ENV, "auto", devices=1)
        self.assertEqual((connector._strategy_flag, said), ("single", ""))

    def test_devices_that_contradict_the_job(self):
        with self.assertRaises(ValueError) as caught:
            self.make(RANK_ENV, "ddp_spawn", devices=4)
        message = str(caught.exception)
        self.assertIn("Trainer(devices=4, num_nodes=1) contradicts the job, which runs 2 ranks "
                      "per node on 1 node(s)", message)
        self.assertIn("(at %s:" % os.path.abspath(__file__).replace(".pyc", ".py"), message)
        with self.assertRaises(ValueError) as caught:
            self.make(dict(RANK_ENV, WORLD_SIZE="4", NNODES="2"), "ddp", devices=2, num_nodes=1)
        self.assertIn("num_nodes=1) contradicts the job, which runs 2 ranks per node on 2",
                      str(caught.exception))
        self.make(dict(RANK_ENV, WORLD_SIZE="4", NNODES="2"), "ddp", devices=2, num_nodes=2)


if __name__ == "__main__":
    unittest.main()
