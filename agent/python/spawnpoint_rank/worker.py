"""The Python loader worker: the worker half of agent/loader/protocol.h, for the datasets
of Python ranks, as agent/loader/worker.cc is for C++ ones.

A pool owner (PoolSupervisor, StandalonePool) starts it as `<python> -m
spawnpoint_rank.worker` with agent/python on PYTHONPATH, the worker's listening socket as
fd 3 and SPAWNPOINT_LOADER_{LISTEN_FD,WORKER_ID,RANK,INCARNATION} set (contract.h). It
imports the modules named by SPAWNPOINT_LOADER_PRELOAD at once (_preload.py: e.g.
"torch,numpy,__main__", __main__ being the trainer script's leading imports), so the rank
does not wait for them. With SPAWNPOINT_LOADER_TURN_FD (the pool staggers start-ups on a
rank with few CPUs) it first waits for the worker before it to finish its preload; it closes
SPAWNPOINT_LOADER_STARTED_FD when its own is done, which is the next worker's turn. Then it
serves one rank connection at a time: when the rank goes away (or restarts, or switches
DataLoaders), the worker waits for the next one, its loaders still loaded.

Configure{dataset: "python", arg: PATH}: PATH is a pickle file the rank side writes, one per
DataLoader (iterator, when workers are not persistent), holding the dict
  dataset          a map-style dataset (len() and [] or __getitems__)
  collate_fn       None: torch's default_collate (default_convert without auto_collation)
  worker_init_fn   None, or called once with the worker id, as PyTorch does
  base_seed        int: what the DataLoader drew from its generator for this iterator
  num_workers      the DataLoader's num_workers (WorkerInfo.num_workers); default: the
                   Configure's numWorkers
  auto_collation   bool, default True: batches of indices (False: batch_size=None, one
                   index per task, no collation)
  watch_streams    bool, default False: the code asked for num_workers=0 and the job gave
                   the loader its workers. The worker then compares the global random
                   streams before and after each batch it builds; the first time the dataset
                   or collate_fn drew from them, it creates PATH + ".draws" (before it
                   answers), which tells the rank that in its own process the loader would
                   have drawn from the trainer's streams (_pool_iter.py keeps such a loader
                   in the trainer's process, as under torchrun).
  worker0_streams  optional: the random streams (capture_streams()) worker 0 goes on from
                   after its set-up: the rank built batch 0 itself while the workers started
                   (_pool_iter.py), and these are the streams that left, as PyTorch's worker 0
                   has them after building it.
(drop_last, the sampler and the batch sampler stay with the rank: it sends sample indices.)
A new file (by path, mtime and size) is loaded and the worker set up for it exactly as
torch's _worker_loop sets up worker `workerId` (one thread; seeds base_seed + id for random
and torch, numpy from _generate_state where the torch has it; get_worker_info();
worker_init_fn). The same file again (a reconnect) keeps the worker as it is, random streams
included, like a persistent PyTorch worker.

One worker serves the DataLoaders of its rank in turn (a training and a validation loader
alternate, the rank reconnecting with the other's pickle), each as if it had persistent
workers of its own: up to 8 set-up loaders are kept (the least recently used is forgotten,
and so is a file that a new one at its path replaced). Switching from loader A to B saves
A's random streams (random.getstate(), torch.get_rng_state(), numpy's global state when numpy
is imported) and get_worker_info(), and restores B's, or sets B up afresh if it is new; back
at A, A's streams go on where they stopped, as a persistent worker of A's would. State a
dataset or worker_init_fn keeps elsewhere (its own generators, other globals) is not
switched. A forgotten loader asked for again is set up afresh (re-seeded).

Batches are fetched as torch's _MapDatasetFetcher fetches, collated, and written into the
ring slot by _batch_codec: Done{id, bytes, fields, tree}. Errors: kind "dataset" with the
sample index and PyTorch's "Caught E in DataLoader worker process N. Original Traceback..."
text (plus "excType": module.qualname of the exception); "collate" for collate_fn failures
and values the ring cannot carry; "slot"; "configure"; "protocol".

Rewind{epoch}: the batches of `epoch` built here are void (the rank predicted the next
epoch's first batches, built them while the current epoch drained, and the prediction was
wrong): the loader's streams go back to where the first batch of `epoch` found them, so
what is built next draws exactly what it would have drawn without the prediction. Each
loader keeps the streams as its latest epoch's first batch found them (one capture per
epoch).

The probe (Probe{epoch, batch, indices}) builds a batch with the worker's random streams and
keeps it for the Task of the same batch, so a probe of the first batch worker 0 builds leaves
its streams as PyTorch would. If the next Task is another batch (or the connection or the
loader changes first), the probed batch is thrown away and the streams rewound to where the
probe found them: a probe never costs a loader's streams a batch. An exception in
worker_init_fn is the first batch's error, as in PyTorch. Single-threaded: the process
serves one connection at a time.
"""

