"""spawnpoint.launch() in a real Jupyter kernel (issue 37): notebooks executed by nbclient on
Debian's python3 kernel (ipykernel 6.17, nbclient 0.7.2), the spawnpoint package on the
kernel's PYTHONPATH as docs/notebooks.md says.

NotebookTest.test_cells_on_two_ranks_and_an_exception_on_rank_1: the kernel runs a tensor
op on OpenMP threads; a function, a Dataset class and a lambda defined in cells run on 2 CPU
ranks (gloo all_reduce, the agent's loader pool), rank 0's result used in the next cell; an
exception on rank 1 shows in the cell's error output with rank 1's traceback (the cell's
source line) and the agent's cause; the kernel launches again afterwards.

NotebookTest.test_interrupt_mid_training_leaves_nothing_running: the cell is interrupted
(nbclient's kernel manager, as the notebook's stop button) once both ranks' lines have shown
in the cell's output while they train: KeyboardInterrupt in the cell, no process of the
launch left, nothing left in the kernel's TMPDIR, and the kernel launches again.
"""

import asyncio
import json
import os
import re
import time
import unittest

from notebook_support import (TIMEOUT, PrivateDirs, launching_environment, new_marker,
                              processes_with)

import sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ports import free_port  # noqa: E402  (tests/support/ports.py)

ANSI = re.compile(r"\x1b\[[0-9;]*m")

SETUP = """\
import json, os, time
import torch
torch.set_num_threads(2)
product = (torch.randn(256, 256) @ torch.randn(256, 256)).sum().item()  # OpenMP's pool is up
import spawnpoint
PORT = %d
"""

DEFINITIONS = """\
class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor(float(i * i))


double = lambda batch: torch.stack(batch) * 2


def train(offset):
    import torch.distributed as dist

    dist.init_process_group(os.environ["SPAWNPOINT_BACKEND"])
    loader = torch.utils.data.DataLoader(Squares(), batch_size=4, num_workers=2,
                                         collate_fn=double)
    iterator = iter(loader)
    total = torch.zeros(())
    for batch in iterator:
        total += batch.sum()
    dist.all_reduce(total)
    print("rank", dist.get_rank(), "total", total.item())
    return {"total": total.item() + offset, "iterator": type(iterator).__name__,
            "dataset": Squares()}
"""

LAUNCH = "result = spawnpoint.launch(train, 1000, nprocs=2, master_port=PORT)"

USE = """\
print("USED " + json.dumps({"total": result["total"], "iterator": result["iterator"],
                            "callers_class": isinstance(result["dataset"], Squares)}))
"""

REFUSE = """\
def refuse():
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise ValueError("rank one refuses")
    dist.barrier()


spawnpoint.launch(refuse, nprocs=2, master_port=PORT)
"""

AGAIN = "spawnpoint.launch(lambda: 6 * 7, master_port=PORT)"

FOREVER = """\
def train_forever():
    import torch.distributed as dist

    dist.init_process_group("gloo")
    step = torch.zeros(())
    while True:
        dist.all_reduce(step)
        step += 1
        print("training step %d" % step.item())
        time.sleep(0.2)


spawnpoint.launch(train_forever, nprocs=2, master_port=PORT)
"""


def text_of(outputs, kinds=("stream",)):
    parts = []
    for out in outputs:
        if out.get("output_type") in kinds:
            if out["output_type"] == "stream":
                parts.append(out.get("text", ""))
            elif out["output_type"] == "error":
                parts.append("\n".join(out.get("traceback", [])))
            elif out["output_type"] == "execute_result":
                parts.append(out.get("data", {}).get("text/plain", ""))
    return ANSI.sub("", "".join(parts))


