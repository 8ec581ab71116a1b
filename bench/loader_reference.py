"""The reference side of `make bench-loader`: PyTorch's DataLoader with spawned, persistent
workers, on the same workloads as spawnpoint's loader (bench/loader_bench.cc).

Workloads (identical per-sample work on both sides):
  transfer: each sample is a float32 array of --sample-floats values filled with its index;
            almost no compute, so the cost is moving batches from workers to the trainer.
  compute:  each sample is small (256 floats) but costs --work-us microseconds of busy CPU,
            measured by the clock, so both sides burn the same CPU per sample.

Prints one JSON object: first_batch_s, batches_per_s, epoch_boundary_ms, peak_rss_mb,
epoch_boundary_matched_ms, checksum.

epoch_boundary_ms is the gap before an epoch's first batch minus the mean gap. With W workers
building batches in round robin, batches arrive in bursts (W nearly at once, then a pause),
so even a boundary that costs nothing shows up to a pause's worth of "loss" here, because
batch 0 always follows a pause. epoch_boundary_matched_ms compares like with like: the gap
before batch 0 minus the median gap before the other batches of the same worker in the
rotation (i % W == 0, i > 0) in the steady epochs. bench/loader_bench.cc computes both the
same way.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class TransferDataset(Dataset):
    def __init__(self, size, floats):
        self.size = size
        self.floats = floats

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return torch.full((self.floats,), float(index), dtype=torch.float32)


class ComputeDataset(Dataset):
    def __init__(self, size, work_us):
        self.size = size
        self.work_s = work_us / 1e6

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        end = time.perf_counter() + self.work_s
        while time.perf_counter() < end:
            pass
        return torch.full((256,), float(index), dtype=torch.float32)


def vm_hwm_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workload", choices=["transfer", "compute"], required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--batches", type=int, default=40, help="batches per epoch")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--sample-floats", type=int, default=3 * 224 * 224)
    p.add_argument("--work-us", type=int, default=2000)
    p.add_argument("--gaps", action="store_true", help="also print every inter-batch gap")
    a = p.parse_args()

    size = a.batch_size * a.batches
    if a.workload == "transfer":
        ds = TransferDataset(size, a.sample_floats)
    else:
        ds = ComputeDataset(size, a.work_us)

    start = time.perf_counter()
    loader = DataLoader(ds, batch_size=a.batch_size, shuffle=False, num_workers=a.workers,
                        multiprocessing_context="spawn", persistent_workers=True,
                        prefetch_factor=a.prefetch)
    first_batch_s = None
    boundaries = []
    same_position = []
    last = None
    steady_start = None
    steady_batches = 0
    checksum = 0.0
    gaps_ms = []
    for epoch in range(a.epochs):
        for i, batch in enumerate(loader):
            now = time.perf_counter()
            if first_batch_s is not None:
                gaps_ms.append((now - last) * 1000.0)
            if first_batch_s is None:
                first_batch_s = now - start
            elif i == 0:
                boundaries.append(now - last)
            elif epoch > 0 and i % a.workers == 0:
                same_position.append(now - last)
            if epoch > 0:  # steady state: every epoch after the first one's warm-up
                steady_batches += 1
            checksum += float(batch[0, 0])
            last = now
        if epoch == 0:
            steady_start = last
    # Throughput over the steady epochs, epoch boundaries included.
    steady_s = (last - steady_start) / steady_batches
    worker_pids = [w.pid for w in loader._iterator._workers]
    peak_main = vm_hwm_mb(os.getpid())
    peak = peak_main + sum(vm_hwm_mb(pid) for pid in worker_pids)
    del loader
    out = {
        "first_batch_s": first_batch_s,
        "batches_per_s": 1.0 / steady_s,
        "epoch_boundary_ms": max(0.0, (statistics.median(boundaries) - steady_s) * 1000.0),
        "peak_rss_mb": peak,
        "peak_rss_main_mb": peak_main,
        "epoch_boundary_matched_ms": max(0.0, (statistics.median(boundaries) - (
            statistics.median(same_position) if same_position else steady_s)) * 1000.0),
        "checksum": checksum,
    }
    if a.gaps:
        out["gaps_ms"] = gaps_ms
    print(json.dumps(out))


if __name__ == "__main__":
    main()