import collections
import json
import mmap
import os
import pickle
import random
import socket
import struct
import sys
import threading
import traceback

from . import _batch_codec, _byvalue, _preload

PROTOCOL_VERSION = 1
CONFIGURE, HELLO, RING, PROBE, PROBE_RESULT, TASK, DONE, ERROR = range(1, 9)
REWIND = 16
_HEADER = struct.Struct("<IBBxx")  # payload length, message type, descriptor follows
_MAX_PAYLOAD = 64 << 20
_MAX_FDS = 8
MAX_LOADERS = 8  # set-up DataLoaders a worker keeps


class Connection(object):
    """One rank's connection: framed JSON messages, descriptors by SCM_RIGHTS."""

    def __init__(self, sock):
        self.sock = sock
        self._buffer = b""
        self._fds = []

    def close(self):
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        self.sock.close()

    def receive(self):
        """The next (type, body, fd or -1); None when the rank went away."""
        while True:
            if len(self._buffer) >= _HEADER.size:
                length, kind, has_fd = _HEADER.unpack_from(self._buffer)
                if length > _MAX_PAYLOAD:
                    raise ValueError("malformed frame: payload of %d bytes" % length)
                end = _HEADER.size + length
                if len(self._buffer) >= end:
                    body = json.loads(self._buffer[_HEADER.size:end].decode("utf-8"))
                    self._buffer = self._buffer[end:]
                    fd = -1
                    if has_fd:
                        if not self._fds:
                            raise ValueError("message %d arrived without its descriptor" % kind)
                        fd = self._fds.pop(0)
                    return kind, body, fd
            try:
                data, ancillary, _, _ = self.sock.recvmsg(
                    64 * 1024, socket.CMSG_SPACE(_MAX_FDS * 4),
                    getattr(socket, "MSG_CMSG_CLOEXEC", 0))
            except (ConnectionError, OSError):
                return None
            for level, ctype, cdata in ancillary:
                if level == socket.SOL_SOCKET and ctype == socket.SCM_RIGHTS:
                    usable = len(cdata) - len(cdata) % 4
                    self._fds.extend(struct.unpack("%di" % (usable // 4), cdata[:usable]))
            if not data:
                return None
            self._buffer += data

    def send(self, kind, body):
        payload = json.dumps(body, allow_nan=False).encode("utf-8")
        self.sock.sendall(_HEADER.pack(len(payload), kind, 0) + payload)


class BuildError(Exception):
    def __init__(self, kind, message, index=-1, need=0, have=0, exc_type=None):
        Exception.__init__(self, message)
        self.reply = {"kind": kind, "message": message, "index": index, "need": need,
                      "have": have}
        if exc_type is not None:
            self.reply["excType"] = "%s.%s" % (exc_type.__module__, exc_type.__qualname__)


def caught(worker_id, index=-1, kind="dataset"):
    """The exception being handled as PyTorch's ExceptionWrapper words it in the rank."""
    exc_type, exc, tb = sys.exc_info()
    text = "Caught %s in DataLoader worker process %d.\nOriginal %s" % (
        exc_type.__name__, worker_id, "".join(traceback.format_exception(exc_type, exc, tb)))
    return BuildError(kind, text, index=index, exc_type=exc_type)


class LoaderSpec(object):
    """One DataLoader's pickle, loaded, and the worker set up for it as PyTorch would."""

    def __init__(self, key, spec, worker_id, fallback_workers, in_rank=False):
        self.key = key
        self.dataset = spec["dataset"]
        self.auto_collation = bool(spec.get("auto_collation", True))
        from torch.utils.data._utils import collate
        self.collate_fn = spec.get("collate_fn")
        if self.collate_fn is None:
            self.collate_fn = (collate.default_collate if self.auto_collation
                               else collate.default_convert)
        # torch's default_collate stacks tensors into a new shared-memory segment whenever
        # get_worker_info() is set (for the queue to the main process): a file, an mmap and
        # fresh zeroed pages per batch. Here the batch is copied into the ring's slot anyway,
        # so default_collate runs without the worker info and stacks on the heap (the same
        # values; 33 ms of CPU less per 18 MiB batch measured in bench-loader).
        self.collate_on_heap = self.collate_fn is collate.default_collate
        self.worker_id = worker_id
        self.num_workers = int(spec.get("num_workers") or fallback_workers)
        self.base_seed = int(spec.get("base_seed", 0))
        self.size = len(self.dataset)
        # Where to say that the loader draws from the global streams (watch_streams), until
        # it has been said.
        self.draw_marker = key[0] + ".draws" if spec.get("watch_streams") else None
        self.init_error = None
        self.saved = None  # (streams, worker info) while another loader is served
        self.epoch_start = None  # (epoch, streams as its first batch here found them)
        setup_like_torch(self.base_seed, worker_id, self.num_workers, self.dataset, in_rank)
        init_fn = spec.get("worker_init_fn")
        if init_fn is not None:
            try:
                init_fn(worker_id)
            except Exception:
                # PyTorch hands this to the first batch the worker is asked for.
                self.init_error = caught(worker_id)
        if worker_id == 0 and spec.get("worker0_streams") is not None:
            # The rank built batch 0 itself (_pool_iter.py): worker 0 goes on from the streams
            # that batch left, as PyTorch's worker 0 would after building it.
            restore_streams(spec["worker0_streams"])

    def suspend(self):
        """Saves this loader's random streams and worker info: another loader is served."""
        from torch.utils.data._utils import worker as torch_worker
        self.saved = (capture_streams(), torch_worker._worker_info)

    def resume(self):
        """Makes this loader's saved streams and worker info the process's again."""
        from torch.utils.data._utils import worker as torch_worker
        streams, info = self.saved
        self.saved = None
        restore_streams(streams)
        torch_worker._worker_info = info

    def enter_epoch(self, epoch):
        """Called before each batch is built: keeps the streams the first batch of a new
        epoch finds, for rewind()."""
        if self.epoch_start is None or self.epoch_start[0] != epoch:
            self.epoch_start = (epoch, capture_streams())

    def rewind(self, epoch):
        """Voids what was built of `epoch`: the streams as its first batch found them."""
        if self.epoch_start is not None and self.epoch_start[0] == epoch:
            restore_streams(self.epoch_start[1])
            self.epoch_start = None

    def fetch(self, indices):
        """The collated batch of these sample indices, as _MapDatasetFetcher builds it."""
        if self.draw_marker is None:
            return self._fetch(indices)
        before = capture_streams()
        try:
            return self._fetch(indices)
        finally:
            if not streams_equal(before, capture_streams()):
                marker, self.draw_marker = self.draw_marker, None
                try:
                    with open(marker, "w"):
                        pass
                except OSError as e:
                    log("worker %d: cannot create %s: %s" % (self.worker_id, marker, e))

    def _fetch(self, indices):
        if self.init_error is not None:
            error, self.init_error = self.init_error, None
            raise error
        dataset = self.dataset
        if not self.auto_collation:
            index = indices[0] if indices else -1
            try:
                data = dataset[index]
            except Exception:
                raise caught(self.worker_id, index)
        elif getattr(dataset, "__getitems__", None):
            try:
                data = dataset.__getitems__(list(indices))
            except Exception:
                raise caught(self.worker_id)
        else:
            data = []
            for index in indices:
                try:
                    data.append(dataset[index])
                except Exception:
                    raise caught(self.worker_id, index)
        try:
            if self.collate_on_heap:
                return _without_worker_info(self.collate_fn, data)
            return self.collate_fn(data)
        except Exception:
            raise caught(self.worker_id, kind="collate")


def _without_worker_info(fn, data):
    """fn(data) with get_worker_info() None (the worker is single-threaded)."""
    from torch.utils.data._utils import worker as torch_worker
    info, torch_worker._worker_info = torch_worker._worker_info, None
    try:
        return fn(data)
    finally:
        torch_worker._worker_info = info


def unwrap(spec):
    """The loader dict of a pickle file. The rank side wraps it as {"preparation",
    "payload", "base_seed", "by_value"}: multiprocessing's spawn preparation data of the rank
    (its sys.path and working directory, and its main module unless the payload came by
    value), applied here as a spawned child applies it; then the payload, the pickled loader
    dict (by cloudpickle when by_value: what the trainer's script defines comes by value and
    the script is never run here), with the iterator's base seed."""
    if "payload" not in spec:
        return spec
    preparation = spec.get("preparation")
    if preparation:
        from multiprocessing import spawn

        spawn.prepare(preparation)
    if spec.get("by_value") and _byvalue.cloudpickle() is None:
        raise ImportError("the rank pickled this loader with cloudpickle, which this worker "
                          "cannot import (%s)" % (_byvalue.why_not() or "?"))
    loaded = pickle.loads(spec["payload"])
    for key in ("base_seed", "worker0_streams"):
        if key in spec:
            loaded[key] = spec[key]
    return loaded


def capture_streams():
    """The global random streams a dataset draws from: random's, torch's CPU generator's and
    numpy's (None when numpy is not imported)."""
    import torch
    numpy = sys.modules.get("numpy")
    return (random.getstate(), torch.get_rng_state(),
            numpy.random.get_state() if numpy is not None else None)


def streams_equal(a, b):
    """Whether two capture_streams() results are the same streams at the same point."""
    import torch
    if a[0] != b[0] or not torch.equal(a[1], b[1]):
        return False
    if a[2] is None or b[2] is None:
        return a[2] is None and b[2] is None
    numpy = sys.modules["numpy"]
    return (a[2][0] == b[2][0] and numpy.array_equal(a[2][1], b[2][1])
            and tuple(a[2][2:]) == tuple(b[2][2:]))


def restore_streams(streams):
    """Sets the streams capture_streams() saved (torch.initial_seed() included)."""
    import torch
    python, torch_state, numpy_state = streams
    random.setstate(python)
    torch.set_rng_state(torch_state)
    if numpy_state is not None:
        import numpy

        numpy.random.set_state(numpy_state)


def setup_like_torch(base_seed, worker_id, num_workers, dataset, in_rank=False):
    """What torch's _worker_loop does before its first batch, for this torch version.
    `in_rank`: in the rank's own process (the caller saves and restores what this sets),
    where only the CPU generator is seeded: torch.manual_seed would seed (or queue seeds for)
    the rank's GPU generators too."""
    import torch
    from torch.utils.data._utils import worker as torch_worker

    torch.set_num_threads(1)
    seed = base_seed + worker_id
    random.seed(seed)
    if in_rank:
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)
    generate_state = getattr(torch_worker, "_generate_state", None)  # torch >= 1.9
    if generate_state is not None and getattr(torch_worker, "HAS_NUMPY", False):
        import numpy as np
        np.random.seed(generate_state(base_seed, worker_id))
    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset)


class Worker(object):
    def __init__(self, listen, worker_id, rank, incarnation):
        self.listen = listen
        self.worker_id = worker_id
        self.rank = rank
        self.incarnation = incarnation
        self.loader = None  # the LoaderSpec served now, kept across connections
        # Every set-up LoaderSpec by key, the least recently served first (the current one
        # last); all but the current one are suspended.
        self.loaders = collections.OrderedDict()
        self.ring = None  # (mmap, slots, slot_bytes) of the connected rank
        self.ring_populated = set()  # slots of self.ring whose pages are mapped here
        self.cached = None  # (epoch, batch, indices, collated batch) built by a probe
        self.before_probe = None  # the streams the probe found, to rewind to if unused

    def serve(self):
        while True:
            try:
                sock, _ = self.listen.accept()
            except InterruptedError:
                continue
            conn = Connection(sock)
            try:
                self.serve_client(conn)
            finally:
                conn.close()
                self.drop_probe()
                if self.ring is not None:
                    self.ring[0].close()
                    self.ring = None

    def serve_client(self, conn):
        # Once a reply cannot be sent (the client closed its end), what it sent before still
        # counts: a session that voids its speculative batches sends Rewind and closes, and a
        # worker that was still building one of them fails to answer it but must rewind all
        # the same, or its random streams stay a batch ahead of PyTorch's. So the messages
        # already received are handled to the end, unanswered.
        gone = False
        while True:
            try:
                message = conn.receive()
            except ValueError as e:
                log("worker %d: %s" % (self.worker_id, e))
                return
            if message is None:
                return
            kind, body, fd = message
            try:
                reply = self.handle(kind, body, fd)
            finally:
                if fd >= 0 and kind != RING:
                    os.close(fd)  # a descriptor nobody took
            if reply is not None and not gone:
                try:
                    conn.send(*reply)
                except OSError:
                    gone = True

    def handle(self, kind, body, fd):
        handlers = {CONFIGURE: self.configure, PROBE: self.probe, TASK: self.task,
                    REWIND: self.rewind}
        if kind == RING:
            return self.attach_ring(body, fd)
        if kind in handlers:
            return handlers[kind](body)
        return error_reply(-1, "protocol", "unexpected message %d" % kind)

    def configure(self, body):
        if body.get("protocol") != PROTOCOL_VERSION:
            return error_reply(-1, "configure", "protocol version %s but this worker speaks %d"
                               % (body.get("protocol"), PROTOCOL_VERSION))
        if body.get("workerId", self.worker_id) != self.worker_id:
            return error_reply(-1, "configure", "the client expected worker %s but reached "
                               "worker %d" % (body.get("workerId"), self.worker_id))
        if body.get("dataset") != "python":
            return error_reply(-1, "configure", "this is the Python loader worker; it serves "
                               "dataset \"python\" (a pickle file), not %r" % body.get("dataset"))
        self.drop_probe()
        path = body.get("arg", "")
        try:
            st = os.stat(path)
            self.switch_to((path, st.st_mtime_ns, st.st_size), body.get("numWorkers", 1))
        except Exception:
            return error_reply(-1, "configure", "cannot load the DataLoader from %s:\n%s"
                               % (path, traceback.format_exc()))
        return HELLO, {"pid": os.getpid(), "incarnation": self.incarnation,
                       "workerId": self.worker_id, "size": self.loader.size}

    def switch_to(self, key, fallback_workers):
        """Makes the loader of file `key` (path, mtime, size) the current one: as it is if it
        already is, resumed if it is kept, else loaded and set up (the least recently used
        kept one forgotten when MAX_LOADERS are). Raises what loading the file raises."""
        if self.loader is not None and self.loader.key == key:
            return
        if self.loader is not None:
            self.loader.suspend()
            self.loader = None
        path = key[0]
        for stale in [k for k in self.loaders if k[0] == path and k != key]:
            del self.loaders[stale]  # its file was replaced: it cannot be asked for again
        loader = self.loaders.get(key)
        if loader is not None:
            loader.resume()
            self.loaders.move_to_end(key)
        else:
            with open(path, "rb") as f:
                spec = unwrap(pickle.load(f))
            loader = LoaderSpec(key, spec, self.worker_id, fallback_workers)
            self.loaders[key] = loader
            while len(self.loaders) > MAX_LOADERS:
                self.loaders.popitem(last=False)
        self.loader = loader

    def drop_probe(self):
        """Forgets a probed batch no Task took, rewinding the streams the probe drew from."""
        if self.cached is not None and self.before_probe is not None:
            restore_streams(self.before_probe)
        self.cached = None
        self.before_probe = None

    def attach_ring(self, body, fd):
        if self.ring is not None:
            self.ring[0].close()
            self.ring = None
        slots, slot_bytes = int(body.get("slots", 0)), int(body.get("slotBytes", 0))
        try:
            need = slots * slot_bytes
            have = os.fstat(fd).st_size if fd >= 0 else 0
            if need == 0 or have < need:
                return error_reply(-1, "ring", "shared-memory ring: the descriptor holds %d "
                                   "bytes, fewer than %d" % (have, need))
            self.ring = (mmap.mmap(fd, need, mmap.MAP_SHARED,
                                   mmap.PROT_READ | mmap.PROT_WRITE), slots, slot_bytes)
            self.ring_populated = set()
        except OSError as e:
            return error_reply(-1, "ring", "shared-memory ring: mmap: %s" % e)
        finally:
            if fd >= 0:
                os.close(fd)
        return None

    def encode(self, task_id, body):
        """((epoch, batch, indices, the collated batch), its layout, None) for the batch `body`
        asks for, or (None, None, the Error reply saying why it cannot be built)."""
        epoch, batch, indices = body.get("epoch", 0), body.get("batch", 0), body.get("indices", [])
        try:
            if self.cached is not None and self.cached[:3] == (epoch, batch, indices):
                built, self.cached, self.before_probe = self.cached[3], None, None
            else:
                self.drop_probe()
                self.loader.enter_epoch(epoch)
                built = self.loader.fetch(indices)
            layout = _batch_codec.plan(built)
        except BuildError as e:
            return None, None, (ERROR, dict(e.reply, id=task_id))
        except _batch_codec.CodecError as e:
            return None, None, error_reply(task_id, "collate", str(e))
        except Exception:
            return None, None, error_reply(task_id, "collate", traceback.format_exc())
        return (epoch, batch, indices, built), layout, None

    def rewind(self, body):
        if self.loader is not None:
            self.drop_probe()
            self.loader.rewind(body.get("epoch"))
        return None

    def probe(self, body):
        if self.loader is None:
            return error_reply(-1, "protocol", "Probe before Configure")
        self.drop_probe()
        before = capture_streams()
        built, layout, error = self.encode(-1, body)
        if error is not None:
            restore_streams(before)
            return error
        self.cached = built  # for the first Task of this batch
        self.before_probe = before
        return PROBE_RESULT, {"bytes": layout.nbytes}

    def task(self, body):
        task_id = body.get("id", -1)
        if self.loader is None or self.ring is None:
            return error_reply(task_id, "protocol", "Task before Configure and Ring")
        ring, slots, slot_bytes = self.ring
        slot = body.get("slot", 0)
        if not 0 <= slot < slots:
            return error_reply(task_id, "protocol", "slot %d is outside the ring" % slot)
        _, layout, error = self.encode(task_id, body)
        if error is not None:
            return error
        if layout.nbytes > slot_bytes:
            return ERROR, {"id": task_id, "kind": "slot", "message": "", "index": -1,
                           "need": layout.nbytes, "have": slot_bytes}
        _populate(self.ring_populated, ring, slot, slot_bytes, layout.nbytes)
        layout.write(ring, slot * slot_bytes, slot_bytes)
        return DONE, {"id": task_id, "bytes": layout.nbytes, "fields": layout.fields,
                      "tree": layout.tree}


MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14


def _populate(done, ring, slot, slot_bytes, nbytes):
    """Maps the pages of a slot this worker has not written yet in one madvise call, so the
    copy into it runs without a page fault per 4 KiB (measured: an 18 MiB batch's first copy
    into a slot 23 ms with faults). `done` is the set of slots already mapped. Kernels before
    5.14 (EINVAL) and Pythons without mmap.madvise simply fault the pages in."""
    if slot in done:
        return
    done.add(slot)
    length = min(slot_bytes, (nbytes + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE)
    try:
        ring.madvise(MADV_POPULATE_WRITE, slot * slot_bytes, length)
    except (AttributeError, OSError, ValueError):
        pass


def error_reply(task_id, kind, message):
    return ERROR, {"id": task_id, "kind": kind, "message": message}


def log(line):
    sys.stderr.write("loader worker: %s\n" % line)
    sys.stderr.flush()


def env_int(name, fallback):
    try:
        return int(os.environ.get(name, ""))
    except ValueError:
        return fallback


STARVE_CHECK_S = 0.5  # how often the main thread looks whether its start-up starves


def restart_at_normal_priority(environ, listen_fd):
    """Replaces this process (the same pid, pipes and listening socket, with the pending
    connection) by a fresh worker whose start-up runs at normal priority. `environ`: the
    environment the worker was started with; its turn is over (it was importing)."""
    env = dict(environ)
    env[_preload.PRIORITY_ENV] = "normal"
    env.pop(_preload.TURN_FD_ENV, None)
    os.set_inheritable(listen_fd, True)
    try:
        started = int(env.get(_preload.STARTED_FD_ENV, ""))
        os.set_inheritable(started, True)  # closed by the new worker once it has imported
    except (ValueError, OSError):
        env.pop(_preload.STARTED_FD_ENV, None)
    argv = getattr(sys, "orig_argv", None) or [sys.executable, "-m", "spawnpoint_rank.worker"]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)


def main():
    started_with = dict(os.environ)
    fd = env_int("SPAWNPOINT_LOADER_LISTEN_FD", 3)
    try:
        listen = socket.socket(fileno=fd)
        if listen.type != socket.SOCK_STREAM:
            raise OSError("not a stream socket")
    except OSError as e:
        log("started as a loader worker but fd %d is not a listening socket: %s" % (fd, e))
        return 2
    os.environ.pop("SPAWNPOINT_LOADER_LISTEN_FD", None)  # programs the dataset starts
    os.set_inheritable(fd, False)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # whole, prompt lines to the pool's pipe
    # The start-up's imports run in a thread at idle CPU priority: while the rank it serves
    # starts on the same CPUs, they take only the time it leaves idle (its waits, and the
    # wait for its first batch), and spare CPUs, never the rank's own. Once the rank waits
    # for this worker, though, idle priority must not leave it waiting on other processes:
    # a start-up that then mostly waits for a CPU starts over at normal priority (an idle
    # thread cannot be raised again without CAP_SYS_NICE), said once.
    idle = _preload.at_idle_priority(os.environ, _preload.PRIORITY_ENV)

    def prepare():
        if idle:
            _preload.idle_priority()
        _preload.wait_for_turn(os.environ)
        _preload.preload(os.environ)
        _byvalue.cloudpickle()  # what unpickles the rank's loaders (~40 ms): not at the first batch
        _preload.close_env_fd(os.environ, _preload.STARTED_FD_ENV)  # the next worker's turn

    preparing = threading.Thread(target=prepare, name="spawnpoint-worker-preload", daemon=True)
    preparing.start()
    watch = _preload.StarvedWhileAwaited(fd, preparing.native_id) if idle else None
    while preparing.is_alive():
        preparing.join(STARVE_CHECK_S)
        if watch is not None and preparing.is_alive() and watch.starved():
            log("worker %s: the rank waits for it and its start-up imports, at idle CPU "
                "priority, waited for a CPU more than %d %% of %g s (other processes keep "
                "them busy): they start over at normal priority"
                % (started_with.get("SPAWNPOINT_LOADER_WORKER_ID", "?"),
                   max(0, round(_preload.STARVED_SHARE * 100)), _preload.STARVED_WINDOW_S))
            restart_at_normal_priority(started_with, fd)
    Worker(listen, env_int("SPAWNPOINT_LOADER_WORKER_ID", 0),
           env_int("SPAWNPOINT_LOADER_RANK", 0),
           env_int("SPAWNPOINT_LOADER_INCARNATION", 0)).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