class KernelTestCase(unittest.TestCase):
    """A test that runs notebooks (self.nb) on a real python3 kernel with nbclient, in its
    private directories, the spawnpoint package where the launcher's users put it."""

    def setUp(self):
        import nbformat

        self.nbformat = nbformat
        self.dirs = PrivateDirs(self)
        self.marker = new_marker()
        saved = os.environ.get("JUPYTER_RUNTIME_DIR")
        # The kernel's connection file goes to the test's directory, not the user's.
        os.environ["JUPYTER_RUNTIME_DIR"] = os.path.join(self.dirs.work, "runtime")
        self.addCleanup(lambda: os.environ.pop("JUPYTER_RUNTIME_DIR") if saved is None
                        else os.environ.__setitem__("JUPYTER_RUNTIME_DIR", saved))

    def kernel_environment(self):
        env = launching_environment(self.dirs.tmp, self.marker)
        env["IPYTHONDIR"] = os.path.join(self.dirs.work, "ipython")  # its history, not ~'s
        # After a cell's error (sent with stop_on_error, as nbclient sends a cell without the
        # raises-exception tag) ipykernel aborts every execute request that reaches it within
        # stop_on_error_timeout (0 s by default: whether the next cell's request is aborted,
        # with no output and no error, is a race a loaded machine loses). A cell the test
        # expects to raise is tagged (client(raises=)); one second here makes an untagged
        # cell's error lose the next cell every time instead of now and then.
        profile = os.path.join(env["IPYTHONDIR"], "profile_default")
        os.makedirs(profile, exist_ok=True)
        with open(os.path.join(profile, "ipython_kernel_config.py"), "w") as f:
            f.write("c.Kernel.stop_on_error_timeout = 1.0\n")
        env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"  # debugpy's warning about frozen modules
        return env

    def client(self, sources, raises=()):
        """An nbclient client for cells of `sources`; those at the indices in `raises` carry
        the raises-exception tag (the error is expected: nbclient raises nothing for it, the
        test reads it from the cell's outputs, and the kernel runs the next cell)."""
        from nbclient import NotebookClient

        nb = self.nbformat.v4.new_notebook()
        nb.cells = [self.nbformat.v4.new_code_cell(s) for s in sources]
        for index in raises:
            nb.cells[index].metadata["tags"] = ["raises-exception"]
        self.nb = nb
        return NotebookClient(nb, kernel_name="python3", timeout=TIMEOUT, startup_timeout=300,
                              resources={"metadata": {"path": self.dirs.work}})

    def run_interrupting(self, client, index, shown):
        """Runs the notebook's cells in order on a new kernel; cell `index` is interrupted, as
        the notebook's stop button does, once every string of `shown` is in its output (or it
        ended, or TIMEOUT passed). Returns what was seen: the cell's output then ("before"),
        the launch's processes then ("running") and after the cell ended ("left"), the kernel's
        TMPDIR before the cell ("tmp_before") and after it ("tmp_after")."""
        seen = {}

        async def run():
            async with client.async_setup_kernel(env=self.kernel_environment()):
                kernel_pid = client.km.provisioner.pid
                cells = self.nb.cells
                for i in range(index):
                    await client.async_execute_cell(cells[i], i)
                seen["tmp_before"] = self.dirs.left_in_tmp()
                running = asyncio.ensure_future(client.async_execute_cell(cells[index], index))
                deadline = time.monotonic() + TIMEOUT
                while not all(s in text_of(cells[index].outputs) for s in shown):
                    if running.done() or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.1)  # the cell's outputs arrive meanwhile
                seen["before"] = text_of(cells[index].outputs)
                seen["running"] = processes_with(self.marker, exclude=(kernel_pid,))
                await client.km.interrupt_kernel()
                await running  # the interrupted cell is tagged: its error is in its outputs
                seen["left"] = processes_with(self.marker, exclude=(kernel_pid,))
                seen["tmp_after"] = self.dirs.left_in_tmp()
                for i in range(index + 1, len(cells)):
                    await client.async_execute_cell(cells[i], i)

        asyncio.run(run())
        return seen

    def describe(self):
        return "\n".join("--- cell %d:\n%s" % (i, text_of(c.outputs, ("stream", "error",
                                                                       "execute_result")))
                         for i, c in enumerate(self.nb.cells))


