"""A DDP trainer (gloo, CPU) whose slow rank does its step's work more slowly than its peers.

Usage: straggler_ddp.py STEPS WORK_MS SLOW_RANK FACTOR [--quirks]. Every rank's step is
WORK_MS of "work" (a sleep: a stand-in for loading and compute), SLOW_RANK's WORK_MS *
FACTOR (SLOW_RANK -1: none is slow), then a forward and backward through
DistributedDataParallel (whose allreduce waits the shim times, with no change to this
script) and an optimizer step. With --quirks the run also has what must raise no alarm: an
epoch boundary every 25 steps (a pause of 4 steps' work on every rank), a validation pass of
10 steps' work at step 30 (every rank, no optimizer step) and a checkpoint pause of 3 s on
rank 0 at step 45. Prints "rank R done" at the end.
"""

import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main():
    steps, work_ms, slow_rank, factor = (int(sys.argv[1]), float(sys.argv[2]),
                                         int(sys.argv[3]), float(sys.argv[4]))
    quirks = "--quirks" in sys.argv[5:]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(64, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    work = work_ms / 1000.0 * (factor if rank == slow_rank else 1.0)
    for step in range(steps):
        if quirks and step > 0 and step % 25 == 0:
            time.sleep(4 * work_ms / 1000.0)  # the next epoch's loader starts
        if quirks and step == 30:
            with torch.no_grad():  # validation: ten steps' work, no optimizer step
                time.sleep(10 * work_ms / 1000.0)
                model(torch.randn(16, 64))
        if quirks and step == 45 and rank == 0:
            time.sleep(3.0)  # a checkpoint written by rank 0
        time.sleep(work)
        loss = model(torch.randn(16, 64)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("rank %d done" % rank, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
