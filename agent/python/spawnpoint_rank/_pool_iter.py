"""A DataLoader iterator served by the agent's loader pool: PyTorch's own iterator with its
workers replaced by the agent's.

`pool_iterator(loader)` returns the iterator for a map-style DataLoader with workers, or None
with the reason the pool cannot serve it (the caller falls back to torch's iterator and says
why). It first looks up every private name of torch the iterator and the workers rely on
(_private.py, feature "pool"), the iterator's own attributes as soon as torch's __init__ set
them: a torch that lacks one gets torch's own iterator, said once, with nothing drawn.

The class subclasses torch's `_BaseDataLoaderIter` of whatever torch is installed, so the
sampler, the batch sampler and the base seed are drawn from the loader's generator
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

The next epoch's first batches are built while the current one drains, as the C++ Loader
does: once the sampler is exhausted, and only for persistent workers and samplers whose next
order can be told without side effects (SequentialSampler; RandomSampler, its generator's
state saved and restored; DistributedSampler at the epoch the trainer's set_epoch calls
suggest; each under torch's own BatchSampler), the iterator predicts the next epoch's first
prefetch_factor x num_workers batches and submits them as speculative. At iter() it draws
the real ones from the sampler as PyTorch does and compares: equal, the built batches are
that epoch's (no wait at the boundary); different, they are dropped, and the service
rewinds the workers' random streams to where that epoch began, so every batch is still
built exactly as stock DataLoader builds it. Two wrong predictions in a row (a trainer
that draws from the global generator between epochs, say) end the prediction for that
iterator.

When the trainer keeps so many batches alive that the workers would run out of slots, batches
are copied out of the ring instead (said once on stderr) until it lets go of some.

Batch 0 of an iterator's first epoch is built in the rank's own process, as worker 0 would
build it, while the pool's workers may still be starting (importing torch on the rank's CPUs):
on a copy of the dataset (the payload the workers unpickle), with worker 0's seeds and
get_worker_info(), the rank's own streams (and thread count, and worker info) saved before
and restored after. It is kept only if building it changed nothing of the copy that pickles
(a dataset that caches, opens a file or keeps its own generator would leave worker 0's copy
in another state than PyTorch's worker 0: the batch is dropped and worker 0 builds it), and
then worker 0 starts from the global streams the batch left (worker0_streams in the pickle
file, worker.py), so every later batch is the one PyTorch would build. The session opens at
batch 1, its ring sized from batch 0 (no probe). Not for a loader with a worker_init_fn (it
would run twice), one whose workers came from the job (watched: see below), or one whose
payload is over 8 MiB (a copy of it); any failure leaves the batch to worker 0. Said once.

The trainer's random streams stay as torch leaves them. The iterator draws what torch's own
draws (the base seed; the sampler's indices, at the points torch draws them); when the
service refuses the loader, what it drew is put back before torch's iterator draws it again.
A loader whose workers came from the job (the code asked for num_workers=0) is watched: if
its first batch drew from the global random streams (worker.py's watch_streams), it would
have drawn from the trainer's own streams in the trainer's process, so it goes back there:
the drawn indices are fetched in the trainer's process as _SingleProcessDataLoaderIter
fetches them, and the loader keeps num_workers=0 from then on (said once). Such a loader
draws its first indices at the first batch, as torch's single-process iterator does, not at
iter().
"""

import itertools
import os
import pickle
import sys
import time
import weakref

from . import _byvalue, _pool, _private, _script, env, policy
from ._report import report_once

_COPY_NOTE = (
    "spawnpoint: the trainer keeps %d batches of this DataLoader alive (the agent's shared-"
    "memory ring has %d slots, %d of them needed by the workers): batches are copied out of "
    "the ring while it does, which costs a copy per batch but never overwrites a kept one")
_IN_PROCESS_NOTE = (
    "spawnpoint: the DataLoader of %s draws from the random streams (torch, random or numpy) "
    "while it builds batches, and the code asked for num_workers=0: it stays in the trainer's "
    "process, as under torchrun (the job's loader workers would draw from seeds of their own "
    "and change the trainer's results). Pass num_workers=N to the DataLoader to give it "
    "workers.")
