#!/usr/bin/python3
"""spawnpoint's loader vs PyTorch's DataLoader (spawn, persistent workers), same machine.

Runs, interleaved per repetition and workload, three configurations:
  ours, worker binary: build/bin/spawnpoint-loader-bench with LoaderOptions::worker_command
      = build/bin/spawnpoint-loader-bench-worker (a worker without libtorch: the job's
      loader.workerCommand);
  ours, own command:   build/bin/spawnpoint-loader-bench whose workers re-run the program
      itself (libtorch-linked) in worker mode: the product default;
  PyTorch:             bench/loader_reference.py (torch.utils.data.DataLoader with
      multiprocessing_context="spawn", persistent_workers=True).
Same workloads (transfer, compute), batch size, batches per epoch, epochs, worker count and
prefetch factor on all sides; every run must deliver every batch (the checksum of batch[0, 0]
over all batches must be the expected one on every side). Standard library only.

The machine may be shared: for every run the harness records how many CPUs other processes
kept busy meanwhile (/proc/stat minus the CPU time of the run's own process tree), and
repeats a run disturbed by more than --max-other-cpu (once by default, while within
--budget seconds), keeping the less disturbed attempt; the same rule for every side.

Prints progress lines, a Markdown table of medians (min-max) and, as the last line,
  ratios first_batch=X transfer=Y compute=Z epoch_boundary_ms=W
for the worker-binary configuration: X = PyTorch's first batch time / ours (the smaller
ratio of the two workloads), Y and Z = our steady batches/s / PyTorch's (every ratio is the
median of the per-repetition ratios: a repetition runs all sides back to back, under the
same load), W = our time lost at an epoch boundary in ms (the larger of the two workloads'
medians, like-for-like: epoch_boundary_matched_ms, see bench/loader_reference.py).

The Python rows (skip them with --no-python; --python-only runs only them): the same trainer
script, bench/python_pool_bench.py, run as a 1-rank job under `spawnpoint-agent run` with
the agent's loader pool (loader.pythonPool: true) and without it (pythonPool: false: stock
DataLoader(multiprocessing_context="spawn", persistent_workers=True)), with the same worker
count, prefetch factor and workloads (transfer and compute as above, and a torchvision
pipeline), and a gang restart in every run (restartPolicy maxRestarts 1, backoffSeconds 0).
They add to the ratios line
  py_first_batch=X py_transfer=Y py_compute=Z py_epoch_boundary_ms=W
X = stock's time from iter() to the first batch / the pool's (the smaller of the transfer
and compute workloads' ratios), Y and Z = the pool's steady batches/s / stock's, W = the
pool's time lost at an epoch boundary in ms (the larger of the transfer and compute
workloads' medians; the torchvision workload's figures are in the table).
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from loader_bench_agent import AGENT_CONFIGS, AGENT_LABELS, agent_run, bench_job
from loader_bench_report import (LABELS, OURS_BIN, OURS_LINKED, OURS_SELF, PY_CONFIGS, PY_LABELS,
                                 PY_POOL, PY_STOCK, THEIRS, WORKLOADS, report)

PYTHON = "/usr/bin/python3"
# The Python rows: bench/python_pool_bench.py under spawnpoint-agent run.
PY_WORKLOADS = ("transfer", "compute", "torchvision")
PY_SERVED = {PY_POOL: "_PoolDataLoaderIter", PY_STOCK: "_MultiProcessingDataLoaderIter"}


class BenchError(Exception):
    pass


def expected_checksum(batch_size, batches, epochs):
    # batch[0, 0] is the index of the batch's first sample (shuffle off): b * batch_size.
    return float(epochs * batch_size * batches * (batches - 1) // 2)


def machine_busy_s():
    """CPU seconds the whole machine has been busy (steal included: the VM lost the CPU)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = v
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_s():
    """CPU seconds of this harness and every child it reaped (a run's workers included:
    each side's main process reaps its own workers)."""
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def json_line(cmd, tag, p):
    """The result of a C++ or reference run: the last JSON line on its stdout."""
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if not lines:
        raise BenchError(f"{tag}: no JSON result on stdout: {' '.join(cmd)}\n{p.stdout[-2000:]}"
                         f"\n{p.stderr[-2000:]}")
    return json.loads(lines[-1])


