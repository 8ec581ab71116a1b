"""Two ranks on two local nodes: node 0's rank is SIGKILLed, node 1's rank then fails as gloo
does when its peer vanishes. argv: <dir> <order>. The order says which node agent the agent
that runs both hears from first:

  cause-first        node 0's agent reports the kill before node 1's rank says anything;
  consequence-first  node 1's agent reports the gloo error first: a child of rank 0 that
                     ignores SIGTERM holds node 0's agent until node 1's agent is gone, and
                     rank 1 fails only once node 0's agent has recorded the kill;
  race               rank 1 fails as soon as rank 0 is gone.

A restarted attempt (TORCHELASTIC_RESTART_COUNT > 0) succeeds. No torch: files in <dir> are
the only rendezvous.
"""
import os
import signal
import subprocess
import sys
import time

GLOO = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
        "Connection closed by peer [127.0.0.1]:29500")
DEADLINE = time.monotonic() + 60


def path(name):
    return os.path.join(sys.argv[1], name)


def wait_for(condition):
    while not condition():
        if time.monotonic() > DEADLINE:
            sys.exit("timed out")
        time.sleep(0.01)


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def write(name, text):
    with open(path(name) + ".tmp", "w") as f:
        f.write(text)
    os.rename(path(name) + ".tmp", path(name))


def read_pid(name):
    wait_for(lambda: os.path.exists(path(name)))
    with open(path(name)) as f:
        return int(f.read())


def fail_like_gloo(*_):
    print("Traceback (most recent call last):", file=sys.stderr)
    print('  File "train.py", line 12, in <module>', file=sys.stderr)
    print(GLOO, file=sys.stderr, flush=True)
    os._exit(1)


HOLD = """
import os, signal, sys, time
def on_term(*_):
    open(sys.argv[1] + '/held-term', 'w').close()
signal.signal(signal.SIGTERM, on_term)
open(sys.argv[1] + '/held-ready', 'w').close()
agent1 = int(sys.argv[2])
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        os.kill(agent1, 0)
    except ProcessLookupError:
        break
    time.sleep(0.01)
"""


def main():
    order = sys.argv[2]
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        print("rank %s: attempt 2 runs" % os.environ["RANK"])
        return
    if os.environ["RANK"] == "1":
        signal.signal(signal.SIGTERM, fail_like_gloo)
        write("agent1.pid", str(os.getppid()))
        write("rank1.pid", str(os.getpid()))
        rank0 = read_pid("rank0.pid")
        wait_for(lambda: not alive(rank0))
        if order == "consequence-first":
            wait_for(lambda: os.path.exists(path("held-term")))
        elif order == "cause-first":
            agent0 = read_pid("agent0.pid")
            wait_for(lambda: not alive(agent0))
        fail_like_gloo()
    agent1 = read_pid("agent1.pid")
    write("agent0.pid", str(os.getppid()))
    if order == "consequence-first":
        subprocess.Popen([sys.executable, "-c", HOLD, sys.argv[1], str(agent1)])
        wait_for(lambda: os.path.exists(path("held-ready")))
    print("rank 0 working", flush=True)
    write("rank0.pid", str(os.getpid()))
    os.kill(os.getpid(), signal.SIGKILL)


main()