_LATE_DRAWS_NOTE = (
    "spawnpoint: the DataLoader of %s drew from the random streams (torch, random or numpy) in "
    "its workers after its first batch; the code asked for num_workers=0 and the job's workers "
    "build its batches with seeds of their own, so the trainer's results may differ from "
    "torchrun's. Pass num_workers to the DataLoader to choose.")
_HERE_NOTE = (
    "spawnpoint: batch 0 of a DataLoader's first epoch is built in the trainer's process, on "
    "a copy of the dataset with worker 0's seeds, while the agent's loader workers start; "
    "worker 0 goes on from there, so every batch is the one PyTorch's workers would build")
_HERE_MAX_PAYLOAD = 8 << 20  # a larger dataset is not copied into the rank for batch 0
_counter = itertools.count()
_classes = {}
_DL = "torch.utils.data.dataloader"


class _NamesMissing(Exception):
    """torch's iterator lacks an attribute the pool's relies on (_private has said which)."""
_MAX_SPECULATION_MISSES = 2  # wrong predictions in a row before an iterator stops predicting


class _Speculation(object):
    """The next epoch's first batches as predicted and submitted, not yet confirmed."""

    def __init__(self, epoch, session, batches):
        self.epoch = epoch
        self.session = session
        self.batches = batches
        self.ready = {}  # batch -> (Ready message, ring) received before the epoch began


def pool_iterator(loader):
    """The pool's iterator for `loader`, or (None, reason)."""
    svc_path = _pool._service_path
    if not svc_path:
        return None, None
    dlmod = sys.modules.get("torch.utils.data.dataloader")
    if dlmod is None:
        return None, "torch.utils.data.dataloader is not loaded"
    # torch's private names the iterator and the workers use, before anything is drawn or sent.
    if _private.missing("pool", {_DL: dlmod, _DL + ":DataLoader()": loader}):
        return None, None  # said once: torch's own workers
    if loader._dataset_kind != dlmod._DatasetKind.Map:
        return None, "an IterableDataset is read by torch's own workers"
    try:
        svc = _pool.service()
    except OSError as err:
        return None, "the agent's loader service at %s does not answer (%s)" % (svc_path, err)
    info = loader.__dict__.get("_spawnpoint_shim") or {}
    watch = bool(info.get("workers_from_job"))  # the code asked for none: see the docstring
    parts = {"dataset": loader.dataset, "collate_fn": loader.collate_fn,
             "worker_init_fn": loader.worker_init_fn, "num_workers": loader.num_workers,
             "auto_collation": loader._auto_collation, "watch_streams": watch}
    try:
        # Pickled once: these bytes go to the workers (the base seed beside them, as the
        # iterator draws it). By value where cloudpickle can: then the workers never import
        # the trainer's script (it may have no main guard; its lambdas have no name).
        payload, by_value = _byvalue.dumps(parts, pickle.HIGHEST_PROTOCOL)
    except Exception as err:  # torch's own spawn workers report it in their words
        return None, "the dataset, collate_fn or worker_init_fn cannot be pickled (%s: %s)" % (
            type(err).__name__, err)
    if not by_value and _script.unguarded_call(2) is not None:
        # The workers would import the script to unpickle what it defines, and run its
        # unguarded training: torch's path says so in one line instead.
        return None, ("what the script defines cannot be sent by value (%s), and the script "
                      "trains at import time" % (_byvalue.why_not() or "see above"))
    cls = _classes.get(dlmod)
    if cls is None:
        cls = _classes[dlmod] = _make_class(dlmod)
    drawn = _Draws(loader)
    try:
        it = cls(loader, svc, payload, by_value, watch)
        _pool.iterators_served = True
        return it, None
    except _NamesMissing:  # said once: torch's own iterator draws again
        drawn.put_back()
        return None, None
    except _pool.ServiceError as err:
        if err.kind in ("workers", "protocol", "gone"):
            # torch's own iterator draws its base seed and its first indices again.
            drawn.put_back()
            return None, str(err)
        raise


