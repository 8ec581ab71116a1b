"""Free TCP ports for tests and benches that must name a port before something listens on
it (a job's rendezvous, a server started as another process). Standard library only.

A port from bind(0) is drawn from the kernel's ephemeral range, the one every concurrent
outgoing connection (gloo's, kubectl's) takes its source port from: between the check and
the bind, a connection elsewhere on the machine can take it. These ports come from below
that range, at random (tests/support/free_port.h is the same for C++).
"""

import random
import socket


def _draw_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return (10000, low) if low > 12000 else (high + 1, 65000)


def _bind_any(port):
    """A socket bound to port on every interface (IPv4 and IPv6 where there is IPv6)."""
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        address = ("::", port)
    except OSError:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        address = ("", port)
    try:
        s.bind(address)
        return s
    except OSError:
        s.close()
        return None


def free_port(consecutive=2):
    """A port P with P .. P + consecutive - 1 all free on every interface now (2 by default:
    a job's agents serve its gang on the rendezvous port + 1)."""
    first, last = _draw_range()
    rng = random.SystemRandom()
    for _ in range(1000):
        port = rng.randrange(first, last - consecutive + 1)
        held = []
        for p in range(port, port + consecutive):
            s = _bind_any(p)
            if s is None:
                break
            held.append(s)
        for s in held:
            s.close()
        if len(held) == consecutive:
            return port
    raise RuntimeError("no %d free consecutive ports in 1000 draws" % consecutive)
