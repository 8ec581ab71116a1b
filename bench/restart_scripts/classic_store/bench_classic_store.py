"""TCPStore's use_libuv defaulting to False, for bench/restart_vs_torchrun.py's torchrun on a
torch built without libuv (Debian 13's 2.6): see ../torchrun.py."""


def install():
    import torch.distributed as dist

    original = dist.TCPStore
    if getattr(original, "_bench_classic", False):
        return

    class TCPStore(original):
        _bench_classic = True

        def __init__(self, *args, **kwargs):
            kwargs.setdefault("use_libuv", False)
            super().__init__(*args, **kwargs)

    dist.TCPStore = TCPStore
    import sys

    import torch.distributed.rendezvous  # noqa: F401  (the module; the package's attribute
    # of that name is its rendezvous() function)
    sys.modules["torch.distributed.rendezvous"].TCPStore = TCPStore
