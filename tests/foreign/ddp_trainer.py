"""A 2-rank DDP trainer (gloo, CPU) with a DataLoader whose workers come from the job: run by
ddp_under_agent.py through `spawnpoint-agent run` inside a foreign root. It prints one line
'SPAWNPOINT-FOREIGN {json}' saying which Python, torch and glibc ran it, what the DataLoader
was given and which processes made its batches in each epoch.

    ddp_trainer.py [EPOCHS]

Written for torch 1.7 to 2.x and Python 3.9 and up. Everything but the dataset runs under
the __main__ guard, as spawned workers require.
"""

import gc
import json
import os
import platform
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

SAMPLES = 64


class Line(Dataset):
    """y = 3x - 1 with the pid of the process that made each sample."""

    def __len__(self):
        return SAMPLES

    def __getitem__(self, index):
        x = torch.tensor([index / float(SAMPLES)])
        return x, 3 * x - 1, os.getpid()


def debian_version():
    try:
        with open("/etc/debian_version") as f:
            return f.read().strip()
    except OSError:
        return None


def train(epochs, rank, world):
    """Trains for `epochs` and returns the report. Everything that holds DDP's reducer (the
    model, the optimizer, the last loss and its graph) is local here and freed on return."""
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    sampler = DistributedSampler(Line(), num_replicas=world, rank=rank, shuffle=True)
    # num_workers is left at 0: the job's workersPerRank fills it in (the shim), with spawn;
    # the agent's pool keeps the worker processes across epochs.
    loader = DataLoader(Line(), batch_size=4, sampler=sampler)
    history = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        pids, samples, total = set(), 0, 0.0
        for x, y, pid in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            pids.update(int(p) for p in pid)
            samples += len(x)
            total += float(loss) * len(x)
        history.append({"epoch": epoch, "samples": samples, "loss": total / max(samples, 1),
                        "worker_pids": sorted(pids)})

    # DDP keeps the replicas equal: every rank holds the same parameters.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    context = loader.multiprocessing_context
    shim = sys.modules.get("sitecustomize")
    return {
        "rank": rank,
        "world_size": world,
        "pid": os.getpid(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "torch": torch.__version__,
        "glibc": os.confstr("CS_GNU_LIBC_VERSION"),
        "debian": debian_version(),
        "shim_file": getattr(shim, "__file__", None),
        "shim_active": bool(getattr(shim, "shim_active", False)),
        "num_workers": loader.num_workers,
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
        "context": None if context is None else context.get_start_method(),
        "epochs": history,
        "params": [float(v) for v in flat],
        "replicas_equal": all(torch.equal(g, flat) for g in gathered),
    }


def main():
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    report = train(epochs, dist.get_rank(), dist.get_world_size())
    # DDP's reducer must not outlive the process group: train() has returned, so its model,
    # optimizer, loss graph and loader (with its workers) are gone before the group is.
    gc.collect()
    dist.destroy_process_group()
    print("SPAWNPOINT-FOREIGN " + json.dumps(report), flush=True)
    if torch.__version__.startswith("1.7"):
        # Debian 11's torch 1.7 with its Python 3.9 aborts in the interpreter's exit
        # ("terminate called without an active exception", SIGABRT) in every process that
        # ran a backward pass, DDP or not (pytorch/pytorch#38230: autograd's threads meet a
        # finalising interpreter). Nothing is left to do: leave without the finalisation.
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
