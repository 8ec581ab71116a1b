"""What PyTorch's examples/imagenet/main.py does with --dummy and --seed, on CPU, small: a
seeded DDP run (gloo) over a dataset whose images are fixed per index (as FakeData's) and
whose augmentations draw from the random streams of the process that builds the batch
(torch, random and numpy, as torchvision's transforms and albumentations do), a model with
dropout (so the trainer's own torch stream shapes every loss), a DistributedSampler with
set_epoch, a training and a validation DataLoader with `-j N` workers, pin_memory=True and
the loaders' other arguments left at their defaults, as main.py builds them.

It prints one line per event, the same under torchrun and under the agent when the agent
changes nothing that matters:
  parity rank=R epoch=E iter=<train|val> rng=<fingerprint>     after each iter()
  parity rank=R epoch=E step=S batch=<hash> rng=<fp> loss=<repr> after each training batch
  parity rank=R epoch=E val=<repr>                               after each validation
where rng fingerprints the trainer's torch, random and numpy global states and batch hashes
the batch's bytes. tests/python/test_torchrun_parity.py compares every line.
"""

import argparse
import hashlib
import os
import random
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class FakeImages(Dataset):
    """Images fixed per index (FakeData restores the global stream after drawing them),
    augmented with draws from the building process's global streams."""

    def __init__(self, size, shape=(3, 16, 16), classes=10, offset=0):
        self.size, self.shape, self.classes, self.offset = size, shape, classes, offset

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        g = torch.Generator().manual_seed(index + self.offset)
        img = torch.randn(self.shape, generator=g)
        target = int(torch.randint(0, self.classes, (1,), generator=g))
        if torch.rand(1).item() < 0.5:  # RandomHorizontalFlip: torch's global stream
            img = img.flip(-1)
        img = img * random.uniform(0.8, 1.2)  # ColorJitter-like: random's
        img = img + torch.from_numpy(np.random.normal(0, 0.05, self.shape).astype("float32"))
        return img, target


class Net(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Linear(16 * 4 * 4, 32), nn.ReLU(),
                                        nn.Dropout(0.5), nn.Linear(32, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


def fingerprint():
    h = hashlib.sha1(torch.get_rng_state().numpy().tobytes())
    h.update(repr(random.getstate()).encode())
    state = np.random.get_state()
    h.update(state[1].tobytes() + repr(state[2:]).encode())
    return h.hexdigest()[:12]


def batch_hash(images, target):
    return hashlib.sha1(images.numpy().tobytes() + target.numpy().tobytes()).hexdigest()[:12]


def say(rank, text):
    print("parity rank=%d %s" % (rank, text), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("-j", "--workers", default=4, type=int)  # main.py's default
    parser.add_argument("--epochs", default=2, type=int)
    parser.add_argument("-b", "--batch-size", default=8, type=int)
    parser.add_argument("--lr", default=0.1, type=float)
    parser.add_argument("--seed", default=7, type=int)
    parser.add_argument("--train-size", default=96, type=int)
    parser.add_argument("--val-size", default=32, type=int)
    args = parser.parse_args()

    # main.py's --seed: random and torch; numpy too, as seeded scripts usually do.
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = nn.parallel.DistributedDataParallel(Net())
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)

    train_dataset = FakeImages(args.train_size)
    val_dataset = FakeImages(args.val_size, offset=10 ** 6)
    train_sampler = DistributedSampler(train_dataset)
    val_sampler = DistributedSampler(val_dataset, shuffle=False, drop_last=True)
    train_loader = DataLoader(train_dataset, batch_size=args.batch_size,
                              shuffle=(train_sampler is None), num_workers=args.workers,
                              pin_memory=True, sampler=train_sampler)
    val_loader = DataLoader(val_dataset, batch_size=args.batch_size, shuffle=False,
                            num_workers=args.workers, pin_memory=True, sampler=val_sampler)

    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        batches = iter(train_loader)
        say(rank, "epoch=%d iter=train rng=%s" % (epoch, fingerprint()))
        for step, (images, target) in enumerate(batches):
            loss = criterion(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            say(rank, "epoch=%d step=%d batch=%s rng=%s loss=%r" % (
                epoch, step, batch_hash(images, target), fingerprint(), loss.item()))
        if not args.val_size:
            continue
        model.eval()
        total, count = 0.0, 0
        with torch.no_grad():
            batches = iter(val_loader)
            say(rank, "epoch=%d iter=val rng=%s" % (epoch, fingerprint()))
            for images, target in batches:
                total += criterion(model(images), target).item()
                count += 1
        say(rank, "epoch=%d val=%r" % (epoch, total / max(1, count)))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
