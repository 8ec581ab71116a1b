"""A Python rank for tests/python/test_pool_agent.py, run by `spawnpoint-agent run`: its
DataLoaders are served by the agent's loader pool (the start-up shim does it; nothing here
asks for it) and checked against stock DataLoader in the same process.

    pool_trainer.py CASE OUT_DIR

Each rank writes OUT_DIR/<case>-rank<R>-attempt<A>.json: what it saw (which iterator served
each loader, the worker pids and their start times, whether the batches equalled stock
DataLoader's). Cases:
  ddp          2-rank DDP (gloo) with a train loader (DistributedSampler, shuffle, seeded,
               set_epoch) and a validation loader, 2 epochs, batches compared with stock
  library      a DataLoader built inside an imported library module
  start_method multiprocessing.set_start_method('spawn', force=True) first
  mp_pool      an mp.Pool started after tensors were created, then a DataLoader
  kill         one of the rank's workers SIGKILLed mid-epoch
  restart      attempt 0: rank 1 records its workers and is SIGKILLed after one epoch;
               attempt 1: every rank records its workers again
  knobs        2-rank DDP with the DataLoader knobs a plain script sets: persistent_workers,
               prefetch_factor=3, a worker_init_fn of the script's own, a seeded generator,
               DistributedSampler.set_epoch; 3 epochs compared with stock
  first_batch  a loader whose dataset draws from the random streams and one whose dataset
               caches what it built, not persistent: batch 0 built in the rank for the
               first, by worker 0 for the second; batches and the trainer's state after
               batch 0 compared with stock
  starved      a loader whose workers' start-up never ends at idle priority
               (test_pool_agent.py makes it so): every sample once, in order
  speculation  three persistent loaders, 4 epochs each, whose next epoch the pool predicts
               wrongly (shuffle from the global generator, which the trainer draws from
               between epochs), wrongly once (a DistributedSampler whose set_epoch is never
               called) and rightly (sequential; the rank waits to see the next epoch's first
               batch built before it calls iter()); batches and the trainer's own draws
               compared with stock
"""

import glob
import json
import os
import random
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torch.utils.data._utils import worker as torch_worker

import spawnpoint_rank._pool as pool


class Augmented(Dataset):
    """Sample i: i plus torch, numpy and random draws, and the worker process that drew it."""

    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        return {"x": torch.full((4,), float(i)) + torch.rand(4), "noise": np.random.rand(2),
                "coin": random.random(), "index": i, "pid": os.getpid()}


def square(x):
    return x * x


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(same, a, b))
    return a == b


# torch < 1.9 leaves numpy unseeded in its workers (no _generate_state): numpy's draws are
# then different in every run, stock or not, and are not compared.
_NUMPY_SEEDED = hasattr(torch_worker, "_generate_state")


def without_pids(batch):
    return {k: v for k, v in batch.items()
            if k != "pid" and (k != "noise" or _NUMPY_SEEDED)}


def loaders(rank, world):
    g = torch.Generator()
    g.manual_seed(99)
    train_set = Augmented(48)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=5)
    train = DataLoader(train_set, batch_size=4, sampler=sampler, num_workers=2, generator=g,
                       persistent_workers=True, multiprocessing_context="spawn")
    gv = torch.Generator()
    gv.manual_seed(7)
    val = DataLoader(Augmented(12), batch_size=3, shuffle=True, num_workers=2, generator=gv,
                     persistent_workers=True, multiprocessing_context="spawn")
    return sampler, train, val


def run_epochs(rank, world, model=None, epochs=2):
    """Batches of `epochs` epochs of the train loader and one validation pass after each."""
    sampler, train, val = loaders(rank, world)
    seen = {"train": [], "val": [], "served": set()}
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in train:
            seen["train"].append(batch)
            if model is not None:
                model.zero_grad()
                model(batch["x"]).sum().backward()  # an allreduce per step
        for batch in val:
            seen["val"].append(batch)
        seen["served"].update({type(train._iterator).__name__, type(val._iterator).__name__})
    return seen


