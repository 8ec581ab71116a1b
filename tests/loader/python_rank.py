"""A Python rank for rank_service_test.cc (and tests/python's agent runs): DataLoaders with
the start-up shim's hooks, served by the agent's loader service named by
SPAWNPOINT_LOADER_SERVICE, compared with stock DataLoader in the same process.

    python_rank.py CASE [--out FILE]

Every case exits 0 when what it checks holds and 1 with the difference on stderr. Cases:
  equivalence  augmented samples (torch, numpy and random draws, worker ids), shuffle with a
               seeded generator, 2 epochs: pool batches == stock DataLoader(spawn,
               persistent) batches; also with a validation loader in between
  kept         a batch kept by the trainer is unchanged after 100 more batches, and keeping
               every batch (ring exhausted) copies instead of deadlocking
  error        an exception at one index reaches the trainer with its type and the worker's
               traceback; iterating on delivers every other batch
  kill         a worker SIGKILLed mid-epoch: every sample once and in order
  hang         a worker hung past the DataLoader's timeout: replaced, every sample once
  crash        a sample that kills its worker every time fails the iteration at its batch,
               with the worker's exit and last stderr lines, after the batches before it
  nonpersistent  persistent_workers=False: the dataset is sent again each epoch, batches
               equal stock DataLoader's
  fallback     an IterableDataset and more workers than the pool fall back to torch's own
               workers, each with one line on stderr
  pids         prints the pool's worker pids seen by the dataset (for persistence checks)
  early_break  30 epochs each left after its first batch (the rest of the window already
               built or at the workers), then a whole epoch: every sample once, and no slot
               lost (the ring never runs short, so nothing is copied)
  open_window  the first window of batches (but batch 0, built here) travels with Open (the
               service builds it once the ring exists, no Submit round trip): the rank's
               first Submit asks for the batch after it, and the batches equal stock
               DataLoader's
"""

import argparse
import os
import random
import signal
import sys

# The shim's hooks, as in a rank the agent started (sitecustomize is on PYTHONPATH and
# SPAWNPOINT_SHIM=1 installs them before this line runs).
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

import numpy as np

from spawnpoint_rank import _pool


class Augmented(Dataset):
    """Sample i: i, then draws of torch, numpy and random, and the worker that drew them."""

    def __init__(self, size=40):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        info = get_worker_info()
        image = torch.full((3, 4), float(i)) + torch.rand(3, 4)
        return {"image": image, "noise": np.random.rand(2), "flip": random.random() < 0.5,
                "index": i, "worker": info.id if info else -1}


class Failing(Augmented):
    def __getitem__(self, i):
        if i == 13:
            raise ValueError("sample 13 is corrupt")
        return super().__getitem__(i)


class Pids(Augmented):
    def __getitem__(self, i):
        return {"index": i, "pid": os.getpid()}


class Hanging(Augmented):
    """Hangs at index 7 in the first worker that reaches it (a marker file says so)."""

    def __init__(self, marker, size=40):
        Augmented.__init__(self, size)
        self.marker = marker

    def __getitem__(self, i):
        if i == 7 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            signal.pause()
        return {"index": i}


class Crashing(Augmented):
    """Sample 5 kills its worker, every time: a crash loop."""

    def __getitem__(self, i):
        if i == 5:
            sys.stderr.write("dying at sample 5\n")
            sys.stderr.flush()
            os._exit(3)
        return {"index": i}


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(8))


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


def loader(dataset, seed=1234, **kwargs):
    g = torch.Generator()
    g.manual_seed(seed)
    kwargs.setdefault("num_workers", 2)
    kwargs.setdefault("batch_size", 4)
    kwargs.setdefault("persistent_workers", True)
    return DataLoader(dataset, shuffle=True, generator=g, multiprocessing_context="spawn",
                      **kwargs)


def epochs(make, n=2, stock=False, between=None):
    """The batches of n epochs of make()'s loader; `between()` runs after each epoch."""
    saved = _pool._service_path
    if stock:
        _pool.use_service_path(None)
    try:
        dl = make()
        out = []
        for _ in range(n):
            it = iter(dl)
            served = type(it).__name__
            out.append([batch for batch in it])
            del it
            if between is not None:
                between()
        del dl
        return out, served
    finally:
        if stock:
            _pool.use_service_path(saved)


def check(condition, message):
    if not condition:
        sys.stderr.write("FAILED: %s\n" % message)
        sys.exit(1)


