"""What PyTorch's examples/imagenet/main.py does up to its first training batch, with --dummy
on CPU: its imports (torchvision's models, datasets and transforms), a resnet18 in DDP
(gloo), FakeData of 224x224 images (ToTensor, as main.py's --dummy), a DistributedSampler and
a DataLoader with `-j N` workers, pin_memory=True; then one training step. Prints one line
per rank, `first-batch rank=R wall=<time.time() when the first batch was in hand>`, for
bench/first_batch_bench.py. `--context spawn` gives the DataLoader
multiprocessing_context='spawn' (what a torchrun user does to keep CUDA safe).
"""

import argparse
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision.datasets as datasets
import torchvision.models as models
import torchvision.transforms as transforms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("-j", "--workers", default=4, type=int)
    parser.add_argument("-b", "--batch-size", default=16, type=int)
    parser.add_argument("--context", default=None)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = nn.parallel.DistributedDataParallel(models.resnet18())
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)
    train_dataset = datasets.FakeData(1281167, (3, 224, 224), 1000, transforms.ToTensor())
    sampler = torch.utils.data.distributed.DistributedSampler(train_dataset)
    extra = {"multiprocessing_context": args.context} if args.context else {}
    loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size,
                                         shuffle=False, num_workers=args.workers,
                                         pin_memory=True, sampler=sampler, **extra)
    sampler.set_epoch(0)
    for images, target in loader:
        print("first-batch rank=%d wall=%.6f" % (rank, time.time()), flush=True)
        loss = criterion(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        break
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
