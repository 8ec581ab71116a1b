# A DDP trainer written for fork, as many are: no `if __name__ == "__main__":`, the dataset
# class defined here, a lambda collate_fn and a local worker_init_fn. Under the agent's loader
# pool it must train as it does with forked workers (test_fork_scripts.py compares). Writes
# what it saw to <out>/result-rank<R>.json.
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

out_dir = sys.argv[1]
OFFSET = 0.5  # a global of the script the dataset reads


class Noisy(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, index):
        # RANK, as torch's own workers inherit it from their rank (datasets shard by it).
        shift = OFFSET + float(os.environ["RANK"])
        return torch.full((3,), float(index) + shift) + torch.rand(3), index


def make_init(shift):
    def init(worker_id):  # a closure: no name a spawned worker could import
        torch.manual_seed(torch.initial_seed() + shift)
    return init


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
dataset = Noisy()
sampler = DistributedSampler(dataset, shuffle=True, seed=7)
loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=2,
                    collate_fn=lambda batch: (torch.stack([x for x, _ in batch]),
                                              [i for _, i in batch]),
                    worker_init_fn=make_init(1000))
indices, sums, iterators = [], [], []
for epoch in range(2):
    sampler.set_epoch(epoch)
    iterator = iter(loader)
    iterators.append(type(iterator).__name__)
    for x, index in iterator:
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        indices.append(index)
        sums.append(round(float(x.sum()), 4))
weights = [round(float(v), 5) for v in model.module.weight.flatten()]
with open(os.path.join(out_dir, "result-rank%d.json" % rank), "w") as f:
    json.dump({"rank": rank, "indices": indices, "sums": sums, "weights": weights,
               "iterators": iterators}, f)
