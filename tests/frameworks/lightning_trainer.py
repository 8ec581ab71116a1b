"""A Lightning trainer as users write it, run by the agent as each rank's command:

    python lightning_trainer.py STRATEGY [DEVICES]
    python lightning_trainer.py --batches STRATEGY
    python lightning_trainer.py --library-strategy

`Trainer(accelerator="cpu", devices=DEVICES (2), strategy=STRATEGY)` fits a tiny linear model
for 2 epochs on a DataLoader of 64 samples. With --batches it is a reproducible script as the
Lightning docs make one (seed_everything(7, workers=True), Trainer(deterministic=True)): a
model with dropout (the rank's own torch stream) fits 2 epochs of a shuffled DataLoader of 48
samples whose dataset augments each sample with torch, numpy and random draws, validating on a
second loader of 24 such samples after each epoch (and in Lightning's sanity check, 2 of its 3
batches). The train loader's workers are persistent (one iterator resumed each epoch), the
validation loader's are not (started anew at each iter()); neither sets num_workers (the
job's workersPerRank does), generator (each iterator's base seed comes from the rank's own
torch stream, between dropout's draws) or worker_init_fn (Lightning adds
pl_worker_init_function), and Lightning gives both a DistributedSampler.

With --library-strategy it is the same fit on the standalone pytorch_lightning with the
strategy object a library makes (RF-DETR's for strategy="ddp_notebook" is one):
_LibrarySpawnDDPStrategy(start_method="spawn"), a DDPStrategy subclass whose
_configure_launcher makes the library's own _MultiProcessingLauncher subclass and refuses
start method "popen".

Instrumented, not changed: every process that runs a training step says so once
('SPAWNPOINT-STEP {json}': pid, parent pid, RANK, Lightning's global rank), a process forked by
any process of this script says 'SPAWNPOINT-FORKED {json}' (os.register_at_fork, which fork()
and multiprocessing's fork run; posix_spawn/exec do not), and a process that finished fit()
says 'SPAWNPOINT-LIGHTNING {json}' with its strategy, launcher, final parameters and
"ddp_waits": the backward passes for which the shim timed a wait for DDP's allreduce (an
observer on the shim's BackwardClock, when the shim is there). With --batches that line also
has "batches": every batch a step saw, in order, as [stage (sanity, train, val), epoch, batch
index, the sample indices, a SHA-256 of every field's dtype, shape and bytes, the step's
loss], and "iterators": for each iter() of a DataLoader, [its dataset's name, the iterator's
class, the iterator's number (the same number: the same iterator object, resumed), the
loader's num_workers and persistent_workers].
"""

import hashlib
import itertools
import json
import os
import random
import sys


def say(tag, document):
    sys.stdout.write("%s %s\n" % (tag, json.dumps(document, sort_keys=True)))
    sys.stdout.flush()


def _forked_child():
    say("SPAWNPOINT-FORKED", {"pid": os.getpid(), "ppid": os.getppid(),
                              "rank_env": os.environ.get("RANK")})


os.register_at_fork(after_in_child=_forked_child)

import numpy as np  # noqa: E402
import torch  # noqa: E402
if sys.argv[1:2] == ["--library-strategy"]:
    import pytorch_lightning as L  # noqa: E402
else:
    import lightning as L  # noqa: E402
from torch.utils.data import DataLoader, Dataset, TensorDataset  # noqa: E402

_stepped = []
_ddp_waits = []
_batches = []
_iterators = []
_serials = itertools.count()
_stock_iter = DataLoader.__iter__


def _recording_iter(self):
    """DataLoader.__iter__, noting which iterator served which loader (for --batches)."""
    it = _stock_iter(self)
    if getattr(it, "_test_serial", None) is None:
        it._test_serial = next(_serials)
    _iterators.append([getattr(self.dataset, "name", type(self.dataset).__name__),
                       type(it).__name__, it._test_serial, self.num_workers,
                       bool(getattr(self, "persistent_workers", False))])
    return it


DataLoader.__iter__ = _recording_iter


class Augmented(Dataset):
    """Sample i: x = i / 10 + noise of torch's stream, y its sum, plus a numpy draw and a
    random draw (which the model also sees), and i itself."""

    def __init__(self, name, size):
        self.name, self.size = name, size

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        x = torch.full((4,), i / 10.0) + 0.1 * torch.randn(4)
        return {"x": x, "y": x.sum(0, keepdim=True), "noise": np.random.rand(1),
                "coin": random.random(), "index": i}


