"""A plain PyTorch DDP trainer, as you would write it for torchrun: the agent runs it unchanged.

    build/bin/spawnpoint-agent run examples/python/ddp.yaml

The agent starts every rank with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT
set (so init_process_group needs no arguments) and its start-up shim gives this DataLoader
the agent's pooled loader workers: spawned, never forked, started before the rank and kept
across epochs and restarts. Nothing here knows about spawnpoint. Each rank ends with a line
`final rank=R loss=L params=H`: equal H on every rank shows DDP kept the replicas in step.
"""

import argparse
import hashlib
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Regression(Dataset):
    """y = x . w + noise, generated per sample (a stand-in for files read and decoded)."""

    def __init__(self, size, features=16, seed=0):
        generator = torch.Generator().manual_seed(seed)
        self.w = torch.randn(features, generator=generator)
        self.size, self.features, self.seed = size, features, seed

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        x = torch.randn(self.features, generator=generator)
        y = x @ self.w + 0.01 * torch.randn(1, generator=generator)
        return x, y


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--num-workers", type=int, default=2)
    args = parser.parse_args()

    dist.init_process_group("gloo")  # env://: the agent set the rendezvous variables
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    dataset = Regression(args.samples)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                        num_workers=args.num_workers)
    loss = torch.zeros(())
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        batches = iter(loader)
        for x, y in batches:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            print("epoch %d/%d loss=%.6f workers=%s" % (
                epoch + 1, args.epochs, loss.item(), type(batches).__name__), flush=True)
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    digest = hashlib.sha256(params.numpy().tobytes()).hexdigest()[:16]
    print("final rank=%d loss=%.6f params=%s (world %d, local rank %s)" % (
        rank, loss.item(), digest, world, os.environ.get("LOCAL_RANK")), flush=True)


if __name__ == "__main__":  # good practice; the agent's loader pool does not need it
    main()