def compare(name, got, want):
    check(len(got) == len(want), "%s: %d epochs, stock %d" % (name, len(got), len(want)))
    for e, (g, w) in enumerate(zip(got, want)):
        check(len(g) == len(w), "%s epoch %d: %d batches, stock %d" % (name, e, len(g), len(w)))
        for b, (x, y) in enumerate(zip(g, w)):
            check(same(x, y), "%s epoch %d batch %d differs:\n pool  %r\n stock %r" % (
                name, e, b, x, y))


def case_equivalence(args):
    want, served = epochs(lambda: loader(Augmented()), stock=True)
    check(served == "_MultiProcessingDataLoaderIter", "the stock run used %s" % served)
    got, served = epochs(lambda: loader(Augmented()))
    check(served == "_PoolDataLoaderIter", "the pool did not serve the loader: %s" % served)
    compare("train", got, want)
    # A validation loader between epochs takes the workers and gives them back.
    val_want = []
    val_got = []
    want2, _ = epochs(lambda: loader(Augmented()), stock=True,
                      between=lambda: val_want.append(epochs(
                          lambda: loader(Augmented(12), seed=7), n=1, stock=True)[0]))
    got2, _ = epochs(lambda: loader(Augmented()),
                     between=lambda: val_got.append(epochs(
                         lambda: loader(Augmented(12), seed=7), n=1)[0]))
    compare("train with validation", got2, want2)
    for v, (g, w) in enumerate(zip(val_got, val_want)):
        compare("validation %d" % v, g, w)
    print("equivalence: %d epochs of %d batches identical" % (len(got), len(got[0])))


def case_kept(args):
    dl = loader(Augmented(200), batch_size=2)
    it = iter(dl)
    kept = next(it)
    snapshot = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kept.items()}
    for _ in range(99):
        next(it)
    check(same(kept, snapshot), "a kept batch changed after 100 more batches")
    # Keep everything: the ring runs out, batches are copied, nothing deadlocks.
    everything = [b for b in dl]
    check(len(everything) == 100, "kept-all epoch gave %d batches" % len(everything))
    indices = sorted(int(i) for b in everything for i in b["index"])
    check(indices == list(range(200)), "kept-all epoch lost or repeated samples")
    print("kept: unchanged after 100 batches; %d batches kept" % len(everything))


def case_error(args):
    dl = loader(Failing())
    seen = []
    errors = []
    it = iter(dl)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            break
        except ValueError as err:
            errors.append(str(err))
            continue
        seen.extend(int(i) for i in batch["index"])
    check(len(errors) == 1, "%d errors raised, want 1" % len(errors))
    text = errors[0]
    check("Caught ValueError in DataLoader worker process" in text, "message: %s" % text)
    check("sample 13 is corrupt" in text and "Traceback" in text, "message: %s" % text)
    check(13 not in seen and len(seen) == 36 and len(set(seen)) == 36,
          "other batches: %d samples" % len(seen))
    print("error: raised once, %d other samples delivered" % len(seen))


def case_kill(args):
    dl = DataLoader(Pids(60), batch_size=2, num_workers=2, persistent_workers=True)
    order = []
    killed = None
    for n, batch in enumerate(dl):
        order.extend(int(i) for i in batch["index"])
        if n == 5:
            killed = int(batch["pid"][0])
            os.kill(killed, signal.SIGKILL)
    check(order == list(range(60)), "samples after a kill: %r" % order)
    later = {int(p) for b in dl for p in b["pid"]}
    check(killed not in later, "the killed worker still serves")
    print("kill: every sample once, in order; worker %d replaced" % killed)


def case_hang(args):
    # The workers' start-up (torch's import, at idle CPU priority beside this rank) is not what
    # the timeout below is about: a first loader without one waits it out, however loaded the
    # machine. The hung worker's successor starts within the timeout too (the pool gives a
    # connection that long): 20 s, which a start-up at normal priority fits on a machine loaded
    # 20 deep (at 3 s both starting workers were killed as silent there).
    warm = DataLoader(Augmented(4), batch_size=2, num_workers=2)
    check([int(i) for b in warm for i in b["index"]] == [0, 1, 2, 3], "the warm-up's samples")
    marker = args.out + ".hung"
    dl = DataLoader(Hanging(marker, 30), batch_size=3, num_workers=2, timeout=20,
                    persistent_workers=True)
    order = [int(i) for batch in dl for i in batch["index"]]
    check(os.path.exists(marker), "the dataset never hung")
    check(order == list(range(30)), "samples after a hang: %r" % order)
    print("hang: every sample once, in order")


