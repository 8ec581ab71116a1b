"""A 2-rank DDP trainer (gloo, CPU) whose rank 1 computes for WORK_SECONDS in its first step
while rank 0 waits for it in DDP's allreduce: a slow first step, not a hang, which the agent
must not report as stalled at its defaults.

Usage: slow_first_step_ddp.py WORK_SECONDS STEPS.
"""

import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def first_step_work(seconds):
    """Real work on the CPU (matrix products) for `seconds` of wall time."""
    x = torch.randn(96, 96)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        x = torch.tanh(x @ x)
    return float(x.sum())


def main():
    work_seconds, steps = float(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        if step == 0 and rank == 1:
            first_step_work(work_seconds)
        loss = model(torch.randn(16, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("rank %d done" % rank, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