def run(cmd, timeout, tag, result_of=json_line, env=None, cwd=None):
    """Runs `cmd` and returns result_of(cmd, tag, the CompletedProcess) plus wall_s and
    other_cpus. For a Python job, `env` carries BENCH_T0 (CLOCK_MONOTONIC, taken here just
    before the spawn)."""
    t0 = time.monotonic()
    busy0, own0 = machine_busy_s(), own_cpu_s()
    if env is not None:
        env = dict(env, BENCH_T0=repr(time.monotonic()))
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=timeout, env=env, cwd=cwd)
    except subprocess.TimeoutExpired as e:
        err = e.stderr or ""
        if isinstance(err, bytes):
            err = err.decode("utf-8", "replace")
        raise BenchError(f"{tag}: no result within {timeout:.0f} s: {' '.join(cmd)}\n"
                         f"{err[-3000:]}")
    wall = time.monotonic() - t0
    # CPU the rest of the machine used meanwhile, in CPUs: other work on a shared machine
    # slows whichever side it happens to overlap.
    foreign = max(0.0, (machine_busy_s() - busy0) - (own_cpu_s() - own0)) / max(wall, 1e-3)
    if p.returncode != 0:
        raise BenchError(f"{tag}: exit code {p.returncode}: {' '.join(cmd)}\n"
                         f"{p.stdout[-1500:]}\n{p.stderr[-3000:]}")
    result = result_of(cmd, tag, p)
    result["wall_s"] = wall
    result["other_cpus"] = foreign
    return result


def measure(a, once, t_start):
    """Runs once() (a run: its result); while other processes kept more than --max-other-cpu
    CPUs busy during the run, runs it again (at most --retries times, within --budget
    seconds) and keeps the least disturbed attempt. The same rule for every side."""
    best = None
    for attempt in range(1 + a.retries):
        r = once()
        r["attempts"] = attempt + 1
        if best is None or r["other_cpus"] < best["other_cpus"]:
            best = r
        if best["other_cpus"] <= a.max_other_cpu:
            break
        if time.monotonic() - t_start > a.budget:
            break
        time.sleep(1.0)  # let a short burst of other work pass
    best["attempts"] = attempt + 1
    return best


def common_args(a, workload):
    return ["--workload", workload, "--workers", str(a.workers), "--batch-size",
            str(a.batch_size), "--batches", str(a.batches), "--epochs", str(a.epochs),
            "--prefetch", str(a.prefetch), "--sample-floats", str(a.sample_floats),
            "--work-us", str(a.work_us)]


def commands(a, workload):
    bench = os.path.join(a.build_dir, "bin", "spawnpoint-loader-bench")
    worker = os.path.join(a.build_dir, "bin", "spawnpoint-loader-bench-worker")
    args = common_args(a, workload)
    return {
        OURS_BIN: [bench] + args + ["--worker-command", os.path.abspath(worker)],
        OURS_SELF: [bench] + args,
        OURS_LINKED: [bench + "-linked"] + args,
        THEIRS: [PYTHON, os.path.join(a.source_dir, "bench", "loader_reference.py")] + args,
    }


def py_args(a, workload):
    return ["--workload", workload, "--workers", str(a.workers), "--batch-size",
            str(a.batch_size), "--batches", str(a.batches), "--epochs", str(a.epochs),
            "--prefetch", str(a.prefetch), "--sample-floats", str(a.sample_floats),
            "--work-us", str(a.work_us), "--tv-batch-size", str(a.tv_batch_size),
            "--tv-batches", str(a.tv_batches), "--tv-image-size", str(a.tv_image_size)]


