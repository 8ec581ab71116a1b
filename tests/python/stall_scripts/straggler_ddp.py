"""A DDP trainer (gloo, CPU) whose slow rank does a whole multiple of its peers' work per step.

Usage: straggler_ddp.py STEPS WORK_MS SLOW_RANK UNITS [--quirks]. A unit of work is WORK_MS
of "work" (a sleep: a stand-in for loading) followed by a forward and backward pass through
DistributedDataParallel. Every rank does one unit per step, SLOW_RANK does UNITS (an integer;
SLOW_RANK -1: none is slow): its first UNITS - 1 passes accumulate gradients under no_sync(),
its last one allreduces them as every rank's single pass does (DDP's allreduce waits are
timed by the shim, with no change to this script); then an optimizer step. So the slow rank's
own work per step is the same unit counted UNITS times, sleep and compute alike: a loaded
machine stretches its units as it stretches its peers', and its work per step stays UNITS
times theirs (the straggler tests decide their band on this count, not on wall time). With
--quirks the run also has what must raise no alarm: an epoch boundary every 25 steps (a pause
of 4 units' sleep on every rank), a validation pass of 10 units' sleep at step 30 (every
rank, no optimizer step) and a checkpoint pause of 3 s on rank 0 at step 45. Prints
"rank R: U units in S steps" every 10 steps and "rank R done: U units in S steps" at the end
(the work it counted, so that a test can stop the job before it ends).
"""

import contextlib
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main():
    steps, work_ms, slow_rank, units = (int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]),
                                        int(sys.argv[4]))
    if units < 1:
        sys.exit("straggler_ddp.py: UNITS must be an integer >= 1, not %d" % units)
    quirks = "--quirks" in sys.argv[5:]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(64, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    per_step = units if rank == slow_rank else 1
    work = work_ms / 1000.0
    done = 0
    for step in range(steps):
        if quirks and step > 0 and step % 25 == 0:
            time.sleep(4 * work)  # the next epoch's loader starts
        if quirks and step == 30:
            with torch.no_grad():  # validation: ten units' sleep, no optimizer step
                time.sleep(10 * work)
                model(torch.randn(16, 64))
        if quirks and step == 45 and rank == 0:
            time.sleep(3.0)  # a checkpoint written by rank 0
        optimizer.zero_grad()
        for unit in range(per_step):
            last = unit == per_step - 1
            with contextlib.nullcontext() if last else model.no_sync():
                time.sleep(work)
                model(torch.randn(16, 64)).pow(2).mean().backward()
            done += 1
        optimizer.step()
        if (step + 1) % 10 == 0:
            print("rank %d: %d units in %d steps" % (rank, done, step + 1), flush=True)
    print("rank %d done: %d units in %d steps" % (rank, done, steps), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