def started(pid):
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22)."""
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def report(out_dir, case, **fields):
    rank = int(os.environ.get("RANK", 0))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    fields.update(rank=rank, attempt=attempt, pid=os.getpid(), started=started(os.getpid()))
    path = os.path.join(out_dir, "%s-rank%d-attempt%d.json" % (case, rank, attempt))
    with open(path + ".tmp", "w") as f:
        json.dump(fields, f)
    os.rename(path + ".tmp", path)


def differences(got, want):
    """Where two runs' batches differ (for the test's failure message): each differing
    batch's number and, per differing field, both values."""
    out = []
    if len(got) != len(want):
        out.append("%d batches, stock %d" % (len(got), len(want)))
    for n, (a, b) in enumerate(zip(got, want)):
        a, b = without_pids(a), without_pids(b)
        fields = {k: [repr(a.get(k)), repr(b.get(k))] for k in sorted(set(a) | set(b))
                  if not same(a.get(k), b.get(k))}
        if fields:
            out.append({"batch": n, "fields": fields})
    return out


def worker_pids(batches):
    return sorted({int(p) for b in batches for p in b["pid"]})


def case_ddp(out_dir):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    got = run_epochs(rank, world, model)
    saved = pool._service_path
    pool.use_service_path(None)  # the same loaders on torch's own workers
    want = run_epochs(rank, world)
    pool.use_service_path(saved)
    equal = {part: len(got[part]) == len(want[part]) and all(
        same(without_pids(a), without_pids(b)) for a, b in zip(got[part], want[part]))
        for part in ("train", "val")}
    report(out_dir, "ddp", served=sorted(got["served"]), stock=sorted(want["served"]),
           equal=equal, batches=len(got["train"]), workers=worker_pids(got["train"]),
           differences={part: differences(got[part], want[part]) for part in ("train", "val")})
    del model  # before the process group goes (torch 1.7 aborts otherwise)
    dist.destroy_process_group()


def seed_numpy_per_worker(worker_id):
    """A worker_init_fn as scripts write them: numpy seeded from the worker's own seed."""
    info = torch.utils.data.get_worker_info()
    np.random.seed((info.seed + 17 * worker_id) % 2 ** 32)


def knob_epochs(rank, world, epochs=3):
    g = torch.Generator()
    g.manual_seed(11)
    data = Augmented(40)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=2)
    dl = DataLoader(data, batch_size=4, sampler=sampler, num_workers=2, generator=g,
                    persistent_workers=True, prefetch_factor=3,
                    worker_init_fn=seed_numpy_per_worker)
    batches = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        batches.extend(dl)
    return batches, type(dl._iterator).__name__


def case_knobs(out_dir):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    got, served = knob_epochs(rank, world)
    saved = pool._service_path
    pool.use_service_path(None)
    want, stock = knob_epochs(rank, world)
    pool.use_service_path(saved)
    # numpy is seeded by the worker_init_fn here, so its draws compare on every torch.
    equal = len(got) == len(want) and all(
        same({k: v for k, v in a.items() if k != "pid"}, {k: v for k, v in b.items() if k != "pid"})
        for a, b in zip(got, want))
    report(out_dir, "knobs", served=served, stock=stock, equal=equal, batches=len(got),
           workers=worker_pids(got))
    dist.destroy_process_group()


def case_library(out_dir):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import pool_lib
    dl = pool_lib.build_loader()
    batches = [b for _ in range(2) for b in dl]
    report(out_dir, "library", served=type(dl._iterator).__name__,
           values=[int(v) for x, _ in batches for v in x[:, 1]],
           workers=sorted({int(p) for _, pids in batches for p in pids}))


def case_start_method(out_dir):
    mp.set_start_method("spawn", force=True)
    dl = DataLoader(Augmented(8), batch_size=2, num_workers=2, persistent_workers=True)
    batches = list(dl)
    report(out_dir, "start_method", served=type(dl._iterator).__name__,
           indices=[int(i) for b in batches for i in b["index"]])


