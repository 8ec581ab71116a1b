"""A first start step by step: launch -> each of the first 20 training steps of
restart_scripts/ddp_steps.py (2 CPU ranks, gloo, torch + torchvision, 2 DataLoader workers),
under spawnpoint-agent at its defaults and under torchrun of the same torch at its defaults,
same machine, runs interleaved. restart_vs_torchrun.py measures the first step only; this
shows how soon each launcher reaches steady training (the second step needs the second
loader worker, the twentieth the steady state). Prints a table of medians (min-max) and last

    ratios step1=A step2=B step5=C step20=D

each ours over torchrun's (below 1: ours is there sooner). Run it with the interpreter whose
torch it compares (in the frameworks environment: bench/README.md).

    python bench/first_steps.py --agent build/bin/spawnpoint-agent [--reps 3]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from restart_vs_torchrun import JOB, TORCHRUN  # noqa: E402  (the same job and torchrun)

TRAINER = os.path.join(HERE, "restart_scripts", "ddp_steps.py")
SHOWN = (1, 2, 3, 5, 10, 20)
TIMEOUT_S = 600


def run_once(launcher, agent):
    """{step: launch -> the last rank's step done, seconds}."""
    with tempfile.TemporaryDirectory(prefix="spawnpoint-first-steps-") as tmp:
        out = os.path.join(tmp, "steps")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPAWNPOINT_")}
        env["STEPS_OUT"] = out
        env.setdefault("USE_LIBUV", "0")  # as restart_vs_torchrun.py: Debian's torch has none
        command = [sys.executable, TRAINER]
        if launcher == "ours":
            with open(os.path.join(tmp, "job.yaml"), "w") as f:
                f.write(JOB % (0, 2, json.dumps(command)))  # maxRestarts 1: standbys too
            argv = [agent, "run", "-f", os.path.join(tmp, "job.yaml"), "--master-port", "0",
                    "--gpu-backend", "none", "--metrics-addr", "off"]
        else:
            argv = [sys.executable, TORCHRUN, "--standalone", "--nproc_per_node", "2",
                    "--redirects", "1", "--tee", "1", TRAINER]
        start = time.time()
        proc = subprocess.run(argv, cwd=tmp, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, universal_newlines=True,
                              timeout=TIMEOUT_S)
        steps = {}
        if os.path.exists(out):
            with open(out) as f:
                for line in f:
                    step, wall = line.split()[1], line.split("wall=")[1]
                    steps[int(step)] = float(wall) - start
        if proc.returncode != 0 or 20 not in steps:
            raise RuntimeError("%s failed (exit %d):\n%s" % (launcher, proc.returncode,
                                                             proc.stdout[-3000:]))
        return steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agent", required=True)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    runs = {"ours": [], "torchrun": []}
    for rep in range(args.reps):
        for launcher in ("ours", "torchrun"):
            for attempt in range(3):  # torchrun's gloo start fails now and then here
                try:
                    steps = run_once(launcher, args.agent)
                    break
                except RuntimeError as err:
                    print("%s: run again: %s" % (launcher, str(err).splitlines()[0]), flush=True)
            else:
                sys.exit("first_steps: %s failed 3 times" % launcher)
            runs[launcher].append(steps)
            print("rep %d %s: %s" % (rep + 1, launcher, " ".join(
                "%d:%.2f" % (s, steps[s]) for s in SHOWN)), flush=True)
    import torch

    print("\ntorch %s, Python %s, %d CPUs; launch -> the last rank's step, medians (min-max) "
          "of %d runs\n" % (torch.__version__, sys.version.split()[0], os.cpu_count(),
                            args.reps))
    print("| step | spawnpoint-agent (defaults) | torchrun (defaults) | difference |")
    print("| --- | --- | --- | --- |")
    medians = {}
    for s in SHOWN:
        cells = []
        for launcher in ("ours", "torchrun"):
            values = [r[s] for r in runs[launcher]]
            medians[(launcher, s)] = statistics.median(values)
            cells.append("%.2f s (%.2f-%.2f)" % (medians[(launcher, s)], min(values),
                                                 max(values)))
        diff = medians[("ours", s)] - medians[("torchrun", s)]
        print("| %d | %s | %s | %+.2f s |" % (s, cells[0], cells[1], diff))
    print("ratios " + " ".join("step%d=%.2f" % (s, medians[("ours", s)] / medians[("torchrun", s)])
                               for s in (1, 2, 5, 20)))


if __name__ == "__main__":
    main()
