#!/usr/bin/python3
"""The Python rows of `make bench-loader`: one trainer script, run as a 1-rank job under
`spawnpoint-agent run` twice per repetition, once with the agent's loader pool
(`loader.pythonPool: true`: the rank's DataLoader iterates on the agent's warm workers) and
once without (`pythonPool: false`: stock DataLoader(multiprocessing_context="spawn",
persistent_workers=True) spawning its own workers). The script is the same on both sides and
asks for the same DataLoader; only the job differs. bench/loader_bench.py drives it.

    python_pool_bench.py --workload transfer|compute|torchvision --out DIR [--restart] ...

Workloads (the first two are bench/loader_reference.py's datasets, imported from it):
  transfer     sample i: --sample-floats float32 values equal to i; batch --batch-size
  compute      --work-us of busy CPU per sample, then 256 floats; batch --batch-size
  torchvision  Debian's python3-torchvision: FakeData images (3 x --tv-image-size^2, drawn
               per index from its own seed) through RandomResizedCrop(224),
               RandomHorizontalFlip, ToTensor, Normalize; batch --tv-batch-size,
               --tv-batches per epoch
The DataLoader: shuffle off, num_workers --workers, prefetch_factor --prefetch, spawn,
persistent workers, a seeded generator (so both sides draw the same augmentations), and a
worker_init_fn that notes each worker's pid in OUT/workers/ (the pool's workers are the
agent's children, not the rank's: this is how their memory is found).

Attempt 0 (TORCHELASTIC_RESTART_COUNT=0) runs --epochs epochs as loader_reference.py does and
writes OUT/attempt0.json with
  served                  the iterator's class: _PoolDataLoaderIter (pool) or
                          _MultiProcessingDataLoaderIter (stock)
  first_batch_from_iter_s iter() (the first `for` over the loader) -> first batch in hand
  first_batch_from_process_start_s   the rank process's start (/proc/self/stat starttime
                          against CLOCK_BOOTTIME, 10 ms resolution) -> first batch
  first_batch_from_launch_s  the harness's spawn of the agent (BENCH_T0, CLOCK_MONOTONIC)
                          -> first batch, when BENCH_T0 is set
  import_torch_s          the rank's own `import torch`
  workers_cpu_to_first_batch_s   CPU the loader workers used between iter() and the first
                          batch (stock: their whole start; the pool: building batch 0, plus
                          the rest of their preload if it was not done yet)
  batches_per_s, epoch_boundary_ms, epoch_boundary_matched_ms   as loader_reference.py
  peak_rss_mb             VmHWM of the rank plus its loader workers; peak_rss_main_mb,
                          peak_rss_workers_mb, agent_rss_mb (the agent's VmHWM, its parent)
  cpu_ms_per_batch_rank, _workers, _agent   CPU time per steady batch of the rank, its
                          loader workers (together) and the agent (/proc/PID/stat, 10 ms ticks)
  checksum                transfer/compute: the sum of batch[0, 0] over all batches;
                          torchvision: the sum of images[0, 0, 0, 0] + labels[0]
With --restart it then SIGKILLs itself (after noting the time, kill_monotonic); the agent
(restartPolicy maxRestarts 1, backoffSeconds 0) restarts the gang, and attempt 1 builds the
same loader, takes one batch and writes OUT/attempt1.json: first_batch_from_iter_s,
first_batch_from_process_start_s, first_batch_monotonic (the harness subtracts the kill).
Every result is also printed as one JSON line.
"""

import argparse
import functools
import json
import os
import signal
import statistics
import sys
import time

T_MODULE = time.monotonic()
import torch  # noqa: E402  (timed)
from torch.utils.data import DataLoader  # noqa: E402

T_IMPORTED = time.monotonic()

from loader_reference import ComputeDataset, TransferDataset, vm_hwm_mb  # noqa: E402


def note_worker(directory, worker_id):
    """worker_init_fn: notes this worker's pid (both sides run it, in their workers)."""
    try:
        with open(os.path.join(directory, "%d" % os.getpid()), "w") as f:
            f.write("%d\n" % worker_id)
    except OSError:
        pass