def case_mp_pool(out_dir):
    weights = torch.randn(8, 8)  # tensors first, as a trainer has them
    with mp.Pool(2) as workers:
        squares = workers.map(square, range(6))
    dl = DataLoader(Augmented(8), batch_size=2, num_workers=2, persistent_workers=True)
    batches = list(dl)
    report(out_dir, "mp_pool", served=type(dl._iterator).__name__, squares=squares,
           indices=[int(i) for b in batches for i in b["index"]], weights=float(weights.sum()))


def case_kill(out_dir):
    """SIGKILLs one of this rank's workers mid-epoch: every sample still arrives once and in
    order, and the rank goes on."""
    dl = DataLoader(Augmented(40), batch_size=2, num_workers=2, persistent_workers=True)
    order, killed = [], None
    for n, batch in enumerate(dl):
        order.extend(int(i) for i in batch["index"])
        if n == 4:
            killed = int(batch["pid"][0])
            os.kill(killed, signal.SIGKILL)
    later = worker_pids(list(dl))
    report(out_dir, "kill", served=type(dl._iterator).__name__, in_order=order == list(range(40)),
           killed=killed, replaced=killed not in later, workers=later)


def case_restart(out_dir):
    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    g = torch.Generator()
    g.manual_seed(3)
    dl = DataLoader(Augmented(16), batch_size=4, shuffle=True, generator=g, num_workers=2,
                    persistent_workers=True)
    it = iter(dl)
    first = next(it)
    rest = list(it)
    # The pool's workers; batch 0 was built in this process (as worker 0 would build it).
    pids = [p for p in worker_pids([first] + rest) if p != os.getpid()]
    report(out_dir, "restart", served=type(dl._iterator).__name__, workers=pids,
           workers_started=[started(p) for p in pids])
    if attempt == 0 and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    # Rank 0 of attempt 0 waits for the gang restart that rank 1's death brings.
    if attempt == 0:
        time.sleep(600)


class Logged(Augmented):
    """Augmented, and every sample built logged to LOG_DIR/<pid>.log, one index a line."""

    def __init__(self, size, log_dir):
        Augmented.__init__(self, size)
        self.log_dir = log_dir

    def __getitem__(self, i):
        with open(os.path.join(self.log_dir, "%d.log" % os.getpid()), "a") as f:
            f.write("%d\n" % i)
        return Augmented.__getitem__(self, i)


def builds_of(log_dir, index):
    count = 0
    for path in glob.glob(os.path.join(log_dir, "*.log")):
        with open(path) as f:
            count += sum(1 for line in f if line.strip() == str(index))
    return count


def poll(condition, deadline_s):
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def speculation_epochs(out_dir, rank, pooled):
    torch.manual_seed(1234)
    log_dir = os.path.join(out_dir, "builds-rank%d-%s" % (rank, "pool" if pooled else "stock"))
    os.makedirs(log_dir)
    data = Augmented(24)
    loaders = [
        ("global", True, DataLoader(data, batch_size=4, shuffle=True, num_workers=2,
                                    persistent_workers=True)),
        ("distributed", False, DataLoader(
            data, batch_size=4, num_workers=2, persistent_workers=True,
            sampler=DistributedSampler(data, num_replicas=2, rank=rank, shuffle=True, seed=3))),
        ("sequential", False, DataLoader(Logged(24, log_dir), batch_size=4, num_workers=2,
                                         persistent_workers=True)),
    ]
    seen = {"served": [], "prebuilt": [], "predictions": {}}
    for name, draw_between, loader in loaders:
        batches, draws = [], []
        for epoch in range(4):
            batches.extend(loader)
            if draw_between:
                draws.append(float(torch.rand(1)))
            if pooled and name == "sequential" and epoch < 3:
                # Sample 0 opens every epoch: built once more before iter() asks for it.
                seen["prebuilt"].append(poll(lambda: builds_of(log_dir, 0) >= epoch + 2, 60))
        seen[name] = batches
        seen[name + "_draws"] = draws
        seen["served"].append(type(loader._iterator).__name__)
        seen["predictions"][name] = getattr(loader._iterator, "_predictions", None)
    return seen


