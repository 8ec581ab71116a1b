"""A rank joins the env:// rendezvous once its store listens, not a second later.

With env:// (init_process_group's default) rank 0 starts the TCPStore server on MASTER_PORT
and every other rank connects to it. A rank whose connect is refused because rank 0 is
still importing retries after a fixed back-off of 1 s (torch 1.13 and 2.x alike), so
under a launcher that starts all ranks at once most starts lose a second. torchrun does not:
its own agent hosts the store before any rank exists. Here, a rank of node 0 other than rank
0 (GROUP_RANK 0: the store is in its own network namespace) first waits, polling the
kernel's socket tables (/proc/net/tcp and tcp6, every 5 ms, never a connection to the
store), until something listens on MASTER_PORT, and then calls torch's own
init_process_group. After `LIMIT_S` it goes ahead anyway (torch's own timeout then
applies). Other nodes' ranks and every other init_method are left alone.

`patch_init(distmod)` wraps distmod.init_process_group once; `wait_for_listener` is the pure
part (tables, clock and sleep injected). Thread-safe. The wrapper first lets _mp_spawn put back
the agent's rendezvous, where a script that spawns its own ranks set its own.
"""

import functools
import os
import time

from . import _mp_spawn

LIMIT_S = 120.0
POLL_S = 0.005
_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_LISTEN = "0A"  # TCP_LISTEN in the tables' state column


def listening_ports(texts):
    """The local ports in LISTEN state in /proc/net/tcp-format tables."""
    ports = set()
    for text in texts:
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[3] == _LISTEN and ":" in fields[1]:
                try:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
                except ValueError:
                    pass
    return ports


def _read_tables():
    texts = []
    for path in _TABLES:
        try:
            with open(path) as f:
                texts.append(f.read())
        except OSError:
            pass
    return texts


def wait_for_listener(port, read_tables=_read_tables, clock=time.monotonic, sleep=time.sleep,
                      limit_s=LIMIT_S):
    """Waits until `port` listens (True), or `limit_s` passed or the tables cannot be read
    (False)."""
    deadline = clock() + limit_s
    while True:
        texts = read_tables()
        if not texts:
            return False
        if port in listening_ports(texts):
            return True
        if clock() >= deadline:
            return False
        sleep(POLL_S)


def store_port_to_wait_for(args, kwargs, environ):
    """MASTER_PORT when this init_process_group call is an env:// rendezvous of a rank of
    node 0 other than rank 0; else None."""
    init_method = kwargs.get("init_method", args[1] if len(args) > 1 else None)
    store = kwargs.get("store", args[5] if len(args) > 5 else None)
    if store is not None or init_method not in (None, "env://"):
        return None
    # init_process_group(backend, init_method, timeout, world_size, rank, store, ...)
    rank = kwargs.get("rank", args[4] if len(args) > 4 else -1)
    if rank is None or rank == -1:
        rank = environ.get("RANK")
    if str(rank) in ("", "0", "None") or environ.get("GROUP_RANK", "0") != "0":
        return None
    try:
        port = int(environ.get("MASTER_PORT", ""))
    except ValueError:
        return None
    return port if 0 < port < 65536 else None


def patch_init(distmod):
    init = getattr(distmod, "init_process_group", None)
    if init is None or getattr(init, "_spawnpoint_waits", False):
        return

    @functools.wraps(init)
    def init_process_group(*args, **kwargs):
        _mp_spawn.before_init(args, kwargs)
        port = store_port_to_wait_for(args, kwargs, os.environ)
        if port is not None:
            wait_for_listener(port)
        return init(*args, **kwargs)

    init_process_group._spawnpoint_waits = True
    distmod.init_process_group = init_process_group
    c10d = getattr(distmod, "distributed_c10d", None)
    if c10d is not None and getattr(c10d, "init_process_group", None) is init:
        c10d.init_process_group = init_process_group