def since_process_start():
    """Seconds since this process started, from /proc/self/stat's starttime (clock ticks of
    the boot-time clock)."""
    with open("/proc/self/stat") as f:
        stat = f.read()
    start_ticks = int(stat[stat.rindex(")") + 2:].split()[19])  # field 22
    return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")


def tv_dataset(a):
    from torchvision import datasets, transforms

    transform = transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ])
    return datasets.FakeData(size=a.tv_batch_size * a.tv_batches,
                             image_size=(3, a.tv_image_size, a.tv_image_size),
                             num_classes=1000, transform=transform)


def make_loader(a, workers_dir):
    if a.workload == "transfer":
        ds, batch_size = TransferDataset(a.batch_size * a.batches, a.sample_floats), a.batch_size
    elif a.workload == "compute":
        ds, batch_size = ComputeDataset(a.batch_size * a.batches, a.work_us), a.batch_size
    else:
        ds, batch_size = tv_dataset(a), a.tv_batch_size
    g = torch.Generator()
    g.manual_seed(a.seed)
    return DataLoader(ds, batch_size=batch_size, shuffle=False, num_workers=a.workers,
                      multiprocessing_context="spawn", persistent_workers=True,
                      prefetch_factor=a.prefetch, generator=g,
                      worker_init_fn=functools.partial(note_worker, workers_dir))


def first_value(batch):
    if isinstance(batch, (list, tuple)):  # torchvision: [images, labels]
        return float(batch[0][0, 0, 0, 0]) + float(batch[1][0])
    return float(batch[0, 0])


def worker_pids(workers_dir):
    pids = []
    for name in os.listdir(workers_dir):
        if name.isdigit() and os.path.exists("/proc/%s" % name):
            pids.append(int(name))
    return sorted(pids)


def cpu_s(pid):
    """CPU seconds (user + system) process `pid` has used, or NaN when it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
    except OSError:
        return float("nan")
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # fields 14, 15


def cpu_snapshot(workers_dir):
    """CPU seconds of the rank, its loader workers (summed) and the agent (its parent)."""
    return (cpu_s(os.getpid()), sum(cpu_s(pid) for pid in worker_pids(workers_dir)),
            cpu_s(os.getppid()))


def pool_worker_pids():
    """The agent's Python loader workers beside this rank (the pool's, before they served
    anything): processes with this rank's parent that run spawnpoint_rank.worker."""
    pids, agent = [], os.getppid()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as f:
                stat = f.read()
            if int(stat[stat.rindex(")") + 2:].split()[1]) != agent:
                continue
            with open("/proc/%s/cmdline" % name, "rb") as f:
                if b"spawnpoint_rank.worker" in f.read():
                    pids.append(int(name))
        except (OSError, ValueError, IndexError):
            continue
    return pids


