"""A trainer-like script the shim tests run as a separate process (never imported by them).

    shim_probe.py workers SPEC_JSON   build the DataLoaders SPEC_JSON describes, iterate
                                      each for its epochs and report what every sample's
                                      worker saw about itself
    shim_probe.py args                build DataLoaders under many job settings without
                                      starting workers and report their attributes

The result is one JSON document on stdout's last line. Everything except the dataset's
__getitem__ runs under the __main__ guard, as spawn requires.
"""

import json
import os
import sys
import warnings

import torch
import torch.multiprocessing
from torch.utils.data import DataLoader, Dataset, IterableDataset

# Set in the parent by main() after start-up. A forked worker inherits the parent's memory
# and sees it; a spawned worker is a fresh interpreter that re-imported this file and does
# not.
STATE = {"set_by_parent": False}


def _own_cmdline():
    with open("/proc/self/cmdline", "rb") as f:
        return f.read().split(b"\0")


class ProbeDataset(Dataset):
    """Each sample is a JSON report about the process that produced it."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        import multiprocessing

        info = torch.utils.data.get_worker_info()
        shim = sys.modules.get("sitecustomize")
        cmdline = _own_cmdline()
        inner = None
        if os.environ.get("PROBE_INNER_LOADER") == "1":
            # A DataLoader built inside a loader worker (a daemonic process, which may not
            # have children) must not get the job's workers.
            inner = DataLoader(list(range(2))).num_workers
        return json.dumps({
            "index": index,
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "worker_id": None if info is None else info.id,
            "inherited_parent_state": STATE["set_by_parent"],
            # A spawned worker is a new process image: python -c 'from multiprocessing.spawn
            # import spawn_main; ...' --multiprocessing-fork. A forked one keeps the parent's.
            "exec_spawn_main": any(b"spawn_main" in arg for arg in cmdline),
            "start_method": multiprocessing.get_start_method(allow_none=True),
            "main_module": getattr(sys.modules.get("__main__"), "__name__", None),
            "shim_file": None if shim is None else os.path.realpath(shim.__file__),
            "shim_active": bool(getattr(shim, "shim_active", False)),
            "inner_loader_workers": inner,
        })


class ProbeStream(IterableDataset):
    def __iter__(self):
        return iter(range(4))


class Unpicklable(Dataset):
    def __init__(self):
        self.transform = lambda x: x * 10  # spawn cannot pickle this; fork never needed to

    def __len__(self):
        return 4

    def __getitem__(self, index):
        return self.transform(index)


def run_workers(spec):
    result = {"pid": os.getpid(), "loaders": []}
    for loader_spec in spec["loaders"]:
        kwargs = dict(loader_spec.get("kwargs", {}))
        args = [ProbeDataset(loader_spec.get("samples", 4))] + loader_spec.get("args", [])
        loader = DataLoader(*args, **kwargs)
        epochs = []
        for _ in range(loader_spec.get("epochs", 2)):
            epochs.append([json.loads(sample) for sample in loader])
        result["loaders"].append({
            "num_workers": loader.num_workers,
            "persistent_workers": loader.persistent_workers,
            "context": _context_name(loader),
            "epochs": epochs,
        })
        del loader
    return result


def _context_name(loader):
    ctx = loader.multiprocessing_context
    return None if ctx is None else ctx.get_start_method()


def _describe(loader):
    return {
        "batch_size": loader.batch_size,
        "num_workers": loader.num_workers,
        "context": _context_name(loader),
        "persistent_workers": loader.persistent_workers,
        "prefetch_factor": loader.prefetch_factor,
        "timeout": loader.timeout,
        "pin_memory": loader.pin_memory,
    }


JOB_VARIABLES = ("SPAWNPOINT_LOADER_WORKERS", "SPAWNPOINT_LOADER_CPUS",
                 "SPAWNPOINT_LOADER_PERSISTENT_WORKERS", "SPAWNPOINT_LOADER_PREFETCH_FACTOR",
                 "SPAWNPOINT_LOADER_TIMEOUT_SECONDS", "SPAWNPOINT_LOADER_PIN_MEMORY")


def _job(**settings):
    """Makes os.environ hold exactly these job settings (the shim reads them per loader)."""
    for name in JOB_VARIABLES:
        os.environ.pop(name, None)
    for key, value in settings.items():
        os.environ["SPAWNPOINT_LOADER_" + key.upper()] = str(value)


def _scenario(fn):
    """Runs one scenario: its result, the warnings it raised and the loaders it built."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value = fn()
        except Exception as err:  # reported, so a test can assert on it
            value = {"error": type(err).__name__, "message": str(err),
                     "cause": None if err.__cause__ is None else repr(err.__cause__)}
    return {
        "value": value,
        "warnings": [{"category": w.category.__name__, "message": str(w.message),
                      "file": os.path.basename(w.filename)} for w in caught
                     if not str(w.message).startswith("This DataLoader will create")],
    }


