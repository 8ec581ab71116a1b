"""Lightning in a real Jupyter kernel with the notebook extension (issue 37), run in the
frameworks environment (torch 2.6, Lightning 2.6.6, ipykernel and nbclient from PyPI) by
tests/frameworks/notebook_lightning_under_frameworks.py.

LightningNotebookTest.test_ddp_notebook_with_the_extension: `%load_ext spawnpoint`; the
kernel runs a tensor op on OpenMP threads; a LightningModule and its data defined in cells;
Trainer(strategy="ddp_notebook", devices=2, accelerator="cpu").fit on 2 agent ranks; the next
cell uses the model: its weights' checksum equals the one rank 0 printed at the end of
training (and differs from the kernel's before fit), trainer.state, callback_metrics and the
checkpoint's best_model_path came back; validate and predict run the same way
(predict returns None, as Lightning's spawn launchers do).

LightningNotebookTest.test_every_multiprocessing_strategy_with_the_extension: ddp_spawn,
ddp_fork and "auto" (which Lightning turns into ddp_fork in a kernel with 2 devices) each train
a fresh model on the agent's 2 ranks, and each model comes back with its rank 0's weights.

LightningNotebookTest.test_interrupting_fit_leaves_nothing_running: the kernel interrupted
while both ranks train (max_epochs far away): the cell ends with the interrupt, no process of
the launch is left, nothing in the temporary directory, and the next cell runs.

LightningNotebookTest.test_without_the_extension: the same notebook as users run it today, no
extension: Trainer(strategy="ddp_spawn") is refused by Lightning in a kernel (its module and
data live in the kernel's __main__, which spawned processes cannot import), and
strategy="ddp_notebook" forks the kernel, whose children here fail in their rendezvous
(this torch, Debian's 2.6, was built without libuv: only the agent's shim sets USE_LIBUV=0);
the model is not trained by either.

LightningNotebookTest.test_library_spawn_strategy_on_pytorch_lightning: the pattern of a
library that builds its own ddp_notebook (RF-DETR's `model.train(devices=2,
strategy="ddp_notebook")`), written here as a stand-in: the kernel imports the standalone
pytorch_lightning (never `lightning`), a cell subclasses its _MultiProcessingLauncher (only
is_interactive_compatible) and its DDPStrategy (a _configure_launcher that makes that launcher,
start method spawn), and Trainer(strategy=that strategy, devices=2).fit runs on the agent's 2
ranks: the extension named pytorch_lightning's launcher module when it patched it, the launch
line names the cell's strategy class, and the next cell's model has rank 0's final weights.

LightningNotebookTest.test_library_spawn_strategy_without_the_extension: the same notebook
without `%load_ext spawnpoint`: Lightning spawns 2 children, which cannot unpickle the classes
the cells defined (they have no such __main__), and the fit cell fails with the model untrained.

SPAWNPOINT_NOTEBOOK_ACCELERATOR=gpu runs the notebooks with accelerator="gpu" (one GPU a rank,
NCCL): the project's GPU check (bench/gpu/gpu_check.py) runs
test_ddp_notebook_with_the_extension so on a machine with GPUs. Default: cpu.
"""

import asyncio
import os
import re

from test_notebook import KernelTestCase, text_of

ACCELERATOR = os.environ.get("SPAWNPOINT_NOTEBOOK_ACCELERATOR", "cpu")
if ACCELERATOR not in ("cpu", "gpu"):
    raise SystemExit("SPAWNPOINT_NOTEBOOK_ACCELERATOR must be cpu or gpu, not %r" % ACCELERATOR)
RANKS = "%s ranks" % ACCELERATOR.upper()  # as the launcher says it: "on 2 CPU ranks"

SETUP = """\
%s
import hashlib, os, sys
import torch
torch.set_num_threads(2)
product = (torch.randn(256, 256) @ torch.randn(256, 256)).sum().item()  # OpenMP's pool is up
import lightning as L
ACCELERATOR = "%s"
if ACCELERATOR == "gpu":  # the kernel holds a CUDA context: Lightning's fork would refuse
    print("CUDA IN KERNEL", torch.ones(2, device="cuda").sum().item())
print("KERNEL", sys.executable, torch.__version__, L.__version__, os.getpid())
"""

DEFINITIONS = """\
def checksum(module):
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode() + tensor.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, sync_dist=True)
        print("TRAIN STEP", self.global_rank, batch_idx, flush=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y), sync_dist=True)

    def predict_step(self, batch, batch_idx):
        return self.layer(batch[0])

    def on_train_end(self):
        if self.global_rank == 0:
            print("RANK0 CHECKSUM", checksum(self), flush=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


generator = torch.Generator().manual_seed(0)
inputs = torch.randn(64, 4, generator=generator)
data = torch.utils.data.TensorDataset(inputs, inputs.sum(1, keepdim=True) * 0.5)
loader = lambda: torch.utils.data.DataLoader(data, batch_size=8)
model = Net()
print("BEFORE", checksum(model))
"""