class Caching(Augmented):
    """Augmented that keeps what it built: a dataset whose state changes as it builds."""

    def __init__(self, size):
        Augmented.__init__(self, size)
        self.cache = {}

    def __getitem__(self, i):
        self.cache[i] = True
        return Augmented.__getitem__(self, i)


def rank_state():
    """What building a batch in this process must leave as it was: the trainer's random
    streams (as its next draws), its thread count, get_worker_info(), and the seeds queued
    for CUDA generators (torch.manual_seed would queue one, GPU or not)."""
    cuda = torch.cuda
    calls = list(getattr(cuda, "_queued_calls", []))
    tracker = getattr(cuda, "_lazy_seed_tracker", None)
    if tracker is not None:
        calls.extend(tracker.get_calls())
    # Whether the agent's code queued a CUDA seed (the stack each queued call keeps).
    queued_here = any("spawnpoint_rank" in line for call in calls if call for line in call[1])
    draws = (torch.rand(2).tolist(), np.random.rand(2).tolist(), random.random())
    return dict(draws=draws, threads=torch.get_num_threads(),
                worker_info=repr(torch.utils.data.get_worker_info()),
                cuda_seed_queued_here=queued_here)


def first_batch_epochs():
    """Two loaders, one epoch each, and the trainer's state after each one's first batch."""
    torch.manual_seed(21)
    np.random.seed(21)
    random.seed(21)
    out = {}
    for name, data in (("drawing", Augmented(12)), ("caching", Caching(12))):
        dl = DataLoader(data, batch_size=3, shuffle=True, num_workers=2)
        it = iter(dl)
        batches = [next(it)]
        state = rank_state()
        batches.extend(it)
        out[name] = (batches, state, type(it).__name__)
    return out


def case_first_batch(out_dir):
    got = first_batch_epochs()
    saved = pool._service_path
    pool.use_service_path(None)
    want = first_batch_epochs()
    pool.use_service_path(saved)
    result = {}
    for name in ("drawing", "caching"):
        (g, g_state, served), (w, w_state, stock) = got[name], want[name]
        result[name] = dict(
            served=served, stock=stock,
            equal=len(g) == len(w) and all(same(without_pids(a), without_pids(b))
                                           for a, b in zip(g, w)),
            state_equal=g_state == w_state, state=[g_state, w_state],
            batch0_pids=sorted({int(p) for p in g[0]["pid"]}),
            pids=worker_pids(g))
    report(out_dir, "first_batch", **result)


def case_starved(out_dir):
    it = iter(DataLoader(Augmented(12), batch_size=3, num_workers=2))
    batches = list(it)
    report(out_dir, "starved", served=type(it).__name__,
           indices=[int(i) for b in batches for i in b["index"]])


def case_speculation(out_dir):
    rank = int(os.environ["RANK"])
    got = speculation_epochs(out_dir, rank, True)
    saved = pool._service_path
    pool.use_service_path(None)
    want = speculation_epochs(out_dir, rank, False)
    pool.use_service_path(saved)
    names = ("global", "distributed", "sequential")
    report(out_dir, "speculation", served=got["served"], prebuilt=got["prebuilt"],
           predictions=got["predictions"],
           equal={n: len(got[n]) == len(want[n]) and all(
               same(without_pids(a), without_pids(b)) for a, b in zip(got[n], want[n]))
               for n in names},
           batches={n: len(got[n]) for n in names},
           draws_equal=got["global_draws"] == want["global_draws"])


def main():
    case, out_dir = sys.argv[1], sys.argv[2]
    globals()["case_" + case](out_dir)
    # Debian 11's torch 1.7 aborts at exit in any process that ran backward()
    # (pytorch/pytorch#38230); the report is written, so leave without running its exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