def case_crash(args):
    dl = DataLoader(Crashing(12), batch_size=2, num_workers=2, persistent_workers=True)
    seen = []
    try:
        for batch in dl:
            seen.extend(int(i) for i in batch["index"])
    except RuntimeError as err:
        text = str(err)
    else:
        check(False, "a crash loop did not fail the iteration")
    check(seen == [0, 1, 2, 3], "batches before the failing one: %r" % seen)
    for needed in ("batch 2 of epoch 0", "exit code 3", "dying at sample 5"):
        check(needed in text, "the error lacks %r:\n%s" % (needed, text))
    print("crash: %s" % text.splitlines()[0])


def case_nonpersistent(args):
    make = lambda: loader(Augmented(24), persistent_workers=False)  # noqa: E731
    want, _ = epochs(make, stock=True)
    got, served = epochs(make)
    check(served == "_PoolDataLoaderIter", "the pool did not serve the loader: %s" % served)
    compare("persistent_workers=False", got, want)
    print("nonpersistent: %d epochs identical" % len(got))


def case_fallback(args):
    stream = [int(x) for x in DataLoader(Stream(), batch_size=None, num_workers=1)]
    check(stream == list(range(8)), "iterable: %r" % stream)
    many = DataLoader(Augmented(8), batch_size=4, num_workers=3)
    check(len(list(many)) == 2, "3 workers")
    check(type(many._iterator or iter(many)).__name__ != "_PoolDataLoaderIter", "served")
    print("fallback: done")


def case_grow(args):
    # More workers than the pool started with: the service grows it, and worker w builds
    # batch b % 3 == w with torch's seeds, as stock DataLoader's third worker does.
    make = lambda: loader(Augmented(24), num_workers=3)  # noqa: E731
    want, _ = epochs(make, stock=True)
    got, served = epochs(make)
    check(served == "_PoolDataLoaderIter", "the pool did not serve the loader: %s" % served)
    compare("3 workers on a pool of 2", got, want)
    print("grow: %d epochs identical" % len(got))


def case_fallback4(args):
    many = DataLoader(Augmented(8), batch_size=4, num_workers=4)
    check(len(list(many)) == 2, "4 workers")
    print("fallback4: done")


def case_pids(args):
    dl = DataLoader(Pids(8), batch_size=2, num_workers=2, persistent_workers=True)
    pids = sorted({int(p) for b in dl for p in b["pid"]})
    with open(args.out, "w") as f:
        f.write(" ".join(map(str, pids)) + "\n")
    print("pids: %s" % pids)


def case_early_break(args):
    dl = loader(Augmented(40), batch_size=2)
    for _ in range(30):
        for batch in dl:
            check(len(batch["index"]) == 2, "a batch of %d samples" % len(batch["index"]))
            break
    indices = sorted(int(i) for b in dl for i in b["index"])
    check(indices == list(range(40)),
          "the whole epoch after 30 left early lost or repeated samples")
    print("early_break: 30 epochs left early, then a whole one")


def case_open_window(args):
    want, _ = epochs(lambda: loader(Augmented(24)), n=1, stock=True)
    sent = []
    original = _pool.Service.send

    def recording(self, kind, body):
        sent.append((kind, dict(body)))
        return original(self, kind, body)

    _pool.Service.send = recording
    try:
        got, served = epochs(lambda: loader(Augmented(24)), n=1)
    finally:
        _pool.Service.send = original
    check(served == "_PoolDataLoaderIter", "the pool did not serve the loader: %s" % served)
    compare("open_window", got, want)
    kinds = [kind for kind, _ in sent]
    check(kinds and kinds[0] == _pool.OPEN, "the first message was %r, not Open" % kinds[:1])
    opened = sent[0][1]
    window = 2 * 2  # prefetch_factor x num_workers
    # Batch 0 was built in this process (the rank side builds it as worker 0 would while the
    # workers start): the rest of the window went with Open, whose ring is sized from it.
    check([run["firstBatch"] for run in opened.get("submit", [])] == [1] and
          len(opened["submit"][0]["batches"]) == window - 1,
          "Open's submit: %r" % opened.get("submit"))
    check(opened.get("batchBytes", 0) > 0 and opened.get("accept") is True,
          "Open's batchBytes and accept: %r" % opened)
    submits = [body for kind, body in sent if kind == _pool.SUBMIT and body.get("batches")]
    check(submits and submits[0]["firstBatch"] == window,
          "the first Submit after Open asks for batch %r, not %d (the window went twice?)"
          % (submits[0]["firstBatch"] if submits else None, window))
    print("open_window: the first %d batches went with Open; %d batches identical"
          % (window, len(got[0])))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("case")
    parser.add_argument("--out", default="/tmp/python_rank.out")
    args = parser.parse_args()
    check(_pool._service_path, "no loader service (SPAWNPOINT_LOADER_SERVICE unset?)")
    globals()["case_" + args.case](args)


if __name__ == "__main__":
    main()
