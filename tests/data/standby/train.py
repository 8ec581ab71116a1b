"""A rank for tests/agent/standby_test.cc: prints what it is (pid, attempt, port) at its top,
imports a module of its own that prints too, takes 3 DDP steps (gloo), then on attempt 0
waits for the test's gate file and dies by SIGKILL (a retryable failure) if its rank is the
one told to. Usage: train.py GATE FAILING_RANK."""
import os
import signal
import sys
import time

import side_module  # noqa: F401  (prints when imported)
import torch
import torch.distributed as dist

print("top-level side effect pid=%d attempt=%s port=%s" % (
    os.getpid(), os.environ.get("TORCHELASTIC_RESTART_COUNT"), os.environ.get("MASTER_PORT")),
    flush=True)
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and dist.get_rank() == int(sys.argv[2]):
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
dist.barrier()
print("done pid=%d attempt=%s" % (os.getpid(), os.environ["TORCHELASTIC_RESTART_COUNT"]),
      flush=True)
