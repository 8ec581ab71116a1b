"""A DataLoader iterator served by the agent's loader pool: PyTorch's own iterator with its
workers replaced by the agent's.

`pool_iterator(loader)` returns the iterator for a map-style DataLoader with workers, or None
with the reason the pool cannot serve it (the caller falls back to torch's iterator and says
why). The class subclasses torch's `_BaseDataLoaderIter` of whatever torch is installed, so
the sampler, the batch sampler and the base seed are drawn from the loader's generator
exactly as torch draws them; like `_MultiProcessingDataLoaderIter` it primes prefetch_factor x
num_workers batches at each (re)start, puts one more index after each batch, and numbers the
batches of each epoch from 0 so that batch b goes to worker b % num_workers (the service's
strict round robin). What it sends the workers once per iterator is a pickle file in the
pool directory with the dataset, collate_fn, worker_init_fn, base_seed, num_workers and
whether batches are collated (spawnpoint_rank/worker.py reads it).

Faults are the service's: a dead or hung worker is replaced and its batches rebuilt. An
exception in the dataset is raised here as PyTorch raises it (its type, "Caught E in
DataLoader worker process N. Original Traceback ..."), and the iteration can go on: the
session is over, so the next batch opens a new one and submits what was still outstanding.
The same happens when another iterator of the rank took the workers (train and validation
loaders alternate): each iterator opens its session again when it runs.

When the trainer keeps so many batches alive that the workers would run out of slots, batches
are copied out of the ring instead (said once on stderr) until it lets go of some.
"""

import itertools
import os
import pickle
import sys
import time

from . import _pool
from ._report import report_once

_COPY_NOTE = (
    "spawnpoint: the trainer keeps %d batches of this DataLoader alive (the agent's shared-"
    "memory ring has %d slots, %d of them needed by the workers): batches are copied out of "
    "the ring while it does, which costs a copy per batch but never overwrites a kept one")
_counter = itertools.count()
_classes = {}


