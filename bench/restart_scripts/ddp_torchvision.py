"""A DDP trainer as torchrun users write them, for bench/restart_vs_torchrun.py: torch and
torchvision imported at the top, a torchvision model (resnet18 on 32x32 FakeData), a
DistributedSampler and a DataLoader with 2 workers (the agent's pool under the agent, forked
under torchrun); NCCL on the rank's GPU where torch sees one (LOCAL_RANK), else gloo on the CPU.

Events (stamp(): printed, and appended to the file BENCH_EVENTS names), wall = time.time():
`bench phase rank=R attempt=A name=N wall=T` as it passes import_torch, import_torchvision,
init_process_group (its store and first collective), ddp (DistributedDataParallel(model)
done); `bench first-step rank=R attempt=A wall=T` when its first training step is done. In
attempt 0 the last rank, once the file KILL_FILE exists (the bench creates it), prints
`bench death rank=R wall=T` and SIGKILLs itself; attempt 1 trains 3 steps and exits 0.
Usage: ddp_torchvision.py KILL_FILE."""

import os
import signal
import sys
import time

from bench_events import phase, stamp

import torch

_IMPORTED_TORCH = time.time()
import torch.distributed as dist  # noqa: E402
import torchvision  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402

_IMPORTED_TORCHVISION = time.time()



def main():
    kill_file = sys.argv[1]
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank = int(os.environ["RANK"])

    phase(rank, attempt, "import_torch", _IMPORTED_TORCH)
    phase(rank, attempt, "import_torchvision", _IMPORTED_TORCHVISION)
    gpu = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if gpu else None
    if gpu:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if gpu else "gloo")
    dist.barrier()
    phase(rank, attempt, "init_process_group")
    model = torchvision.models.resnet18(num_classes=10)
    model = torch.nn.parallel.DistributedDataParallel(
        model.to(device) if gpu else model, device_ids=[device.index] if gpu else None)
    phase(rank, attempt, "ddp")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torchvision.datasets.FakeData(4096, (3, 32, 32), 10,
                                         torchvision.transforms.ToTensor())
    loader = DataLoader(data, batch_size=8, num_workers=2, sampler=DistributedSampler(data))
    steps = 0
    # Attempt 0 trains until the bench has what it waits for (a slow machine's standbys may
    # take more than an epoch) and kills it, for at most 10 minutes.
    deadline = time.time() + 600
    while steps < 3 or (attempt == 0 and time.time() < deadline):
        for images, target in loader:
            if gpu:
                images, target = images.to(device), target.to(device)
            loss = torch.nn.functional.cross_entropy(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            if steps == 1:
                stamp("bench first-step rank=%d attempt=%d wall=%.6f" % (rank, attempt,
                                                                       time.time()))
            last = rank == dist.get_world_size() - 1
            if attempt == 0 and last and os.path.exists(kill_file):
                stamp("bench death rank=%d wall=%.6f" % (rank, time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            if attempt > 0 and steps >= 3:
                break
            if attempt == 0:
                time.sleep(0.05)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
