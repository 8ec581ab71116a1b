"""Imported at train.py's top: prints once per import, and, as the test asks through the
files beside the job, fails its n-th import in this directory (STANDBY_TEST_FAIL_IMPORT:
the count) or pretends that it initialised CUDA (STANDBY_TEST_FAKE_CUDA: a file)."""
import os
import sys

print("side module imported pid=%d" % os.getpid(), flush=True)

_here = os.getcwd()
if any(name.startswith("fail-import-") for name in os.listdir(_here)):
    # Counted only where the test asked for a failure (a job's directory, never a checkout).
    _count_file = os.path.join(_here, "imports.count")
    _count = 1
    if os.path.exists(_count_file):
        with open(_count_file) as f:
            _count = int(f.read() or 0) + 1
    with open(_count_file, "w") as f:
        f.write(str(_count))
    if os.path.exists(os.path.join(_here, "fail-import-%d" % _count)):
        raise RuntimeError("side_module: import %d fails, as the test asked" % _count)
if os.path.exists(os.path.join(_here, "fake-cuda")):
    # A library that creates a CUDA context at import: torch.cuda says so from now on.
    import torch

    torch.cuda.is_initialized = lambda: True
