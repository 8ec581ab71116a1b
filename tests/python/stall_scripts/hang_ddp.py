"""A 2-rank DDP trainer (gloo, CPU) whose rank 1 stops making steps at a given step.

Usage: hang_ddp.py HANG_STEP STEPS. Rank 1 calls blocked_here() at HANG_STEP (first attempt
only), a sleep that never ends; rank 0 then waits for it inside backward(), in DDP's
allreduce. The agent's stall report must name rank 1 and blocked_here.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def blocked_here():
    while True:
        time.sleep(3600)


def main():
    hang_step, steps = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        if step == hang_step and rank == 1 and restart == 0:
            blocked_here()
        loss = model(torch.randn(16, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(0.01)
    print("rank %d done restart=%d" % (rank, restart), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