class _Draws(object):
    """The states of the generators a DataLoader iterator draws from when it starts (torch's
    global one, the loader's, its sampler's), to put back what an iterator that is not used
    after all drew from them."""

    def __init__(self, loader):
        torch = sys.modules["torch"]
        self._states = [(None, torch.get_rng_state())]
        for owner in (loader, getattr(loader, "sampler", None),
                      getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
            generator = getattr(owner, "generator", None)
            if isinstance(generator, torch.Generator) and all(
                    g is not generator for g, _ in self._states):
                self._states.append((generator, generator.get_state()))

    def put_back(self):
        torch = sys.modules["torch"]
        for generator, state in self._states:
            if generator is None:
                torch.set_rng_state(state)
            else:
                generator.set_state(state)


def _make_class(dlmod):
    base = dlmod._BaseDataLoaderIter

    class _PoolDataLoaderIter(base):
        def __init__(self, loader, svc, payload, by_value, watch=False):
            base.__init__(self, loader)  # draws the base seed from loader.generator
            if _private.missing("pool", {_DL + ":_BaseDataLoaderIter()": self}):
                raise _NamesMissing()
            self._pin_device = getattr(loader, "pin_memory_device", None) or None
            self._svc = svc
            self._lazy = watch             # workers from the job: draws as in-process
            self._watch = watch            # and may go back there at batch 0
            self._fetcher = None           # the in-process fetcher once it has
            self._loader = weakref.ref(loader)
            self._deferred = None          # (first_iter,) of a start put off to batch 0
            self._prefetch = max(1, int(getattr(loader, "prefetch_factor", None) or 2))
            # An overdue batch's worker is replaced (never the rank failed, as torch's
            # timeout= does): after the code's timeout=, else the job's timeoutSeconds.
            self._timeout_ms = int(policy.job_timeout_s(env.current(), loader.timeout) * 1000)
            self._pickle = _write_pickle(svc.pool_dir, payload, self._base_seed, by_value)
            self._session = None
            self._ring = None
            self._epoch = -1       # the epoch's number on the wire (skips voided predictions)
            self._epochs = 0       # epochs begun (for the statistics)
            self._copying = False
            self._speculation = None
            self._misses = 0       # wrong predictions in a row
            self._predictions = {"hits": 0, "misses": 0}  # in all (tests, debugging)
            self._sampler_epoch = None  # a DistributedSampler's epoch at the last iter()
            self._sampler_step = 1      # and by how much set_epoch moved it
            # Batch 0 built here (module docstring): the payload to copy until it is.
            self._here = (payload if not watch and loader.worker_init_fn is None
                          and len(payload) <= _HERE_MAX_PAYLOAD else None)
            self._here_bytes = 0  # its size: the ring's slots are sized from it
            self._here_batch = None  # batch 0 built here, until next() takes it
            self._opening = None  # (session, runs) of an Open not answered with its ring
            self._reset(loader, first_iter=True)

        def _reset(self, loader, first_iter=False):
            base._reset(self, loader, first_iter)
            self._send_idx = 0
            self._rcvd_idx = 0
            self._outstanding = {}  # batch -> indices, submitted and not yet yielded
            self._raw = {}          # batch -> the index as the sampler gave it
            self._ready = {}        # batch -> Ready message received ahead of its turn
            if self._fetcher is not None:  # in the trainer's process (see the docstring)
                return
            if self._lazy:  # the single-process iterator draws at the first batch
                self._deferred = (first_iter,)
                return
            self._start(first_iter)

        def _start(self, first_iter):
            """Draws the epoch's first batches and submits them (or confirms a prediction)."""
            self._consumed = [0, 0, 0.0]  # batches, samples, seconds waited: for the stats
            self._exhausted = False
            self._predicted = False  # this epoch's prediction of the next was made
            self._epochs += 1
            self._observe_sampler_epoch()
            spec, self._speculation = self._speculation, None
            with self._svc.lock:
                window = []
                for _ in range(self._prefetch * self._num_workers):
                    indices = self._draw()
                    if indices is None:
                        break
                    window.append(indices)
                own = not first_iter and self._own_session()
                compared = spec is not None and own and spec.session == self._session
                if compared and spec.batches == window:
                    # The prediction held: its batches, built or at the workers, are this
                    # epoch's first ones. The Drop confirms them and ends the last epoch.
                    self._misses = 0
                    self._predictions["hits"] += 1
                    self._epoch = spec.epoch
                    self._ready = spec.ready
                    self._svc.send(_pool.DROP, {
                        "session": self._session, "keep": self._epoch,
                        "release": self._svc.take_releases(self._session)})
                else:
                    if compared:
                        self._misses += 1
                        self._predictions["misses"] += 1
                    # A voided prediction's epoch number is never used again: the workers
                    # rewound what they built under it.
                    self._epoch = (spec.epoch if spec is not None else self._epoch) + 1
                    if own:
                        unused = ([int(r["slot"]) for r, _ in spec.ready.values()]
                                  if compared else [])
                        self._svc.send(_pool.DROP, {
                            "session": self._session, "keep": self._epoch,
                            "release": unused + self._svc.take_releases(self._session)})
                    payload, self._here = self._here, None
                    if first_iter and payload is not None and window and \
                            self._first_batch_here(payload):
                        self._open(accept=True)  # batches 1.. are waited for at their turn
                    else:
                        self._submit(window)
                self._predict_next()

        def _observe_sampler_epoch(self):
            """Notes how set_epoch moved a DistributedSampler since the last iter()."""
            epoch = getattr(_inner_sampler(self), "epoch", None)
            if isinstance(epoch, int):
                if self._sampler_epoch is not None:
                    self._sampler_step = epoch - self._sampler_epoch
                self._sampler_epoch = epoch

        def _predict_next(self):
            """Once the sampler is exhausted, submits the next epoch's first batches as
            predicted (module docstring). REQUIRES: the service's lock."""
            if (not self._exhausted or self._predicted or self._speculation is not None
                    or not getattr(self, "_persistent_workers", False)
                    or self._misses >= _MAX_SPECULATION_MISSES or not self._own_session()):
                return
            self._predicted = True
            batches = _predict_window(self, self._prefetch * self._num_workers,
                                      self._sampler_step)
            if not batches:
                return
            spec = _Speculation(self._epoch + 1, self._session, batches)
            self._svc.send(_pool.SUBMIT, {
                "session": self._session, "epoch": spec.epoch, "firstBatch": 0,
                "batches": batches, "speculative": True})
            self._speculation = spec

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
            self._raw[self._send_idx] = index
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
                             "waitedSeconds": consumed[2], "epoch": self._epochs - 1}})

        def _open(self, accept=False):
            """Opens a session for the batches outstanding. With `accept` it returns once the
            service found the request acceptable; the ring is waited for by _finish_open(),
            before the first batch of the session is."""
            # Batches already received stay; the rest are built again, in their order, each by
            # the worker PyTorch would use (b % num_workers).
            here = 0 if self._here_batch is not None else None
            pending = sorted(b for b in self._outstanding if b not in self._ready and b != here)
            runs = [{"firstBatch": start, "batches": [self._outstanding[b] for b in run]}
                    for start, run in _runs(pending)]
            svc = self._svc
            session = svc.new_session_id()
            svc.active = None
            request = {
                "protocol": _pool.PROTOCOL_VERSION, "session": session, "arg": self._pickle,
                "numWorkers": self._num_workers, "prefetchFactor": self._prefetch,
                "timeoutMs": self._timeout_ms,
                "probe": self._outstanding[pending[0]] if pending else [],
                # Built as soon as the ring exists, not after a round trip to here.
                "epoch": self._epoch, "submit": runs}
            if self._ring is not None:
                # The slot size is known: no probe, which would build a batch on worker 0
                # out of its turn and so shift that worker's random streams.
                request["slotBytes"] = self._ring.slot_bytes
            elif self._here_bytes:
                request["batchBytes"] = self._here_bytes  # batch 0's, built here
            if accept:
                request["accept"] = True
            svc.send(_pool.OPEN, request)
            self._opening = (session, runs)
            if not accept:
                return self._finish_open()
            self._answer_to_open(session, _pool.ACCEPTED)
            # Submits and Drops may go now: the service takes them after the Open.
            self._session = session
            svc.active = session

        def _finish_open(self):
            """Waits for the ring of the session _open() asked for. REQUIRES: the lock."""
            (session, runs), self._opening = self._opening, None
            svc = self._svc
            body, fd = self._answer_to_open(session, _pool.OPENED)
            self._ring = _pool.Ring(svc, session, fd, int(body["slots"]), int(body["slotBytes"]))
            self._session = session
            svc.active = session
            if not body.get("submitted"):  # a service that does not take Open's submit
                for run in runs:
                    svc.send(_pool.SUBMIT, dict(run, session=session, epoch=self._epoch))

        def _answer_to_open(self, session, wanted):
            """(body, fd) of the service's `wanted` answer (ACCEPTED, or OPENED with the
            ring's descriptor) to the Open of `session`; raises its Error."""
            svc = self._svc
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
                    if svc.active == session:
                        svc.active = None
                    if body.get("kind") == "dataset":  # batch 0 failed as it was probed
                        _raise_batch_error(body)
                    raise _pool.ServiceError(body.get("kind", "start"), body.get("message", ""),
                                             body.get("excType"))
                if kind == wanted and (fd >= 0 or wanted != _pool.OPENED):
                    return body, fd
                if fd >= 0:
                    os.close(fd)
                raise _pool.ServiceError("protocol", "unexpected answer %d to Open" % kind)

        def _next_data(self):
            if self._fetcher is not None:
                return self._next_in_process()
            if self._deferred is not None:
                (first_iter,), self._deferred = self._deferred, None
                try:
                    self._start(first_iter)
                except _pool.ServiceError as err:
                    if err.kind not in ("workers", "protocol", "gone"):
                        raise
                    # The code asked for no workers: its own process is stock behaviour.
                    report_once("spawnpoint: a DataLoader of %s runs in the trainer's process, "
                                "as the code asked (num_workers=0), not on the agent's pool: %s"
                                % (type(self._dataset).__name__, err))
                    self._go_in_process()
                    return self._next_in_process()
            if self._here_batch is not None:
                return self._take_first_batch_here()
            if self._rcvd_idx >= self._send_idx:
                if not self._persistent_workers:
                    self._shutdown()
                raise StopIteration
            waited_from = time.monotonic()
            with self._svc.lock:
                if self._opening is not None and self._own_session():
                    self._finish_open()
                if not self._own_session() and self._rcvd_idx not in self._ready:
                    self._open()
                ready, ring = self._wait_for(self._rcvd_idx)
                if self._watch:
                    self._decide_where(ready)
            if self._fetcher is not None:
                return self._next_in_process()
            if self._rcvd_idx >= self._num_workers - 1:
                _pool.workers_warm = True  # each worker has built a batch (b % num_workers)
            with self._svc.lock:
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
                self._predict_next()
            if self._pin_memory:
                data = _pin(data, self._pin_device)
            return data

        def _first_batch_here(self, payload):
            """Builds batch 0 in this process as worker 0 would (the module docstring says
            when it is kept); whether it was. REQUIRES: the service's lock."""
            built = _build_like_worker0(payload, self._base_seed, self._num_workers,
                                        self._outstanding[0])
            if built is None:
                return False
            data, streams, nbytes = built
            try:
                _add_to_pickle(self._pickle, {"worker0_streams": streams})
            except Exception:  # worker 0 could not go on from the right streams
                return False
            report_once(_HERE_NOTE)
            self._here_batch, self._here_bytes = data, nbytes
            return True

        def _take_first_batch_here(self):
            """Batch 0, built here; the next index is put as after any batch."""
            data, self._here_batch = self._here_batch, None
            with self._svc.lock:
                samples = len(self._outstanding.pop(self._rcvd_idx))
                self._raw.pop(self._rcvd_idx, None)
                self._rcvd_idx += 1
                self._consumed[0] += 1
                self._consumed[1] += samples
                indices = self._draw()
                self._submit([indices] if indices is not None else [])
            if self._pin_memory:
                data = _pin(data, self._pin_device)
            return data

        def _decide_where(self, ready):
            """At batch 0 of a loader whose workers came from the job: stays on the pool, or,
            when building the batch drew from the worker's global streams, goes back to the
            trainer's process (the module docstring). REQUIRES: the service's lock."""
            self._watch = False
            info = _shim_info(self._loader())
            drew = os.path.exists(self._pickle + ".draws")
            if info is not None and info.get("drawing_checked"):
                if drew:  # it drew only after an earlier epoch's first batch
                    report_once(_LATE_DRAWS_NOTE % type(self._dataset).__name__)
                return
            if info is not None:
                info["drawing_checked"] = True
            if not drew:
                return
            report_once(_IN_PROCESS_NOTE % type(self._dataset).__name__)
            self._svc.released(self._session, int(ready["slot"]))
            self._shutdown()
            self._svc.active = None
            self._go_in_process()

        def _go_in_process(self):
            """From now on batches are built here, and the loader's later iterators are
            torch's single-process one."""
            _pool.workers_warm = True  # none to wait for
            info = _shim_info(self._loader())
            dlmod = sys.modules["torch.utils.data.dataloader"]
            self._fetcher = dlmod._DatasetKind.create_fetcher(
                self._dataset_kind, self._dataset, self._auto_collation, self._collate_fn,
                self._drop_last)
            loader = self._loader()
            if loader is not None:  # its next iterators are torch's single-process one
                if info is not None:
                    info["workers_from_job"] = 0
                loader.num_workers = 0

        def _next_in_process(self):
            """The next batch built here, as _SingleProcessDataLoaderIter builds it: first the
            batches already drawn from the sampler, in order, then the sampler's next."""
            batch = self._rcvd_idx
            if batch in self._raw:
                index = self._raw.pop(batch)
                self._outstanding.pop(batch, None)
            else:
                index = self._next_index()  # StopIteration ends the epoch
            self._rcvd_idx += 1
            data = self._fetcher.fetch(index)
            if self._pin_memory:
                data = _pin(data, self._pin_device)
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
                    spec = self._speculation
                    if body.get("epoch") == self._epoch:
                        self._ready[body["batch"]] = (body, self._ring)
                    elif spec is not None and body.get("epoch") == spec.epoch:
                        spec.ready[body["batch"]] = (body, self._ring)
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
            for suffix in ("", ".draws"):
                try:
                    os.unlink(self._pickle + suffix)
                except (AttributeError, OSError):
                    pass

    _PoolDataLoaderIter.__name__ = "_PoolDataLoaderIter"
    return _PoolDataLoaderIter