FIT = """\
trainer = L.Trainer(strategy="%s", devices=2, accelerator=ACCELERATOR, max_epochs=2,
                    logger=False, enable_progress_bar=False, enable_model_summary=False,
                    default_root_dir=os.getcwd())
trainer.fit(model, loader())
print("FITTED", checksum(model))
"""

USE = """\
print("AFTER", checksum(model))
print("STATE", trainer.state.fn, trainer.state.status)
print("METRIC", sorted(trainer.callback_metrics), float(trainer.callback_metrics["train_loss"]))
print("BEST", os.path.basename(trainer.checkpoint_callback.best_model_path))
print("OUTPUT", model.layer(torch.ones(1, 4)).item())
"""

VALIDATE = """\
print("VALIDATE", trainer.validate(model, loader()))
print("PREDICT", trainer.predict(model, loader()), trainer.state.fn)
"""

# The library's pattern on the standalone package: a launcher that says it is interactive
# compatible and a DDPStrategy that always makes it, with start method spawn.
PL_SETUP = SETUP.replace("import lightning as L", """\
import pytorch_lightning as L  # the standalone package; DEFINITIONS' L.LightningModule is its
print("PACKAGE", L.__name__)
print("LIGHTNING MODULES", sorted(m for m in sys.modules if m.split(".")[0] == "lightning"))""")

PL_STRATEGY = """\
from pytorch_lightning.strategies import DDPStrategy
from pytorch_lightning.strategies.launchers.multiprocessing import _MultiProcessingLauncher


class SpawnInKernelLauncher(_MultiProcessingLauncher):
    @property
    def is_interactive_compatible(self):
        return True


class NotebookSpawnStrategy(DDPStrategy):
    def _configure_launcher(self):
        self._launcher = SpawnInKernelLauncher(self, start_method=self._start_method)
"""

PL_FIT = """\
trainer = L.Trainer(strategy=NotebookSpawnStrategy(start_method="spawn"), devices=2,
                    accelerator=ACCELERATOR, max_epochs=2, logger=False,
                    enable_progress_bar=False, enable_model_summary=False,
                    default_root_dir=os.getcwd())
launcher = trainer.strategy.launcher
print("LAUNCHER", type(launcher).__name__, launcher._start_method)
trainer.fit(model, loader())
print("FITTED", checksum(model))
"""

PL_USE = """\
print("AFTER", checksum(model))
print("STATE", trainer.state.fn, trainer.state.status)
print("LIGHTNING MODULES", sorted(m for m in sys.modules if m.split(".")[0] == "lightning"))
"""