def attempt0(a, workers_dir):
    loader = make_loader(a, workers_dir)
    workers = a.workers
    first_iter_s = first_process_s = first_mono = None
    boundaries, same_position, gaps_ms = [], [], []
    last = steady_start = None
    steady_batches = 0
    checksum = 0.0
    before = {pid: cpu_s(pid) for pid in pool_worker_pids()}  # stock: none yet
    for epoch in range(a.epochs):
        t_iter = time.perf_counter()
        for i, batch in enumerate(loader):
            now = time.perf_counter()
            if first_iter_s is None:
                first_iter_s = now - t_iter
                first_process_s = since_process_start()
                first_mono = time.monotonic()
                first_cpu = sum(cpu_s(pid) - before.get(pid, 0.0)
                                for pid in set(worker_pids(workers_dir)) | set(before))
            else:
                gaps_ms.append((now - last) * 1000.0)
                if i == 0:
                    boundaries.append(now - last)
                elif epoch > 0 and i % workers == 0:
                    same_position.append(now - last)
            if epoch > 0:
                steady_batches += 1
            checksum += first_value(batch)
            last = now
        if epoch == 0:
            steady_start = last
            cpu_start = cpu_snapshot(workers_dir)
    cpu_end = cpu_snapshot(workers_dir)
    steady_s = (last - steady_start) / steady_batches
    served = type(loader._iterator).__name__
    pids = worker_pids(workers_dir)
    main_mb = vm_hwm_mb(os.getpid())
    workers_mb = sum(vm_hwm_mb(pid) for pid in pids)
    out = {
        "attempt": 0,
        "workload": a.workload,
        "served": served,
        "worker_pids": pids,
        "first_batch_from_iter_s": first_iter_s,
        "first_batch_from_process_start_s": first_process_s,
        "first_batch_monotonic": first_mono,
        "import_torch_s": T_IMPORTED - T_MODULE,
        "workers_cpu_to_first_batch_s": first_cpu,
        "batches_per_s": 1.0 / steady_s,
        "epoch_boundary_ms": max(0.0, (statistics.median(boundaries) - steady_s) * 1000.0),
        "epoch_boundary_matched_ms": max(0.0, (statistics.median(boundaries) - (
            statistics.median(same_position) if same_position else steady_s)) * 1000.0),
        "peak_rss_mb": main_mb + workers_mb,
        "peak_rss_main_mb": main_mb,
        "peak_rss_workers_mb": workers_mb,
        "agent_rss_mb": vm_hwm_mb(os.getppid()),
        "checksum": checksum,
    }
    # CPU per steady batch by process (10 ms clock ticks; the time each side's batches cost).
    for name, start, end in zip(("rank", "workers", "agent"), cpu_start, cpu_end):
        out["cpu_ms_per_batch_" + name] = (end - start) * 1000.0 / steady_batches
    if a.gaps:
        out["gaps_ms"] = gaps_ms
    return out


def attempt1(a, workers_dir):
    loader = make_loader(a, workers_dir)
    t_iter = time.perf_counter()
    batch = next(iter(loader))
    now = time.perf_counter()
    out = {
        "attempt": 1,
        "workload": a.workload,
        "served": type(loader._iterator).__name__,
        "first_batch_from_iter_s": now - t_iter,
        "first_batch_from_process_start_s": since_process_start(),
        "first_batch_monotonic": time.monotonic(),
        "import_torch_s": T_IMPORTED - T_MODULE,
        "worker_pids": worker_pids(workers_dir),
        "checksum": first_value(batch),
    }
    del batch
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", choices=["transfer", "compute", "torchvision"], required=True)
    p.add_argument("--out", required=True, help="directory for attempt<N>.json")
    p.add_argument("--restart", action="store_true",
                   help="attempt 0 SIGKILLs itself after its measurements; attempt 1 measures "
                   "the first batch after the gang restart")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--batches", type=int, default=40, help="batches per epoch")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--sample-floats", type=int, default=3 * 224 * 224)
    p.add_argument("--work-us", type=int, default=2000)
    p.add_argument("--tv-batch-size", type=int, default=64)
    p.add_argument("--tv-batches", type=int, default=8, help="torchvision: batches per epoch")
    p.add_argument("--tv-image-size", type=int, default=256)
    p.add_argument("--seed", type=int, default=1234, help="the DataLoader's generator")
    p.add_argument("--gaps", action="store_true", help="also record every inter-batch gap")
    a = p.parse_args()

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    workers_dir = os.path.join(a.out, "workers-attempt%d" % attempt)
    os.makedirs(workers_dir, exist_ok=True)
    out = attempt0(a, workers_dir) if attempt == 0 else attempt1(a, workers_dir)
    t0 = os.environ.get("BENCH_T0")
    if t0:
        out["first_batch_from_launch_s"] = out["first_batch_monotonic"] - float(t0)
    if attempt == 0 and a.restart:
        out["kill_monotonic"] = time.monotonic()
    path = os.path.join(a.out, "attempt%d.json" % attempt)
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.rename(path + ".tmp", path)
    print(json.dumps(out), flush=True)
    if attempt == 0 and a.restart:
        os.kill(os.getpid(), signal.SIGKILL)  # the gang restart; attempt 1 measures again


if __name__ == "__main__":
    main()