def pool_iterator(loader):
    """The pool's iterator for `loader`, or (None, reason)."""
    svc_path = _pool._service_path
    if not svc_path:
        return None, None
    dlmod = sys.modules.get("torch.utils.data.dataloader")
    if dlmod is None:
        return None, "torch.utils.data.dataloader is not loaded"
    if loader._dataset_kind != dlmod._DatasetKind.Map:
        return None, "an IterableDataset is read by torch's own workers"
    try:
        svc = _pool.service()
    except OSError as err:
        return None, "the agent's loader service at %s does not answer (%s)" % (svc_path, err)
    parts = {"dataset": loader.dataset, "collate_fn": loader.collate_fn,
             "worker_init_fn": loader.worker_init_fn, "num_workers": loader.num_workers,
             "auto_collation": loader._auto_collation}
    try:
        pickle.dumps(parts, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as err:  # torch's own spawn workers report it in their words
        return None, "the dataset, collate_fn or worker_init_fn cannot be pickled (%s: %s)" % (
            type(err).__name__, err)
    cls = _classes.get(dlmod)
    if cls is None:
        cls = _classes[dlmod] = _make_class(dlmod)
    try:
        return cls(loader, svc, parts), None
    except _pool.ServiceError as err:
        if err.kind in ("workers", "protocol", "gone"):
            return None, str(err)
        raise


def _make_class(dlmod):
    base = dlmod._BaseDataLoaderIter

    class _PoolDataLoaderIter(base):
        def __init__(self, loader, svc, parts):
            base.__init__(self, loader)  # draws the base seed from loader.generator
            self._svc = svc
            self._prefetch = max(1, int(getattr(loader, "prefetch_factor", None) or 2))
            self._timeout_ms = int(max(0.0, float(loader.timeout or 0)) * 1000)
            self._pickle = _write_pickle(svc.pool_dir, dict(parts, base_seed=self._base_seed))
            self._session = None
            self._ring = None
            self._epoch = -1
            self._copying = False
            self._reset(loader, first_iter=True)

        def _reset(self, loader, first_iter=False):
            base._reset(self, loader, first_iter)
            self._epoch += 1
            self._send_idx = 0
            self._rcvd_idx = 0
            self._outstanding = {}  # batch -> indices, submitted and not yet yielded
            self._ready = {}        # batch -> Ready message received ahead of its turn
            self._consumed = [0, 0, 0.0]  # batches, samples, seconds waited: for the stats
            self._exhausted = False
            with self._svc.lock:
                if not first_iter and self._own_session():
                    self._svc.send(_pool.DROP, {"session": self._session, "keep": self._epoch})
                window = []
                for _ in range(self._prefetch * self._num_workers):
                    indices = self._draw()
                    if indices is None:
                        break
                    window.append(indices)
                self._submit(window)

        def _draw(self):
            """The next batch's sample indices from the sampler, or None at its end."""
            if self._exhausted:
                return None
            try:
                index = self._next_index()
            except StopIteration:
                self._exhausted = True
                return None
            indices = [int(i) for i in index] if self._auto_collation else [int(index)]
            self._outstanding[self._send_idx] = indices
            self._send_idx += 1
            return indices

        def _own_session(self):
            return self._session is not None and self._svc.active == self._session

        def _submit(self, batches):
            """Sends new batches (the last len(batches) drawn); opens a session if needed."""
            if not self._own_session():
                return self._open()  # submits everything outstanding
            consumed, self._consumed = self._consumed, [0, 0, 0.0]
            self._svc.send(_pool.SUBMIT, {
                "session": self._session, "epoch": self._epoch,
                "firstBatch": self._send_idx - len(batches), "batches": batches,
                "release": self._svc.take_releases(self._session),
                "consumed": {"batches": consumed[0], "samples": consumed[1],
                             "waitedSeconds": consumed[2]}})

        def _open(self):
            pending = sorted(b for b in self._outstanding if b not in self._ready)
            svc = self._svc
            session = svc.new_session_id()
            svc.active = None
            request = {
                "protocol": _pool.PROTOCOL_VERSION, "session": session, "arg": self._pickle,
                "numWorkers": self._num_workers, "prefetchFactor": self._prefetch,
                "timeoutMs": self._timeout_ms,
                "probe": self._outstanding[pending[0]] if pending else []}
            if self._ring is not None:
                # The slot size is known: no probe, which would build a batch on worker 0
                # out of its turn and so shift that worker's random streams.
                request["slotBytes"] = self._ring.slot_bytes
            svc.send(_pool.OPEN, request)
            while True:
                message = svc.receive(_pool.RELEASE_FLUSH_S)
                if message is None:
                    continue
                kind, body, fd = message
                if body.get("session") != session:
                    if fd >= 0:
                        os.close(fd)
                    continue
                if kind == _pool.ERROR:
                    if body.get("kind") == "dataset":  # batch 0 failed as it was probed
                        _raise_batch_error(body)
                    raise _pool.ServiceError(body.get("kind", "start"), body.get("message", ""),
                                             body.get("excType"))
                if kind == _pool.OPENED and fd >= 0:
                    break
                raise _pool.ServiceError("protocol", "unexpected answer %d to Open" % kind)
            self._ring = _pool.Ring(svc, session, fd, int(body["slots"]), int(body["slotBytes"]))
            self._session = session
            svc.active = session
            # Batches already received stay; the rest are built again, in their order, each by
            # the worker PyTorch would use (b % num_workers).
            for start, run in _runs(pending):
                svc.send(_pool.SUBMIT, {
                    "session": session, "epoch": self._epoch, "firstBatch": start,
                    "batches": [self._outstanding[b] for b in run]})

        def _next_data(self):
            if self._rcvd_idx >= self._send_idx:
                if not self._persistent_workers:
                    self._shutdown()
                raise StopIteration
            waited_from = time.monotonic()
            with self._svc.lock:
                if not self._own_session() and self._rcvd_idx not in self._ready:
                    self._open()
                ready, ring = self._wait_for(self._rcvd_idx)
                # A batch of an earlier session is read from that session's ring.
                held = ring.held()
                window = self._prefetch * self._num_workers
                copy = held >= ring.slots - window
                if copy and not self._copying:
                    report_once(_COPY_NOTE % (held, ring.slots, window))
                self._copying = copy
                data = ring.batch(ready, copy)
                samples = len(self._outstanding.pop(self._rcvd_idx, ()))
                self._rcvd_idx += 1
                self._consumed[0] += 1
                self._consumed[1] += samples
                self._consumed[2] += time.monotonic() - waited_from
                indices = self._draw()
                self._submit([indices] if indices is not None else [])
            if self._pin_memory:
                data = _pin(data, getattr(self, "_pin_memory_device", None))
            return data

        def _wait_for(self, batch):
            """The Ready message of `batch` of this epoch; raises the batch's error."""
            svc = self._svc
            while batch not in self._ready:
                svc.flush_releases(self._session)
                message = svc.receive(_pool.RELEASE_FLUSH_S)
                if message is None:
                    continue
                kind, body, fd = message
                if fd >= 0:
                    os.close(fd)
                if body.get("session") != self._session:
                    continue
                if kind == _pool.READY:
                    if body.get("epoch") == self._epoch:
                        self._ready[body["batch"]] = (body, self._ring)
                    else:  # a batch of an epoch left early: its slot goes straight back
                        svc.released(self._session, body["slot"])
                elif kind == _pool.BATCH_ERROR:
                    svc.active = None  # the session is over; the next batch opens another
                    if body.get("epoch") == self._epoch and body.get("batch") == batch:
                        # As PyTorch: the next index is put before the error is raised,
                        # and iterating on goes on with the next batch.
                        self._outstanding.pop(batch, None)
                        self._rcvd_idx += 1
                        self._draw()
                        _raise_batch_error(body)
                    self._open()
            return self._ready.pop(batch)

        def _shutdown(self):
            if self._own_session():
                try:
                    self._svc.send(_pool.DROP, {"session": self._session, "keep": None})
                except OSError:
                    pass

        def __del__(self):
            try:
                os.unlink(self._pickle)
            except (AttributeError, OSError):
                pass

    _PoolDataLoaderIter.__name__ = "_PoolDataLoaderIter"
    return _PoolDataLoaderIter


def _write_pickle(pool_dir, parts):
    """Writes what the workers need for a loader (worker.py's unwrap reads it); its path.

    As a spawned DataLoader worker gets it: multiprocessing's preparation data (the rank's
    sys.path, working directory and main module, so that what the trainer's script defines
    unpickles) and the pickled loader dict, whose protocol the workers' Python reads."""
    from multiprocessing import spawn

    try:
        preparation = spawn.get_preparation_data("spawnpoint-loader-worker")
        for secret in ("authkey", "log_to_stderr", "log_level"):  # never leaves the rank
            preparation.pop(secret, None)
    except Exception:  # e.g. an interactive main: no main module to import in the workers
        preparation = None
    path = os.path.join(pool_dir, "loader-%d-%d.pkl" % (os.getpid(), next(_counter)))
    payload = pickle.dumps(parts, protocol=pickle.HIGHEST_PROTOCOL)
    with open(path + ".tmp", "wb") as f:
        pickle.dump({"preparation": preparation, "payload": payload}, f,
                    protocol=pickle.HIGHEST_PROTOCOL)
    os.rename(path + ".tmp", path)
    return path


def _runs(batches):
    """Consecutive runs of sorted batch numbers: [(first, [b...]), ...]."""
    out = []
    for b in batches:
        if out and out[-1][1][-1] == b - 1:
            out[-1][1].append(b)
        else:
            out.append((b, [b]))
    return out


def _raise_batch_error(body):
    message = body.get("workerMessage") or body.get("message", "")
    exc_type = _exception_type(body.get("excType")) if body.get("kind") == "dataset" else None
    if exc_type is None:
        raise RuntimeError(message)
    if exc_type is KeyError:
        utils = sys.modules.get("torch._utils")
        wrap = getattr(utils, "KeyErrorMessage", None)
        if wrap is not None:
            message = wrap(message)
    try:
        error = exc_type(message)
    except Exception:
        raise RuntimeError(message) from None
    raise error


def _exception_type(name):
    """The class named "module.qualname" (a nested class too), or None."""
    import importlib

    parts = (name or "").split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
            for part in parts[split:]:
                obj = getattr(obj, part)
        except Exception:
            continue
        if isinstance(obj, type) and issubclass(obj, BaseException):
            return obj
    return None


def _pin(data, device):
    from torch.utils.data._utils import pin_memory

    try:
        return pin_memory.pin_memory(data, device) if device else pin_memory.pin_memory(data)
    except TypeError:  # torch < 1.12 takes no device
        return pin_memory.pin_memory(data)