def run_args():
    ds = ProbeDataset(8)
    scenarios = {}

    def add(name, job, fn):
        _job(**job)
        scenarios[name] = _scenario(fn)

    add("no_job_workers", {}, lambda: _describe(DataLoader(ds)))
    add("job_workers", {"workers": 2, "prefetch_factor": 3, "timeout_seconds": 30},
        lambda: _describe(DataLoader(ds, batch_size=4)))
    add("job_workers_explicit_zero", {"workers": 2}, lambda: _describe(DataLoader(ds, num_workers=0)))
    add("positional_workers", {"workers": 5},
        lambda: _describe(DataLoader(ds, 2, False, None, None, 3)))
    add("positional_zero_workers", {"workers": 2},
        lambda: _describe(DataLoader(ds, 2, False, None, None, 0, None, False, False, 7.5)))
    add("code_workers_without_job", {}, lambda: _describe(DataLoader(ds, num_workers=2)))
    add("explicit_fork", {"workers": 2},
        lambda: _describe(DataLoader(ds, multiprocessing_context="fork")))
    add("explicit_fork_context_object", {},
        lambda: _describe(DataLoader(ds, num_workers=2, multiprocessing_context=
                                     torch.multiprocessing.get_context("fork"))))
    add("explicit_not_persistent", {"workers": 2}, lambda: _describe(DataLoader(ds, persistent_workers=False)))
    add("explicit_prefetch_timeout", {"workers": 2, "prefetch_factor": 6, "timeout_seconds": 30},
        lambda: _describe(DataLoader(ds, prefetch_factor=2, timeout=0)))
    add("pin_memory_untouched", {"workers": 2, "pin_memory": 1}, lambda: _describe(DataLoader(ds)))
    add("job_not_persistent", {"workers": 2, "persistent_workers": 0}, lambda: _describe(DataLoader(ds)))
    add("job_persistent", {"workers": 2, "persistent_workers": 1}, lambda: _describe(DataLoader(ds)))
    add("auto_small", {"workers": "auto", "cpus": 3}, lambda: _describe(DataLoader(ds)))
    add("auto_large", {"workers": "auto", "cpus": 20}, lambda: _describe(DataLoader(ds)))
    add("auto_affinity", {"workers": "auto"},
        lambda: dict(_describe(DataLoader(ds)), affinity=len(os.sched_getaffinity(0))))
    add("iterable_dataset", {"workers": 2}, lambda: _describe(DataLoader(ProbeStream())))
    add("invalid_job_values", {"workers": "lots", "prefetch_factor": 0},
        lambda: [_describe(DataLoader(ds)), _describe(DataLoader(ds, num_workers=1))])
    add("wrong_call", {"workers": 2}, lambda: _describe(DataLoader(ds, no_such_argument=1)))

    def signature():
        import inspect
        return {"wrapped": [str(p) for p in inspect.signature(DataLoader.__init__).parameters.values()],
                "original": [str(p) for p in inspect.signature(
                    inspect.unwrap(DataLoader.__init__)).parameters.values()],
                "patched": DataLoader.__init__ is not inspect.unwrap(DataLoader.__init__)}
    add("signature", {}, signature)

    def subclass():
        class Sub(DataLoader):
            def __init__(self, dataset, **kwargs):
                super().__init__(dataset, batch_size=2, **kwargs)
        return _describe(Sub(ds))
    add("subclass", {"workers": 2}, subclass)

    # Spawned workers must pickle the dataset; these fail before any process is started.
    add("unpicklable_job_workers", {"workers": 2},
        lambda: [int(x) for x in DataLoader(Unpicklable(), batch_size=None)])
    add("unpicklable_code_workers", {"workers": 2},
        lambda: [int(x) for x in DataLoader(Unpicklable(), batch_size=None, num_workers=2)])

    _job()
    return {"pid": os.getpid(), "scenarios": scenarios}


def main():
    STATE["set_by_parent"] = True
    mode = sys.argv[1]
    if mode == "workers":
        result = run_workers(json.loads(sys.argv[2]))
    elif mode == "args":
        result = run_args()
    else:
        raise SystemExit("unknown mode " + mode)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