def digest(batch):
    """SHA-256 of every field of a batch (a dict of tensors): its dtype, shape and bytes."""
    h = hashlib.sha256()
    for key in sorted(batch):
        t = batch[key].detach().contiguous()
        h.update(("%s %s %s;" % (key, t.dtype, tuple(t.shape))).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def _observe_waits():
    collective = sys.modules.get("spawnpoint_rank._collective")
    if collective is None:
        return
    end = collective._clock.end

    def observed(now):
        wait = end(now)
        if wait:
            _ddp_waits.append(wait)
        return wait

    collective._clock.end = observed


class Model(L.LightningModule):
    def __init__(self, net=None):
        super().__init__()
        self.net = net if net is not None else torch.nn.Linear(4, 1)

    def say_stepped(self):
        if not _stepped:
            _stepped.append(1)
            say("SPAWNPOINT-STEP", {"pid": os.getpid(), "ppid": os.getppid(),
                                    "rank_env": os.environ.get("RANK"),
                                    "global_rank": self.global_rank})

    def training_step(self, batch, batch_idx):
        self.say_stepped()
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Recorded(Model):
    """--batches: a model with dropout that also sees the numpy and random draws, and records
    every batch it is given."""

    def __init__(self):
        super().__init__(torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(),
                                             torch.nn.Dropout(0.25), torch.nn.Linear(8, 1)))

    def loss(self, batch):
        x = torch.cat([batch["x"], batch["noise"].float(), batch["coin"].float()[:, None]], 1)
        return torch.nn.functional.mse_loss(self.net(x), batch["y"])

    def record(self, stage, batch, batch_idx, loss):
        _batches.append([stage, self.current_epoch, batch_idx, batch["index"].tolist(),
                         digest(batch), loss.item()])

    def training_step(self, batch, batch_idx):
        self.say_stepped()
        loss = self.loss(batch)
        self.record("train", batch, batch_idx, loss)
        return loss

    def validation_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.record("sanity" if self.trainer.sanity_checking else "val", batch, batch_idx, loss)


def fit_batches(strategy):
    """--batches (the module docstring): the trainer and the fitted model."""
    L.seed_everything(7, workers=True)
    train = DataLoader(Augmented("train", 48), batch_size=4, shuffle=True,
                       persistent_workers=True)
    val = DataLoader(Augmented("val", 24), batch_size=4, persistent_workers=False)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_epochs=2,
                        deterministic=True, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    model = Recorded()
    _observe_waits()
    trainer.fit(model, train, val)
    return trainer, model


if L.__name__ == "pytorch_lightning":  # --library-strategy: the library's own classes
    from pytorch_lightning.strategies import DDPStrategy
    from pytorch_lightning.strategies.launchers.multiprocessing import _MultiProcessingLauncher

    class _LibraryLauncher(_MultiProcessingLauncher):
        @property
        def is_interactive_compatible(self):
            return True  # the library runs it in notebooks too

    class _LibrarySpawnDDPStrategy(DDPStrategy):
        """A library's DDPStrategy that launches its processes itself (module level, as a
        library's are: spawned processes find it by name)."""

        def _configure_launcher(self):
            if self._start_method == "popen":
                raise RuntimeError("_LibrarySpawnDDPStrategy starts its processes itself: "
                                   "start_method='popen' is not supported")
            self._launcher = _LibraryLauncher(self, start_method=self._start_method)


def fit_tensors(strategy, devices):
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = x.sum(1, keepdim=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_epochs=2,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    model = Model()
    _observe_waits()
    trainer.fit(model, loader)
    return trainer, model


def main():
    batches = sys.argv[1] == "--batches"
    if batches:
        trainer, model = fit_batches(sys.argv[2])
    elif sys.argv[1] == "--library-strategy":
        trainer, model = fit_tensors(_LibrarySpawnDDPStrategy(start_method="spawn"), 2)
    else:
        trainer, model = fit_tensors(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2)
    s = trainer.strategy
    document = {
        "pid": os.getpid(), "ppid": os.getppid(), "rank_env": os.environ.get("RANK"),
        "global_rank": trainer.global_rank, "world_size": trainer.world_size,
        "strategy": type(s).__name__, "start_method": getattr(s, "_start_method", None),
        "launcher": type(s.launcher).__name__ if s.launcher is not None else None,
        "cluster_environment": type(s.cluster_environment).__name__,
        "params": [p.detach().flatten().tolist() for p in model.parameters()],
        "lightning": L.__version__, "torch": torch.__version__, "ddp_waits": len(_ddp_waits),
        "children": children(),
    }
    if batches:
        document.update(batches=_batches, iterators=_iterators)
    say("SPAWNPOINT-LIGHTNING", document)


def children():
    """This process's child processes: of each of its threads (/proc/self/task/T/children).
    A thread may end between the listing and the read (torch's DataLoader threads do as its
    iterators are shut down): it has no children left to name."""
    found = []
    for t in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/children" % t) as f:
                found.extend(int(c) for c in f.read().split())
        except FileNotFoundError:
            pass
    return sorted(found)


if __name__ == "__main__":
    main()
