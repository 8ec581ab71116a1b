"""An image classifier trained with torchvision's datasets and transforms, DDP on CPU ranks.

    build/bin/spawnpoint-agent run examples/python/torchvision.yaml

torchvision's FakeData stands in for an ImageFolder (swap in `datasets.ImageFolder(root,
transform)` for real images); the random augmentations run in the agent's pooled loader
workers, seeded exactly as DataLoader seeds its own workers. Nothing here knows about
spawnpoint. Each rank ends with `final rank=R loss=L params=H`.
"""

import argparse
import hashlib

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, transforms


def model():
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(32, 10))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    augment = transforms.Compose([
        transforms.RandomResizedCrop(32, scale=(0.6, 1.0)),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)),
    ])
    train = datasets.FakeData(size=args.images, image_size=(3, 40, 40), num_classes=10,
                              transform=augment, random_offset=0)
    sampler = DistributedSampler(train, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, num_workers=2,
                        drop_last=True)
    torch.manual_seed(0)
    net = nn.parallel.DistributedDataParallel(model())
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    loss = torch.zeros(())
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        batches = iter(loader)
        for images, labels in batches:
            loss = nn.functional.cross_entropy(net(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            print("epoch %d/%d loss=%.4f workers=%s" % (
                epoch + 1, args.epochs, loss.item(), type(batches).__name__), flush=True)
    params = torch.cat([p.detach().flatten() for p in net.parameters()])
    print("final rank=%d loss=%.4f params=%s" % (
        rank, loss.item(), hashlib.sha256(params.numpy().tobytes()).hexdigest()[:16]),
        flush=True)


if __name__ == "__main__":
    main()