def _shim_info(loader):
    """What the shim noted on a DataLoader it built (_dataloader.py), or None."""
    return None if loader is None else loader.__dict__.get("_spawnpoint_shim")


def _inner_sampler(it):
    """The sampler under the iterator's torch BatchSampler (or the sampler itself without
    auto-collation); None when the batch sampler is not torch's own."""
    index_sampler = it._index_sampler
    if not it._auto_collation:
        return index_sampler
    samplers = sys.modules.get("torch.utils.data.sampler")
    if samplers is None or type(index_sampler) is not samplers.BatchSampler:
        return None
    return index_sampler.sampler


def _predict_window(it, count, sampler_step):
    """The first `count` batches (sample index lists) the next epoch will draw, if the
    sampler can tell them without side effects; else None. Its state is restored."""
    inner = _inner_sampler(it)
    samplers = sys.modules.get("torch.utils.data.sampler")
    distributed = getattr(sys.modules.get("torch.utils.data.distributed"),
                          "DistributedSampler", None)
    torch = sys.modules.get("torch")
    kind = type(inner)
    if inner is None or samplers is None or torch is None:
        return None
    if kind is samplers.SequentialSampler:
        def restore():
            pass
    elif kind is samplers.RandomSampler:
        generator = inner.generator
        if generator is None:  # a seed drawn from the global generator (a few torch versions
            state = torch.get_rng_state()  # draw the permutation from it directly)

            def restore():
                torch.set_rng_state(state)
        else:
            state = generator.get_state()

            def restore():
                generator.set_state(state)
    elif distributed is not None and kind is distributed:
        epoch = inner.epoch
        inner.epoch = epoch + sampler_step  # as the trainer's set_epoch calls have moved it

        def restore():
            inner.epoch = epoch
    else:
        return None
    try:
        source = iter(it._index_sampler)
        batches = []
        for _ in range(count):
            try:
                index = next(source)
            except StopIteration:
                break
            batches.append([int(i) for i in index] if it._auto_collation else [int(index)])
        return batches
    except Exception:  # a sampler that cannot be iterated twice: no prediction
        return None
    finally:
        restore()


