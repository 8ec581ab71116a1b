"""Run as __main__ by test_launch.py, which sends this process SIGINT (as Ctrl-C, or a
kernel's interrupt, does) once both ranks have printed "training": launch() must stop the
agent and every rank, remove its files and raise KeyboardInterrupt.

    interrupted.py PORT

Each rank prints "training pid=<pid>" and then steps forever (an all_reduce, then a tenth of
a second's rest: the machine stays usable).
Prints "KeyboardInterrupt raised" when launch() raised it; exits 3 if it returned.
"""

import os
import sys

import spawnpoint

PORT = int(sys.argv[1])


def train_forever():
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    print("training pid=%d" % os.getpid())
    step = torch.zeros(())
    while True:
        dist.all_reduce(step)
        time.sleep(0.1)


if __name__ == "__main__":
    try:
        spawnpoint.launch(train_forever, nprocs=2, master_port=PORT)
    except KeyboardInterrupt:
        print("KeyboardInterrupt raised", flush=True)
        sys.exit(0)
    sys.exit(3)
