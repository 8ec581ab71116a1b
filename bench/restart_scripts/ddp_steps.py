"""A DDP trainer for bench/first_steps.py: torch and torchvision imported at the top,
resnet18 on 32x32 FakeData, a DistributedSampler and a DataLoader with 2 workers (the agent's
pool under the agent, forked under torchrun), gloo on the CPU; 20 training steps. The last
rank appends `step N wall=T` (time.time()) after each step to the file STEPS_OUT names.
Usage: ddp_steps.py."""

import os
import time

import torch
import torch.distributed as dist
import torchvision
from torch.utils.data import DataLoader, DistributedSampler

STEPS = 20


def main():
    dist.init_process_group("gloo")
    last = dist.get_rank() == dist.get_world_size() - 1
    model = torch.nn.parallel.DistributedDataParallel(torchvision.models.resnet18(num_classes=10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torchvision.datasets.FakeData(4096, (3, 32, 32), 10, torchvision.transforms.ToTensor())
    loader = DataLoader(data, batch_size=8, num_workers=2, sampler=DistributedSampler(data))
    for step, (images, target) in enumerate(loader, 1):
        loss = torch.nn.functional.cross_entropy(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if last:
            with open(os.environ["STEPS_OUT"], "a") as f:
                f.write("step %d wall=%.6f\n" % (step, time.time()))
        if step == STEPS:
            break
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
