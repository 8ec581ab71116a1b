"""Datasets for python_worker_test.cc, and the pickle files that hand them to Python loader
workers (agent/python/spawnpoint_rank/worker.py), as the rank side will write them.

    python_datasets.py write KIND PATH [--size N] [--generator-seed G] [--bad I]
                                       [--workers W] [--slow-worker S]
    python_datasets.py stock OUT.json [--size N] [--batch B] [--generator-seed G]
                                      [--workers W] [--epochs E] [--shuffle] [--slow-worker S]

write: the worker's pickle for dataset KIND (index, nested, seed, failing); base_seed is
drawn from torch.Generator().manual_seed(G) exactly as DataLoader's iterator draws it.
stock: runs a stock DataLoader(SeedDataset, num_workers=W (2), spawn, generator seeded G;
with --epochs > 1 persistent_workers=True) for E epochs (1) and writes its batches, every
epoch's in order, as JSON, to compare with the pool's. --slow-worker S: worker S sleeps
before each sample (a load, never a timing to rely on). The classes are pickled by
reference, so this module must be importable (its directory on PYTHONPATH) where they are
loaded.
"""

import argparse
import json
import os
import pickle
import random
import sys
import time


class IndexDataset(object):
    """Sample i: (a float32 tensor of `dim` values i, the label i)."""

    def __init__(self, size, dim=3):
        self.size, self.dim = size, dim

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        import torch
        return torch.full((self.dim,), float(i)), i


class NestedDataset(IndexDataset):
    """Collated by nested_collate into a dict of tensor, array, ints, strings and more."""


def nested_collate(samples):
    import numpy as np
    import torch
    ids = [label for _, label in samples]
    return {"x": torch.stack([x for x, _ in samples]), "ids": ids,
            "name": "batch-" + "-".join(str(i) for i in ids),
            "extra": [np.arange(len(ids), dtype=np.int16), None, (1.5, True)],
            "bf": torch.tensor(ids, dtype=torch.bfloat16)}


class SeedDataset(IndexDataset):
    """Sample i: the draws of every random stream a worker has, and who drew them. Worker
    `slow_worker` takes longer per sample (its streams are not touched by that)."""

    def __init__(self, size, slow_worker=-1):
        IndexDataset.__init__(self, size)
        self.slow_worker = slow_worker

    def __getitem__(self, i):
        import numpy as np
        import torch
        from torch.utils.data import get_worker_info
        info = get_worker_info()
        if info.id == getattr(self, "slow_worker", -1):
            time.sleep(0.05)
        draws = [float(i), torch.rand(()).item(), float(np.random.rand()), random.random()]
        return {"x": torch.tensor(draws, dtype=torch.float64), "wid": info.id,
                "seed": info.seed, "nw": info.num_workers}


class FailingDataset(IndexDataset):
    """IndexDataset whose sample `bad` raises ValueError."""

    def __init__(self, size, bad):
        IndexDataset.__init__(self, size)
        self.bad = bad

    def __getitem__(self, i):
        if i == self.bad:
            raise ValueError("sample %d is broken on purpose" % i)
        return IndexDataset.__getitem__(self, i)


def base_seed(generator_seed):
    """What DataLoader's iterator draws from a generator seeded with `generator_seed`."""
    import torch
    g = torch.Generator()
    g.manual_seed(generator_seed)
    return torch.empty((), dtype=torch.int64).random_(generator=g).item()


def write(kind, path, size, generator_seed, bad, workers=2, slow_worker=-1):
    if kind == "failing":
        dataset = FailingDataset(size, bad)
    elif kind == "seed":
        dataset = SeedDataset(size, slow_worker)
    else:
        dataset = {"index": IndexDataset, "nested": NestedDataset}[kind](size)
    spec = {"dataset": dataset, "collate_fn": nested_collate if kind == "nested" else None,
            "worker_init_fn": None, "base_seed": base_seed(generator_seed),
            "num_workers": workers, "auto_collation": True}
    with open(path + ".tmp", "wb") as f:
        pickle.dump(spec, f)
    os.rename(path + ".tmp", path)


def stock(out, size, batch, generator_seed, workers=2, epochs=1, shuffle=False,
          slow_worker=-1):
    import torch
    from torch.utils.data import DataLoader
    g = torch.Generator()
    g.manual_seed(generator_seed)
    loader = DataLoader(SeedDataset(size, slow_worker), batch_size=batch, shuffle=shuffle,
                        num_workers=workers, generator=g, multiprocessing_context="spawn",
                        persistent_workers=epochs > 1)
    batches = []
    for _ in range(epochs):
        batches += [{"x": b["x"].tolist(), "wid": b["wid"].tolist(), "seed": b["seed"].tolist(),
                     "indices": [int(row[0]) for row in b["x"].tolist()]} for b in loader]
    with open(out, "w") as f:
        json.dump(batches, f)


def main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=("write", "stock"))
    parser.add_argument("args", nargs="+")
    parser.add_argument("--size", type=int, default=40)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--generator-seed", type=int, default=0)
    parser.add_argument("--bad", type=int, default=-1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--shuffle", action="store_true")
    parser.add_argument("--slow-worker", type=int, default=-1)
    a = parser.parse_args(argv)
    if a.command == "write":
        write(a.args[0], a.args[1], a.size, a.generator_seed, a.bad, a.workers, a.slow_worker)
    else:
        stock(a.args[0], a.size, a.batch, a.generator_seed, a.workers, a.epochs, a.shuffle,
              a.slow_worker)
    return 0


if __name__ == "__main__":
    # The classes must be pickled as python_datasets.X, not __main__.X.
    import python_datasets
    sys.exit(python_datasets.main(sys.argv[1:]))