def py_environment():
    """The harness's environment without what would change what the rank's shim sees."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("SPAWNPOINT_") and k not in (
                "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONWARNINGS", "PYTHONINSPECT",
                "PYTHONSAFEPATH", "PYTHONVERBOSE", "TORCHELASTIC_RESTART_COUNT", "BENCH_T0")}


def py_result(side, tag, out, p):
    """A Python job's result: attempt 0's measurements plus attempt 1's (after the gang
    restart) as restart_*; checks that the intended iterator served both attempts."""
    def load(n):
        path = os.path.join(out, f"attempt{n}.json")
        if not os.path.exists(path):
            raise BenchError(f"{tag}: attempt {n} wrote no result ({path})\n"
                             f"{p.stdout[-1500:]}\n{p.stderr[-3000:]}")
        with open(path) as f:
            return json.load(f)

    r0, r1 = load(0), load(1)
    for r in (r0, r1):
        if r["served"] != PY_SERVED[side]:
            raise BenchError(f"{tag}: attempt {r['attempt']}'s DataLoader was served by "
                             f"{r['served']}, not {PY_SERVED[side]}\n{p.stderr[-3000:]}")
    result = dict(r0)
    result["restart_first_batch_from_iter_s"] = r1["first_batch_from_iter_s"]
    result["restart_first_batch_from_process_start_s"] = r1["first_batch_from_process_start_s"]
    result["restart_first_batch_from_kill_s"] = (r1["first_batch_monotonic"] -
                                                 r0["kill_monotonic"])
    result["restart_checksum"] = r1["checksum"]
    result["restart_worker_pids"] = r1["worker_pids"]
    return result


def py_run(a, side, workload, tag, short=False):
    """One Python job under `spawnpoint-agent run`: attempt 0, the gang restart, attempt 1."""
    agent = os.path.join(a.build_dir, "bin", "spawnpoint-agent")
    script = os.path.join(a.source_dir, "bench", "python_pool_bench.py")
    args = py_args(a, workload)
    if short:  # warm-up and smoke runs: 2 epochs of 4 (torchvision: 2) small batches
        args += ["--batches", "4", "--epochs", "2", "--tv-batches", "2", "--tv-batch-size", "8"]
    tmp = tempfile.mkdtemp(prefix="bench-loader-py-")
    try:
        out = os.path.join(tmp, "out")
        os.makedirs(out)
        # The default ([torch, __main__]) plus, for torchvision, what the script imports
        # only inside a function (as a user would list it).
        preload = ["torch", "__main__"] + (["torchvision"] if workload == "torchvision" else [])
        job = os.path.join(tmp, "job.yaml")
        with open(job, "w") as f:
            f.write(bench_job(
                "bench-python-" + side,
                [PYTHON, os.path.abspath(script), "--out", out, "--restart"] + args,
                a.workers, a.prefetch,
                loader_extra="    pythonPool: %s\n    preloadModules: %s\n"
                % ("true" if side == PY_POOL else "false", json.dumps(preload)),
                restart="{maxRestarts: 1, backoffSeconds: 0}"))
        cmd = [agent, "run", "-f", job, "--gpu-backend", "none", "--master-port", "0"]
        return run(cmd, a.py_timeout, tag, lambda c, t, p: py_result(side, t, out, p),
                   env=py_environment(), cwd=tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def py_check(a, tag, workload, r):
    if workload == "torchvision":
        return  # random augmentations: compared between the two sides of a repetition
    want = expected_checksum(a.batch_size, a.batches, a.epochs)
    if abs(r["checksum"] - want) > 1e-6 or r["restart_checksum"] != 0.0:
        raise BenchError(f"{tag}: checksum {r['checksum']} (after the restart "
                         f"{r['restart_checksum']}) but every batch delivered gives {want} "
                         f"(and 0.0)")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, help="repetitions (default 5; 2 with --quick)")
    ap.add_argument("--quick", action="store_true",
                    help="no warm-up, and 2 repetitions unless --repeats says otherwise")
    ap.add_argument("--build-dir", default=os.environ.get("BUILD") or
                    os.path.join(os.path.dirname(here), "build"))
    ap.add_argument("--source-dir", default=os.path.dirname(here))
    ap.add_argument("--timeout", type=float, default=120, help="seconds per run")
    ap.add_argument("--no-self", action="store_true",
                    help="skip the own-command configuration (faster)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--no-python", action="store_true",
                    help="skip the Python rows (the agent's pool against stock DataLoader)")
    ap.add_argument("--python-only", action="store_true",
                    help="only the Python rows (no C++ loader runs)")
    ap.add_argument("--no-agent", action="store_true",
                    help="skip the agent rows (our bench as a rank under the agent)")
    ap.add_argument("--py-workloads", default=",".join(PY_WORKLOADS),
                    help="the Python rows' workloads (default: %(default)s)")
    ap.add_argument("--py-timeout", type=float, default=300,
                    help="seconds per Python job, both attempts (default 300)")
    # The reference's defaults: keep both sides equal by passing every one of them.
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--batches", type=int, default=40, help="batches per epoch")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--prefetch", type=int, default=2)
    ap.add_argument("--sample-floats", type=int, default=3 * 224 * 224)
    ap.add_argument("--work-us", type=int, default=2000)
    ap.add_argument("--tv-batch-size", type=int, default=64, help="torchvision: batch size")
    ap.add_argument("--tv-batches", type=int, default=8, help="torchvision: batches per epoch")
    ap.add_argument("--tv-image-size", type=int, default=256,
                    help="torchvision: FakeData's image side, cropped to 224 (default 256)")
    ap.add_argument("--max-other-cpu", type=float, default=0.25,
                    help="a run during which other processes used more CPUs than this on "
                    "average is repeated (default 0.25)")
    ap.add_argument("--retries", type=int, default=1, help="repeats of a disturbed run (1)")
    ap.add_argument("--budget", type=float, default=60,
                    help="seconds after which disturbed runs are no longer repeated (60)")
    ap.add_argument("--json", help="also write every run's result to this file")
    ap.add_argument("--report", metavar="FILE",
                    help="only print the table of the runs a previous --json saved")
    a = ap.parse_args()
    if a.repeats is None:
        a.repeats = 2 if a.quick else 5
    a.build_dir = os.path.abspath(a.build_dir)  # the Python jobs run in a directory of their own
    a.source_dir = os.path.abspath(a.source_dir)
    workloads = [] if a.python_only else [w for w in a.workloads.split(",") if w]
    configs = [OURS_BIN] + ([] if a.no_self else [OURS_SELF, OURS_LINKED]) + [THEIRS]
    py_workloads = [] if a.no_python else [w for w in a.py_workloads.split(",") if w]
    # The agent rows compare with the Python rows' stock DataLoader of the same repetition.
    agent_workloads = [] if a.no_agent else [w for w in WORKLOADS if w in py_workloads]
    for w in py_workloads:
        if w not in PY_WORKLOADS:
            ap.error(f"--py-workloads: {w} is not one of {', '.join(PY_WORKLOADS)}")
    want = expected_checksum(a.batch_size, a.batches, a.epochs)
    t_start = time.monotonic()
    if py_workloads and not a.report:
        agent = os.path.join(a.build_dir, "bin", "spawnpoint-agent")
        if not os.access(agent, os.X_OK):
            raise BenchError(f"{agent} is missing (the Python rows run under it); build it "
                             f"first (make build), or pass --no-python")
        if "torchvision" in py_workloads and subprocess.run(
                [PYTHON, "-c", "import torchvision"], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL).returncode != 0:
            raise BenchError(f"{PYTHON} cannot import torchvision, which the Python rows' "
                             f"torchvision workload needs: apt-get install python3-torchvision "
                             f"(scripts/install-deps.sh), or pass --py-workloads "
                             f"transfer,compute")
    if a.report:
        with open(a.report) as f:
            saved = json.load(f)
        results = {tuple(k.split("/")): v for k, v in saved.items()}
        workloads = [w for w in workloads if (w, THEIRS) in results]
        configs = [c for c in configs if workloads and (workloads[0], c) in results]
        py_workloads = [w for w in py_workloads if (w, PY_STOCK) in results]
        agent_workloads = [w for w in agent_workloads if (w, AGENT_CONFIGS[0]) in results]
        any_key = next(iter(results))
        a.repeats = len(results[any_key])
        return report(a, results, workloads, configs, py_workloads, t_start, agent_workloads)

    if workloads:
        print(f"bench-loader: {a.repeats} repetitions x {len(workloads)} workloads x "
              f"{len(configs)} configurations; {a.workers} workers, batch {a.batch_size}, "
              f"{a.batches} batches/epoch, {a.epochs} epochs, prefetch {a.prefetch}, "
              f"transfer sample {a.sample_floats} floats "
              f"({a.sample_floats * 4 * a.batch_size / 2**20:.1f} MiB/batch), compute "
              f"{a.work_us} us/sample", flush=True)
    if py_workloads:
        print(f"bench-loader: Python rows: {a.repeats} repetitions x {len(py_workloads)} "
              f"workloads ({', '.join(py_workloads)}) x 2 (agent's pool, stock DataLoader), "
              f"1-rank jobs under spawnpoint-agent run with one gang restart each; "
              f"torchvision: batch {a.tv_batch_size}, {a.tv_batches} batches/epoch, FakeData "
              f"{a.tv_image_size}x{a.tv_image_size}", flush=True)
    if not a.quick:
        # Page cache and first-run effects (libtorch, Python's torch import) off the clock:
        # one short run (2 epochs of 4 batches) of every configuration.
        short = argparse.Namespace(**vars(a))
        short.batches, short.epochs = 4, 2
        cmds = commands(short, "transfer")
        for c in configs if workloads else []:
            run(cmds[c], a.timeout, f"warm-up {LABELS[c]}")
        for c in AGENT_CONFIGS if agent_workloads else []:
            agent_run(a, c, "transfer", f"warm-up {AGENT_LABELS[c]}", run, BenchError,
                      py_environment(), short=True)
        for c in PY_CONFIGS if py_workloads else []:
            py_run(a, c, "torchvision" if "torchvision" in py_workloads else py_workloads[0],
                   f"warm-up Python {PY_LABELS[c]}", short=True)
        print(f"  warm-up done ({time.monotonic() - t_start:.0f} s)", flush=True)

    results = {(w, c): [] for w in workloads for c in configs}
    results.update({(w, c): [] for w in py_workloads for c in PY_CONFIGS})
    results.update({(w, c): [] for w in agent_workloads for c in AGENT_CONFIGS})
    for rep in range(1, a.repeats + 1):
        for w in workloads:
            cmds = commands(a, w)
            line = []
            for c in configs:
                tag = f"repetition {rep} {w} {LABELS[c]}"
                r = measure(a, lambda: run(cmds[c], a.timeout, tag), t_start)
                if abs(r["checksum"] - want) > 1e-6:
                    raise BenchError(f"repetition {rep} {w} {LABELS[c]}: checksum "
                                     f"{r['checksum']} but every batch delivered gives {want}")
                results[(w, c)].append(r)
                line.append(f"{c} first={r['first_batch_s']:.3f}s "
                            f"{r['batches_per_s']:.1f} b/s "
                            f"boundary={r['epoch_boundary_matched_ms']:.1f}ms "
                            f"rss={r['peak_rss_mb']:.0f}MiB "
                            f"other={r['other_cpus']:.2f}cpu"
                            + (f" (best of {r['attempts']})" if r["attempts"] > 1 else ""))
            print(f"  [{rep}/{a.repeats}] {w:8s} " + " | ".join(line) +
                  f"  ({time.monotonic() - t_start:.0f} s)", flush=True)
        for w in agent_workloads:
            line = []
            for c in AGENT_CONFIGS:
                tag = f"repetition {rep} agent {w} {AGENT_LABELS[c]}"
                r = measure(a, lambda: agent_run(a, c, w, tag, run, BenchError,
                                                 py_environment()), t_start)
                if abs(r["checksum"] - want) > 1e-6:
                    raise BenchError(f"{tag}: checksum {r['checksum']}, not {want}")
                results[(w, c)].append(r)
                line.append(f"{c} start→first={r['first_batch_from_process_start_s']:.3f}s "
                            f"create→first={r['first_batch_s']:.3f}s "
                            f"other={r['other_cpus']:.2f}cpu")
            print(f"  [{rep}/{a.repeats}] agent {w:8s} " + " | ".join(line) +
                  f"  ({time.monotonic() - t_start:.0f} s)", flush=True)
        for w in py_workloads:
            # Alternate which side goes first, so neither always follows the other.
            order = PY_CONFIGS if rep % 2 else PY_CONFIGS[::-1]
            line = {}
            for c in order:
                tag = f"repetition {rep} Python {w} {PY_LABELS[c]}"
                r = measure(a, lambda: py_run(a, c, w, tag), t_start)
                py_check(a, tag, w, r)
                results[(w, c)].append(r)
                line[c] = (f"{c} iter→first={r['first_batch_from_iter_s']:.3f}s "
                           f"start→first={r['first_batch_from_process_start_s']:.2f}s "
                           f"{r['batches_per_s']:.1f} b/s "
                           f"boundary={r['epoch_boundary_matched_ms']:.1f}ms "
                           f"rss={r['peak_rss_mb']:.0f}MiB "
                           f"restart iter→first={r['restart_first_batch_from_iter_s']:.3f}s "
                           f"other={r['other_cpus']:.2f}cpu"
                           + (f" (best of {r['attempts']})" if r["attempts"] > 1 else ""))
            pool, stock = results[(w, PY_POOL)][-1], results[(w, PY_STOCK)][-1]
            if w == "torchvision" and (pool["checksum"] != stock["checksum"] or
                                       pool["restart_checksum"] != stock["restart_checksum"]):
                raise BenchError(f"repetition {rep} Python torchvision: the pool's batches "
                                 f"differ from stock DataLoader's with the same seed (checksum "
                                 f"{pool['checksum']} against {stock['checksum']}, after the "
                                 f"restart {pool['restart_checksum']} against "
                                 f"{stock['restart_checksum']})")
            print(f"  [{rep}/{a.repeats}] py {w:11s} " + " | ".join(line[c] for c in PY_CONFIGS)
                  + f"  ({time.monotonic() - t_start:.0f} s)", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({f"{w}/{c}": v for (w, c), v in results.items()}, f, indent=1)
    return report(a, results, workloads, configs, py_workloads, t_start, agent_workloads)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        print(f"bench-loader: FAILED: {e}", file=sys.stderr)
        sys.exit(1)
