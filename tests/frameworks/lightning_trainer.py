"""A Lightning trainer as users write it, run by the agent as each rank's command:

    python lightning_trainer.py STRATEGY [DEVICES]

`Trainer(accelerator="cpu", devices=DEVICES (2), strategy=STRATEGY)` fits a tiny linear model
for 2 epochs on a DataLoader of 64 samples. Instrumented, not changed: every process that runs
a training step says so once ('SPAWNPOINT-STEP {json}': pid, parent pid, RANK, Lightning's
global rank), a process forked by any process of this script says 'SPAWNPOINT-FORKED {json}'
(os.register_at_fork, which fork() and multiprocessing's fork run; posix_spawn/exec do not),
and a process that finished fit() says 'SPAWNPOINT-LIGHTNING {json}' with its strategy,
launcher, final parameters and "ddp_waits": the backward passes for which the shim timed a
wait for DDP's allreduce (an observer on the shim's BackwardClock, when the shim is there).
"""

import json
import os
import sys


def say(tag, document):
    sys.stdout.write("%s %s\n" % (tag, json.dumps(document, sort_keys=True)))
    sys.stdout.flush()


def _forked_child():
    say("SPAWNPOINT-FORKED", {"pid": os.getpid(), "ppid": os.getppid(),
                              "rank_env": os.environ.get("RANK")})


os.register_at_fork(after_in_child=_forked_child)

import torch  # noqa: E402
import lightning as L  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

_stepped = []
_ddp_waits = []


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
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        if not _stepped:
            _stepped.append(1)
            say("SPAWNPOINT-STEP", {"pid": os.getpid(), "ppid": os.getppid(),
                                    "rank_env": os.environ.get("RANK"),
                                    "global_rank": self.global_rank})
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main():
    strategy = sys.argv[1]
    devices = int(sys.argv[2]) if len(sys.argv) > 2 else 2
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
    s = trainer.strategy
    say("SPAWNPOINT-LIGHTNING", {
        "pid": os.getpid(), "ppid": os.getppid(), "rank_env": os.environ.get("RANK"),
        "global_rank": trainer.global_rank, "world_size": trainer.world_size,
        "strategy": type(s).__name__, "start_method": getattr(s, "_start_method", None),
        "launcher": type(s.launcher).__name__ if s.launcher is not None else None,
        "cluster_environment": type(s.cluster_environment).__name__,
        "params": [p.detach().flatten().tolist() for p in model.parameters()],
        "lightning": L.__version__, "torch": torch.__version__, "ddp_waits": len(_ddp_waits),
        "children": sorted(int(c) for t in os.listdir("/proc/self/task")
                           for c in open("/proc/self/task/%s/children" % t).read().split()),
    })


if __name__ == "__main__":
    main()
