"""Two ranks on two local nodes: node 0's rank is SIGKILLed, node 1's rank then fails as gloo
does when its peer vanishes. argv: <dir> <order>. The order says which node agent the agent
that runs both hears from first:

  cause-first        node 0's agent reports the kill before node 1's rank says anything;
  consequence-first  node 1's agent reports the gloo error first: a helper outside node 0's
                     process group stops node 0's agent (SIGSTOP), kills rank 0, and lets
                     node 0's agent go on (SIGCONT) only once node 1's report waits unread
                     on the gang coordinator's socket, which node 0's agent holds;
  race               rank 1 fails as soon as rank 0 is gone.

A restarted attempt (TORCHELASTIC_RESTART_COUNT > 0) succeeds. No torch: files in <dir> are
the only rendezvous.
"""
import os
import signal
import subprocess
import sys
import time

from two_nodes import alive, fail_like_gloo, path, read_pid, wait_for, write


HELPER = """
import os, signal, sys, time
agent0, rank0, done = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
deadline = time.monotonic() + 60


def sockets(pid):
    inodes = set()
    for fd in os.listdir('/proc/%d/fd' % pid):
        try:
            target = os.readlink('/proc/%d/fd/%s' % (pid, fd))
        except OSError:
            continue
        if target.startswith('socket:['):
            inodes.add(target[8:-1])
    return inodes


def unread_bytes(pid):
    # /proc/net/tcp{,6}: field 4 is tx_queue:rx_queue in hex, field 9 the socket's inode.
    mine, total = sockets(pid), 0
    for table in ('/proc/net/tcp', '/proc/net/tcp6'):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[9] in mine:
                    total += int(fields[4].split(':')[1], 16)
    return total


def stopped(pid):
    # SIGSTOP takes effect as each thread next runs: on a loaded machine, later.
    for task in os.listdir('/proc/%d/task' % pid):
        with open('/proc/%d/task/%s/stat' % (pid, task)) as f:
            if f.read().rsplit(')', 1)[1].split()[0] != 'T':
                return False
    return True


os.kill(agent0, signal.SIGSTOP)
try:
    while not stopped(agent0) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(rank0, signal.SIGKILL)
    open(done, 'w').close()
    # Node 0's agent is stopped, so nothing else reaches its sockets: the bytes that wait
    # there are node 1's report of its rank's gloo error.
    while unread_bytes(agent0) == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
finally:
    os.kill(agent0, signal.SIGCONT)
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
        if order == "consequence-first":
            wait_for(lambda: os.path.exists(path("rank0-killed")))  # a zombie till agent 0 runs
        else:
            wait_for(lambda: not alive(rank0))
        if order == "cause-first":
            agent0 = read_pid("agent0.pid")
            wait_for(lambda: not alive(agent0))
        fail_like_gloo()
    read_pid("agent1.pid")
    write("agent0.pid", str(os.getppid()))
    print("rank 0 working", flush=True)
    write("rank0.pid", str(os.getpid()))
    if order == "consequence-first":
        subprocess.Popen([sys.executable, "-c", HELPER, str(os.getppid()), str(os.getpid()),
                          path("rank0-killed")], start_new_session=True)
        time.sleep(60)  # killed by the helper
    os.kill(os.getpid(), signal.SIGKILL)


main()
