"""Launch to the first batch: bench/first_batch_trainer.py (what imagenet/main.py --dummy does
up to its first training batch: torchvision's imports, resnet18 in DDP, FakeData, a
DataLoader with -j workers) as 2 CPU ranks on gloo, started three ways on this machine:

  ours         spawnpoint-agent run -f <manifest>, the job at its defaults (no loader or
               stall section): the agent's loader pool, grown to -j, serves the DataLoader
  torchrun     python3 -m torch.distributed.run, the DataLoader's workers forked (Linux's
               default start method)
  torchrun+spawn  the same with multiprocessing_context='spawn' (what a torchrun user does
               to keep CUDA safe)

Each run is timed from the launcher's spawn to the last rank's first batch in hand (the
ranks print time.time() then; the harness takes its own before the launch). Repetitions are
interleaved. Prints a table of medians (min-max) and, last, `ratios fork=X spawn=Y`: the
torchrun figure over ours (above 1: ours reaches the first batch sooner).

    python3 bench/first_batch_bench.py [--build build] [--reps 5] [-j 4]
"""

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TRAINER = os.path.join(HERE, "first_batch_trainer.py")
PYTHON = "/usr/bin/python3"  # Debian's, with torch and torchvision (scripts/install-deps.sh)
FIRST = re.compile(r"first-batch rank=(\d+) wall=([0-9.]+)")

JOB = """\
apiVersion: spawnpoint.dev/v1alpha1
kind: TrainingJob
metadata: {name: first-batch}
spec:
  nodes: 1
  gpusPerNode: 0
  procsPerNode: 2
  template:
    spec:
      containers:
        - name: trainer
          image: unused
          command: %s
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_environment():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SPAWNPOINT_") and k not in ("PYTHONPATH",)}
    env["OMP_NUM_THREADS"] = "1"  # what torchrun sets for 2 ranks, and the agent too
    return env


def command(kind, args, build, tmp):
    trainer = [PYTHON, TRAINER, "-j", str(args.workers)]
    if kind == "ours":
        job = os.path.join(tmp, "job.yaml")
        with open(job, "w") as f:
            f.write(JOB % json.dumps(trainer))
        return [os.path.join(build, "bin", "spawnpoint-agent"), "run", "-f", job,
                "--gpu-backend", "none", "--master-port", "0"]
    cmd = [PYTHON, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
           "-r", "1", "-t", "1", "--master_port", str(free_port()), "--monitor_interval", "0.1",
           TRAINER, "-j", str(args.workers)]
    return cmd + (["--context", "spawn"] if kind == "spawn" else [])


def run_once(kind, args, build):
    with tempfile.TemporaryDirectory(prefix="spawnpoint-first-batch-") as tmp:
        cmd = command(kind, args, build, tmp)
        start = time.time()
        proc = subprocess.run(cmd, cwd=tmp, env=clean_environment(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, universal_newlines=True, timeout=600)
    firsts = {int(m.group(1)): float(m.group(2)) for m in FIRST.finditer(proc.stdout)}
    if proc.returncode != 0 or sorted(firsts) != [0, 1]:
        sys.exit("%s failed (exit %d):\n%s" % (kind, proc.returncode, proc.stdout[-4000:]))
    return max(firsts.values()) - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("-j", "--workers", type=int, default=4, help="the script's -j (main.py: 4)")
    args = parser.parse_args()
    kinds = ("ours", "fork", "spawn")
    names = {"ours": "spawnpoint-agent (defaults)", "fork": "torchrun (fork workers)",
             "spawn": "torchrun (spawn workers)"}
    times = {k: [] for k in kinds}
    for rep in range(args.reps):
        for kind in kinds:
            times[kind].append(run_once(kind, args, args.build))
        print("rep %d: %s" % (rep + 1, "  ".join("%s %.2f s" % (k, times[k][-1]) for k in kinds)),
              flush=True)
    print("\n| launch → first batch on both ranks (-j %d, 2 CPU ranks) | median (min–max) |"
          % args.workers)
    print("| --- | --- |")
    for kind in kinds:
        t = times[kind]
        print("| %s | %.2f s (%.2f–%.2f) |" % (names[kind], statistics.median(t), min(t), max(t)))
    ours = statistics.median(times["ours"])
    print("ratios fork=%.2f spawn=%.2f" % (statistics.median(times["fork"]) / ours,
                                          statistics.median(times["spawn"]) / ours))


if __name__ == "__main__":
    main()