class LightningNotebookTest(KernelTestCase):
    def line(self, cell, prefix):
        found = [l for l in text_of(self.nb.cells[cell].outputs).splitlines()
                 if re.sub(r"^\[rank \d\] ", "", l).startswith(prefix)]
        self.assertTrue(found, "no %r line in cell %d:\n%s" % (prefix, cell, self.describe()))
        return re.sub(r"^\[rank \d\] ", "", found[0])[len(prefix):].strip()

    def test_ddp_notebook_with_the_extension(self):
        client = self.client([SETUP % ("%load_ext spawnpoint", ACCELERATOR), DEFINITIONS,
                              FIT % "ddp_notebook", USE, VALIDATE])

        async def run():
            async with client.async_setup_kernel(env=self.kernel_environment()):
                for index, cell in enumerate(self.nb.cells):
                    await client.async_execute_cell(cell, index)

        asyncio.run(run())
        if ACCELERATOR == "cpu":  # the frameworks environment's kernel, as ctest runs it
            self.assertIn("/srv/spawnpoint-frameworks/bin/python", self.line(0, "KERNEL"))
        else:  # the GPU check's: the kernel made a CUDA context before fit
            self.assertEqual(self.line(0, "CUDA IN KERNEL"), "2.0")
        said = text_of(self.nb.cells[0].outputs) + text_of(self.nb.cells[2].outputs)
        self.assertEqual(said.count("now run fit/validate/test/predict on ranks that "
                                    "spawnpoint-agent spawns"), 1, self.describe())
        fit = text_of(self.nb.cells[2].outputs)
        self.assertIn("Lightning DDPStrategy (start method fork): fit_impl on 2 " + RANKS, fit)
        self.assertIn("[spawnpoint] launch: main() on 2 " + RANKS, fit)
        for rank in (0, 1):
            self.assertIn("[rank %d] TRAIN STEP %d" % (rank, rank), fit)
        before, rank0 = self.line(1, "BEFORE"), self.line(2, "RANK0 CHECKSUM")
        after = self.line(3, "AFTER")
        self.assertNotEqual(before, rank0)
        self.assertEqual(after, rank0, self.describe())
        self.assertEqual(self.line(3, "STATE"), "TrainerFn.FITTING TrainerStatus.FINISHED")
        self.assertIn("['train_loss']", self.line(3, "METRIC"))
        self.assertRegex(self.line(3, "BEST"), r"^epoch=1-step=8\.ckpt$")
        self.assertIn("'val_loss'", self.line(4, "VALIDATE"))
        # Lightning returns no predictions from its spawn launchers (return_predictions is
        # not supported with _MultiProcessingLauncher); it ran on the ranks all the same.
        self.assertEqual(self.line(4, "PREDICT"), "None TrainerFn.PREDICTING")
        self.assertEqual(self.dirs.left_in_tmp(), [])

    def test_without_the_extension(self):
        client = self.client([SETUP % ("", ACCELERATOR), DEFINITIONS, FIT % "ddp_spawn",
                              FIT % "ddp_notebook",
                              'print("AFTER", checksum(model))'])

        async def run():
            async with client.async_setup_kernel(env=self.kernel_environment()):
                for index, cell in enumerate(self.nb.cells):
                    await client.async_execute_cell(cell, index)

        client.allow_errors = True  # the errors are what this test looks at
        asyncio.run(run())
        errors = [[o for o in c.outputs if o.get("output_type") == "error"] for c in self.nb.cells]
        self.assertEqual(errors[0] + errors[1] + errors[4], [], self.describe())
        self.assertNotIn("spawnpoint-agent spawns", self.describe(), "no extension loaded")
        spawn = errors[2]
        self.assertTrue(spawn, "ddp_spawn ran in a kernel without the extension:\n" +
                        self.describe())
        self.assertIn("is not compatible with an interactive environment",
                      text_of(self.nb.cells[2].outputs, ("stream", "error")))
        fork = errors[3]
        self.assertTrue(fork, "ddp_notebook ran without the extension:\n" + self.describe())
        self.assertIn("use_libuv was requested but PyTorch was build without libuv support",
                      text_of(self.nb.cells[3].outputs, ("stream", "error")))
        self.assertNotIn("FITTED", text_of(self.nb.cells[3].outputs))
        self.assertEqual(self.line(4, "AFTER"), self.line(1, "BEFORE"), "trained after all")

    def test_every_multiprocessing_strategy_with_the_extension(self):
        strategies = ["ddp_spawn", "ddp_fork", "auto"]
        fits = ["model = Net()\n" + FIT % strategy + 'print("AFTER", checksum(model))\n'
                for strategy in strategies]
        client = self.client([SETUP % ("%load_ext spawnpoint", ACCELERATOR), DEFINITIONS] + fits)

        async def run():
            async with client.async_setup_kernel(env=self.kernel_environment()):
                for index, cell in enumerate(self.nb.cells):
                    await client.async_execute_cell(cell, index)

        asyncio.run(run())
        for index, strategy in enumerate(strategies, start=2):
            with self.subTest(strategy=strategy):
                out = text_of(self.nb.cells[index].outputs)
                self.assertIn("[spawnpoint] launch: main() on 2 " + RANKS, out)
                for rank in (0, 1):
                    self.assertIn("[rank %d] TRAIN STEP %d" % (rank, rank), out)
                self.assertEqual(self.line(index, "AFTER"), self.line(index, "RANK0 CHECKSUM"),
                                 self.describe())
        self.assertEqual(self.dirs.left_in_tmp(), [])

    def test_interrupting_fit_leaves_nothing_running(self):
        fit = (FIT % "ddp_notebook").replace("max_epochs=2", "max_epochs=100000")
        client = self.client([SETUP % ("%load_ext spawnpoint", ACCELERATOR), DEFINITIONS, fit,
                              'print("NEXT", 6 * 7)'], raises=(2,))
        seen = self.run_interrupting(client, 2, ["[rank %d] TRAIN STEP %d" % (r, r)
                                                 for r in (0, 1)])
        self.assertTrue(any("_launched.py" in cmd for _, cmd in seen["running"]),
                        "no rank ran: %s\n%s" % (seen["running"], self.describe()))
        # Lightning's trainer takes the KeyboardInterrupt, shuts down and exits: sys.exit(1)
        # (lightning/pytorch/trainer/call.py), the cell's one error.
        self.assertEqual([o["ename"] for o in self.nb.cells[2].outputs
                          if o["output_type"] == "error"], ["SystemExit"], self.describe())
        self.assertIn("Detected KeyboardInterrupt", self.describe())
        self.assertIn("[spawnpoint] launch: interrupted: stopping the agent and its ranks",
                      text_of(self.nb.cells[2].outputs), self.describe())
        self.assertEqual(seen["left"], [], self.describe())
        # Nothing of the launch is left. A rank stopped after `import torch.distributed.nn`
        # cannot remove the module torch wrote for it (a tmp*/_remote_module_non_scriptable.py
        # of tempfile's, removed at a normal exit): that is torch's, said in docs/notebooks.md.
        new = sorted(set(seen["tmp_after"]) - set(seen["tmp_before"]))
        torchs = [p for p in new if re.search(r"/tmp[^/]+(/_remote_module_non_scriptable\.py)?$", p)
                  and (p.endswith(".py") or os.path.join(p, "_remote_module_non_scriptable.py")
                       in new)]
        self.assertEqual([p for p in new if p not in torchs], [], self.describe())
        self.assertEqual(self.line(3, "NEXT"), "42")

    def test_library_spawn_strategy_on_pytorch_lightning(self):
        client = self.client([PL_SETUP % ("%load_ext spawnpoint", ACCELERATOR), PL_STRATEGY,
                              DEFINITIONS, PL_FIT, PL_USE])

        async def run():
            async with client.async_setup_kernel(env=self.kernel_environment()):
                for index, cell in enumerate(self.nb.cells):
                    await client.async_execute_cell(cell, index)

        asyncio.run(run())
        self.assertEqual(self.line(0, "PACKAGE"), "pytorch_lightning")
        # Only the standalone package: lightning.pytorch's launcher is never imported or patched.
        self.assertEqual(self.line(0, "LIGHTNING MODULES"), "[]")
        self.assertEqual(self.line(4, "LIGHTNING MODULES"), "[]")
        said = "".join(text_of(c.outputs) for c in self.nb.cells[:4])
        self.assertEqual(said.count("now run fit/validate/test/predict on ranks that "
                                    "spawnpoint-agent spawns"), 1, self.describe())
        self.assertIn("(pytorch_lightning.strategies.launchers.multiprocessing."
                      "_MultiProcessingLauncher.launch patched;", said, self.describe())
        self.assertNotIn("lightning.pytorch.strategies", said)
        fit = text_of(self.nb.cells[3].outputs)
        self.assertEqual(self.line(3, "LAUNCHER"), "SpawnInKernelLauncher spawn")
        self.assertIn("Lightning NotebookSpawnStrategy (start method spawn): fit_impl on 2 " +
                      RANKS, fit, self.describe())
        self.assertIn("[spawnpoint] launch: main() on 2 " + RANKS, fit)
        for rank in (0, 1):
            self.assertIn("[rank %d] TRAIN STEP %d" % (rank, rank), fit)
        before, rank0 = self.line(2, "BEFORE"), self.line(3, "RANK0 CHECKSUM")
        self.assertNotEqual(before, rank0)
        self.assertEqual(self.line(4, "AFTER"), rank0, self.describe())
        self.assertEqual(self.line(4, "STATE"), "TrainerFn.FITTING TrainerStatus.FINISHED")
        self.assertEqual(self.dirs.left_in_tmp(), [])

    def test_library_spawn_strategy_without_the_extension(self):
        client = self.client([PL_SETUP % ("", ACCELERATOR), PL_STRATEGY, DEFINITIONS, PL_FIT,
                              'print("AFTER", checksum(model))'])

        async def run():
            async with client.async_setup_kernel(env=self.kernel_environment()):
                for index, cell in enumerate(self.nb.cells):
                    await client.async_execute_cell(cell, index)

        client.allow_errors = True  # the fit cell's error is what this test looks at
        asyncio.run(run())
        errors = [[o for o in c.outputs if o.get("output_type") == "error"] for c in self.nb.cells]
        self.assertEqual(errors[0] + errors[1] + errors[2] + errors[4], [], self.describe())
        self.assertNotIn("spawnpoint-agent spawns", self.describe(), "no extension loaded")
        self.assertEqual(self.line(3, "LAUNCHER"), "SpawnInKernelLauncher spawn")
        self.assertTrue(errors[3], "the spawn strategy trained without the extension:\n" +
                        self.describe())
        fit = text_of(self.nb.cells[3].outputs, ("stream", "error"))
        self.assertIn("Can't get attribute", fit, self.describe())
        self.assertNotIn("FITTED", text_of(self.nb.cells[3].outputs))
        self.assertEqual(self.line(4, "AFTER"), self.line(2, "BEFORE"), "trained after all")