def _build_like_worker0(payload, base_seed, num_workers, indices):
    """(batch, the streams it left, its encoded size) for `indices` built here as the pool's
    worker 0 builds its first batch (worker.py's LoaderSpec, on a copy unpickled from
    `payload`, with worker 0's seeds, get_worker_info() and one thread), or None when it must
    be left to worker 0: building raised, or changed what the copy pickles to. This
    process's streams, thread count and worker info are restored whatever happens."""
    import torch
    from torch.utils.data._utils import worker as torch_worker

    from . import _batch_codec, worker

    saved = worker.capture_streams()
    threads = torch.get_num_threads()
    info = torch_worker._worker_info
    try:
        parts = pickle.loads(payload)
        before = _byvalue.dumps(parts, pickle.HIGHEST_PROTOCOL)[0]
        spec = worker.LoaderSpec(("", 0, 0), dict(parts, base_seed=base_seed), 0,
                                 num_workers, in_rank=True)
        data = spec.fetch(indices)
        nbytes = _batch_codec.plan(data).nbytes
        streams = worker.capture_streams()
        if _byvalue.dumps(parts, pickle.HIGHEST_PROTOCOL)[0] != before:
            return None
        return data, streams, nbytes
    except Exception:
        return None
    finally:
        worker.restore_streams(saved)
        numpy = sys.modules.get("numpy")
        if saved[2] is None and numpy is not None:
            numpy.random.seed()  # imported just now: unseeded, as a fresh import is
        torch.set_num_threads(threads)
        torch_worker._worker_info = info


