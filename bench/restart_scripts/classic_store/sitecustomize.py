"""In the processes bench/restart_scripts/torchrun.py starts on a torch without libuv:
TCPStore's use_libuv defaults to False (bench_classic_store.py)."""

import os

if os.environ.get("BENCH_CLASSIC_STORE") == "1":
    import bench_classic_store

    bench_classic_store.install()
