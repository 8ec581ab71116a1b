"""`python -m torch.distributed.run ARGS`, for bench/restart_vs_torchrun.py, with one change
where this torch needs it: Debian 13's torch 2.6 is built without libuv, yet since 2.4 the
TCPStore that torchrun's own rendezvous makes, and the ranks' clients of it, ask for libuv
(neither reads USE_LIBUV, as init_process_group's own store does), so torchrun cannot run a
job at all. Here TCPStore's use_libuv then defaults to False, in torchrun and in its ranks;
with a torch that has libuv (or predates it) nothing changes."""

import datetime
import runpy
import sys

import torch.distributed as dist


def _needs_classic_store():
    try:
        dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=10),
                      wait_for_workers=False, use_libuv=True)
    except TypeError:  # no use_libuv argument: a torch before libuv
        return False
    except Exception as err:
        return "without libuv" in str(err)
    return False


if _needs_classic_store():
    # This process and every one it starts (the ranks) get the classic store by default,
    # through classic_store/sitecustomize.py, which patches TCPStore before anything uses it.
    import os

    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "classic_store")
    os.environ["BENCH_CLASSIC_STORE"] = "1"
    os.environ["PYTHONPATH"] = here + os.pathsep + os.environ.get("PYTHONPATH", "")
    sys.path.insert(0, here)
    import bench_classic_store

    bench_classic_store.install()  # before torchrun's rendezvous modules import TCPStore

sys.argv[0] = "torchrun"
runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