def _add_to_pickle(path, entries):
    """Adds `entries` to the loader file _write_pickle wrote (replaced atomically)."""
    with open(path, "rb") as f:
        spec = pickle.load(f)
    spec.update(entries)
    with open(path + ".tmp", "wb") as f:
        pickle.dump(spec, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.rename(path + ".tmp", path)


def _write_pickle(pool_dir, payload, base_seed, by_value):
    """Writes what the workers need for a loader (worker.py's unwrap reads it); its path.

    As a spawned DataLoader worker gets it: multiprocessing's preparation data (the rank's
    sys.path and working directory, and, unless the payload is by value, its main module, so
    that what the trainer's script defines unpickles), the pickled loader dict (`payload`, in
    a protocol the workers' Python reads), whether cloudpickle made it (`by_value`: the
    workers need it importable) and the iterator's base seed."""
    from multiprocessing import spawn

    try:
        preparation = spawn.get_preparation_data("spawnpoint-loader-worker")
        for secret in ("authkey", "log_to_stderr", "log_level"):  # never leaves the rank
            preparation.pop(secret, None)
        if by_value:  # nothing of the script is needed: never run it in a worker
            preparation.pop("init_main_from_path", None)
            preparation.pop("init_main_from_name", None)
    except Exception:  # e.g. an interactive main: no main module to import in the workers
        preparation = None
    path = os.path.join(pool_dir, "loader-%d-%d.pkl" % (os.getpid(), next(_counter)))
    with open(path + ".tmp", "wb") as f:
        pickle.dump({"preparation": preparation, "payload": payload, "base_seed": base_seed,
                     "by_value": by_value}, f, protocol=pickle.HIGHEST_PROTOCOL)
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
    if exc_type is KeyError and not _private.missing("key_error_message"):
        message = sys.modules["torch._utils"].KeyErrorMessage(message)
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