class NotebookTest(KernelTestCase):
    def test_cells_on_two_ranks_and_an_exception_on_rank_1(self):
        from nbclient.exceptions import CellExecutionError

        client = self.client([SETUP % free_port(), DEFINITIONS, LAUNCH, USE, REFUSE, AGAIN],
                             raises=(4,))
        failure = []

        async def run():
            async with client.async_setup_kernel(env=self.kernel_environment()):
                for index, cell in enumerate(self.nb.cells):
                    try:
                        await client.async_execute_cell(cell, index)
                    except CellExecutionError as err:
                        failure.append((index, err))

        asyncio.run(run())
        cells = self.nb.cells
        self.assertEqual([i for i, _ in failure], [], self.describe())  # but the tagged cell's
        self.assertEqual([[o["ename"] for o in c.outputs if o["output_type"] == "error"]
                          for c in cells], [[], [], [], [], ["ValueError"], []], self.describe())
        launched = text_of(cells[2].outputs)
        self.assertIn("[spawnpoint] launch: train() on 2 CPU ranks, backend gloo", launched)
        self.assertIn("[rank 1] rank 1 total 560.0", launched)
        used = [l for l in text_of(cells[3].outputs).splitlines() if l.startswith("USED ")]
        self.assertEqual(json.loads(used[0][len("USED "):]),
                         {"total": 1560.0, "iterator": "_PoolDataLoaderIter",
                          "callers_class": True}, self.describe())

        errors = [o for o in cells[4].outputs if o["output_type"] == "error"]
        self.assertEqual(len(errors), 1, self.describe())
        self.assertEqual((errors[0]["ename"], errors[0]["evalue"]),
                         ("ValueError", "rank one refuses"))
        shown = text_of(cells[4].outputs, ("error",))
        self.assertIn("RankFailed: rank 1 failed: ValueError: rank one refuses", shown)
        self.assertIn("the agent's cause: UserError: uncaught exception", shown)
        # Rank 1's traceback with the cell's own line: the cell's source went with the call.
        self.assertIn("rank 1's traceback:", shown)
        ranks = shown.split("rank 1's traceback:")[1].split("The above exception")[0]
        self.assertIn('Cell In [5], line 6, in refuse\n    raise ValueError("rank one refuses")\n'
                      'ValueError: rank one refuses', ranks)
        self.assertIn("[rank 1] ValueError: rank one refuses", text_of(cells[4].outputs))
        self.assertEqual(text_of(cells[5].outputs, ("execute_result",)), "42", self.describe())
        self.assertEqual(self.dirs.left_in_tmp(), [])

    def test_interrupt_mid_training_leaves_nothing_running(self):
        client = self.client([SETUP % free_port(), FOREVER, AGAIN], raises=(1,))
        seen = self.run_interrupting(client, 1, ["[rank %d] training step" % r for r in (0, 1)])
        before = seen["before"]
        self.assertIn("[rank 0] training step", before, self.describe())
        self.assertIn("[rank 1] training step", before, self.describe())
        self.assertTrue(any("_launched.py" in cmd for _, cmd in seen["running"]), seen["running"])
        errors = [o for o in self.nb.cells[1].outputs if o["output_type"] == "error"]
        self.assertEqual([e["ename"] for e in errors], ["KeyboardInterrupt"], self.describe())
        self.assertIn("[spawnpoint] launch: interrupted: stopping the agent and its ranks",
                      text_of(self.nb.cells[1].outputs))
        self.assertEqual(seen["left"], [], self.describe())
        self.assertEqual(seen["tmp_after"], seen["tmp_before"])
        self.assertEqual([p for p in seen["tmp_after"] if "spawnpoint" in p], [])
        self.assertEqual(text_of(self.nb.cells[2].outputs, ("execute_result",)), "42",
                         self.describe())
