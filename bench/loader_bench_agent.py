"""The agent rows of `make bench-loader` (bench/loader_bench.py drives them): our C++ loader
bench as a 1-rank job under `spawnpoint-agent run`, its loader workers the agent's pool
started with the job, with the default worker command (no loader.workerCommand: the
trainer's own program in worker mode). Two builds of the same program:

  agent-split   build/bin/spawnpoint-loader-bench, a split trainer
                (agent/loader/split_trainer.h): the executable serves as a worker without
                loading libtorch; the rank loads the torch half (a module) after exec.
  agent-linked  build/bin/spawnpoint-loader-bench-linked: one libtorch-linked executable,
                whose workers load libtorch as the rank does.

Each run writes the bench's JSON (first_batch_s: from TorchLoader::Create; and
first_batch_from_process_start_s: from the rank process's start, /proc/self/stat, 10 ms
resolution) and first_batch_from_launch_s (from the harness's spawn of the agent, BENCH_T0).
The stock DataLoader side is the Python rows' stock job of the same workload and repetition.
Standard library only.
"""

import json
import os
import shutil
import tempfile

AGENT_SPLIT = "agent-split"
AGENT_LINKED = "agent-linked"
AGENT_CONFIGS = (AGENT_SPLIT, AGENT_LINKED)
AGENT_LABELS = {
    AGENT_SPLIT: "ours under the agent, default worker command (split trainer)",
    AGENT_LINKED: "ours under the agent, default worker command (libtorch linked)",
}
AGENT_BINARIES = {AGENT_SPLIT: "spawnpoint-loader-bench",
                  AGENT_LINKED: "spawnpoint-loader-bench-linked"}

JOB = """\
apiVersion: spawnpoint.dev/v1alpha1
kind: TrainingJob
metadata: {name: %(name)s}
spec:
  nodes: 1
  gpusPerNode: 0
  procsPerNode: 1
  backend: gloo
  template:
    spec:
      containers:
        - name: trainer
          image: unused
          command: %(command)s
  loader:
    workersPerRank: %(workers)d
    prefetchFactor: %(prefetch)d
    timeoutSeconds: 120
%(loader_extra)s  restartPolicy: %(restart)s
"""


def bench_job(name, command, workers, prefetch, loader_extra="",
              restart="{maxRestarts: 0}"):
    """A 1-rank job's manifest for the bench's rows under spawnpoint-agent run; loader_extra:
    more lines under loader:, indented four spaces."""
    return JOB % {"name": name, "command": json.dumps(command), "workers": workers,
                  "prefetch": prefetch, "loader_extra": loader_extra, "restart": restart}


def agent_run(a, side, workload, tag, run, bench_error, env, short=False):
    """One job: the bench as the rank, under spawnpoint-agent run. `run` and `bench_error`
    are loader_bench.py's; `env` the environment for the agent (BENCH_T0 is added by run)."""
    agent = os.path.join(a.build_dir, "bin", "spawnpoint-agent")
    binary = os.path.join(a.build_dir, "bin", AGENT_BINARIES[side])
    args = ["--workload", workload, "--workers", str(a.workers), "--batch-size",
            str(a.batch_size), "--batches", str(4 if short else a.batches), "--epochs",
            str(2 if short else a.epochs), "--prefetch", str(a.prefetch), "--sample-floats",
            str(a.sample_floats), "--work-us", str(a.work_us)]
    tmp = tempfile.mkdtemp(prefix="bench-loader-agent-")
    try:
        out = os.path.join(tmp, "result.json")
        job = os.path.join(tmp, "job.yaml")
        with open(job, "w") as f:
            f.write(bench_job("bench-loader-" + side, [binary] + args + ["--out", out],
                              a.workers, a.prefetch))

        def result(cmd, t, p):
            if not os.path.exists(out):
                raise bench_error(f"{t}: the rank wrote no result ({out})\n"
                                  f"{p.stdout[-1500:]}\n{p.stderr[-3000:]}")
            with open(out) as f:
                r = json.load(f)
            if not r.get("agent_pool"):
                raise bench_error(f"{t}: the rank's loader did not run on the agent's pool")
            return r

        return run([agent, "run", "-f", job, "--gpu-backend", "none", "--master-port", "0"],
                   a.timeout, tag, result, env=env, cwd=tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


AGENT_ROWS = [  # key, label, unit, digits
    ("first_batch_from_process_start_s", "rank process start → first batch", " s", 3),
    ("first_batch_s", "creating the loader → first batch (ours: TorchLoader::Create; stock: "
     "iter(), which spawns its workers)", " s", 3),
    ("first_batch_from_launch_s", "`spawnpoint-agent run` → first batch", " s", 3),
    ("batches_per_s", "steady batches/s (epochs 2+, boundaries included)", "", 1),
    ("peak_rss_mb", "peak memory, rank + loader workers (sum of VmHWM)", " MiB", 0),
    ("other_cpus", "other processes' CPU use during the run (not ours)", " CPUs", 2),
]
# The stock DataLoader job's names for the same measures.
STOCK_KEYS = {"first_batch_s": "first_batch_from_iter_s"}


def agent_table(a, workloads, vals, ratio, fmt, worded, stock):
    """Prints the agent rows' table: each configuration against `stock` (the Python rows'
    stock DataLoader job of the same workload and repetition)."""
    print()
    print("| workload | metric | " + " | ".join(AGENT_LABELS[c] for c in AGENT_CONFIGS) +
          " | stock DataLoader (spawn, persistent) under the agent | ratio, split | "
          "ratio, linked |")
    print("|" + " --- |" * 7)
    for w in workloads:
        for key, label, unit, digits in AGENT_ROWS:
            skey = STOCK_KEYS.get(key, key)
            cells = [fmt(vals(w, c, key), unit, digits) for c in AGENT_CONFIGS]
            theirs = vals(w, stock, skey)
            if key == "other_cpus":
                rs = ["", ""]
            elif key == "batches_per_s":
                rs = [worded(ratio(w, c, key, skey, "ours/theirs"), "faster")
                      for c in AGENT_CONFIGS]
            else:
                word = "less" if key == "peak_rss_mb" else "sooner"
                rs = [worded(ratio(w, c, key, skey, "theirs/ours"), word) for c in AGENT_CONFIGS]
            print(f"| {w} | {label} | " + " | ".join(cells) +
                  f" | {fmt(theirs, unit, digits)} | " + " | ".join(rs) + " |")
    print()
    print(f"Median (min–max) of {a.repeats} repetitions, each a 1-rank job under "
          f"spawnpoint-agent run with {a.workers} workers of the agent's pool (started before "
          f"the rank); ratios: median of the per-repetition ratios against the stock "
          f"DataLoader job of the same repetition (the Python rows).")
