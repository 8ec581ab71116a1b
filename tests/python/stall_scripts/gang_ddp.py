"""A 2-rank DDP trainer (gloo, CPU) for the in-place gang of two agents (issue 19).

Usage: gang_ddp.py MODE STEPS. In the first attempt (TORCHELASTIC_RESTART_COUNT 0) rank 1
SIGKILLs itself at step 3, except in MODE "steady". MODE "block": rank 0 then ignores SIGTERM
and waits forever once its allreduce fails (a rank the agent must SIGKILL); MODE "plain":
rank 0 does nothing special; MODE "linger" (no rank kills itself): on SIGTERM, a rank shuts
its TCP connections down at once and ends 3 s later, as a trainer that leaves its collectives
and then saves a checkpoint (its peers' allreduce fails while it still runs). Later attempts
train to the end and print "rank R done restart=N params=P".
"""

import os
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def linger(signum, frame):
    for name in os.listdir("/proc/self/fd"):
        try:
            s = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue  # not a socket (or gone)
        try:
            # Connections only: the store's listening socket, shut, would abort the rank.
            if s.family in (socket.AF_INET, socket.AF_INET6) and \
                    not s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            s.close()  # the duplicate; the connection is down for every descriptor of it
    print("connections shut down; saving for 3 s", flush=True)
    time.sleep(3)
    os._exit(128 + signum)


def main():
    mode, steps = sys.argv[1], int(sys.argv[2])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if mode == "block" and rank == 0 and restart == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "linger" and restart == 0:
        signal.signal(signal.SIGTERM, linger)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        if step == 3 and rank == 1 and restart == 0 and mode not in ("steady", "linger"):
            os.kill(os.getpid(), signal.SIGKILL)
        loss = model(torch.randn(16, 8)).pow(2).mean()
        optimizer.zero_grad()
        try:
            loss.backward()
        except RuntimeError:
            if mode == "block" and restart == 0:
                print("rank %d: allreduce failed; blocking SIGTERM" % rank, flush=True)
                while True:
                    time.sleep(3600)
            raise
        optimizer.step()
        time.sleep(0.02)
    params = sum(float(p.sum()) for p in model.parameters())
    print("rank %d done restart=%d params=%.6f" % (rank, restart, params), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
