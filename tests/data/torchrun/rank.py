"""A rank started from a torchrun command: says who it is and whether torchrun is around.

Prints one line: "rank R of W local L port P parent_torchrun=B torchrun_in_job=N argv=[...]".
parent_torchrun: the parent's command line names torchrun; torchrun_in_job: processes under
the agent (its descendants, the agent itself excluded) whose command line names torchrun.
"""
import os
import sys

MODULES = (b"torch.distributed.run", b"torch.distributed.launch")


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def is_torchrun(argv):
    """torchrun by name (/usr/bin/torchrun, python3 /usr/bin/torchrun) or as python -m."""
    return any(os.path.basename(arg) == b"torchrun" or arg in MODULES for arg in argv)


def parent_of(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def agent_pid():
    pid = os.getppid()
    while pid > 1:
        argv = cmdline(pid)
        if argv and os.path.basename(argv[0]) == b"spawnpoint-agent":
            return pid
        pid = parent_of(pid)
    return 0


def torchrun_in_job(agent):
    found = 0
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == agent:
            continue
        pid = int(name)
        ancestor = parent_of(pid)
        while ancestor > 1 and ancestor != agent:
            ancestor = parent_of(ancestor)
        if ancestor == agent and is_torchrun(cmdline(pid)):
            found += 1
    return found


def main():
    agent = agent_pid()
    print(
        f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} "
        f"local {os.environ['LOCAL_RANK']} port {os.environ['MASTER_PORT']} "
        f"agent_found={agent > 0} "
        f"parent_torchrun={is_torchrun(cmdline(os.getppid()))} "
        f"torchrun_in_job={torchrun_in_job(agent) if agent else -1} argv={sys.argv[1:]}",
        flush=True,
    )


if __name__ == "__main__":
    main()
