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
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

PYTHON = "/usr/bin/python3"
WORKLOADS = ("transfer", "compute")
OURS_BIN = "ours-worker"  # configuration keys
OURS_SELF = "ours-self"
THEIRS = "pytorch"
LABELS = {
    OURS_BIN: "ours (torch-free worker binary)",
    OURS_SELF: "ours (trainer's own command)",
    THEIRS: "PyTorch DataLoader",
}


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


def run(cmd, timeout, tag):
    t0 = time.monotonic()
    busy0, own0 = machine_busy_s(), own_cpu_s()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise BenchError(f"{tag}: no result within {timeout:.0f} s: {' '.join(cmd)}\n"
                         f"{(e.stderr or '')[-3000:]}")
    wall = time.monotonic() - t0
    # CPU the rest of the machine used meanwhile, in CPUs: other work on a shared machine
    # slows whichever side it happens to overlap.
    foreign = max(0.0, (machine_busy_s() - busy0) - (own_cpu_s() - own0)) / max(wall, 1e-3)
    if p.returncode != 0:
        raise BenchError(f"{tag}: exit code {p.returncode}: {' '.join(cmd)}\n"
                         f"{p.stderr[-3000:]}")
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if not lines:
        raise BenchError(f"{tag}: no JSON result on stdout: {' '.join(cmd)}\n{p.stdout[-2000:]}"
                         f"\n{p.stderr[-2000:]}")
    result = json.loads(lines[-1])
    result["wall_s"] = wall
    result["other_cpus"] = foreign
    return result


def measure(a, cmd, tag, t_start):
    """Runs `cmd`; while other processes kept more than --max-other-cpu CPUs busy during the
    run, runs it again (at most --retries times, within --budget seconds) and keeps the least
    disturbed attempt. The same rule for every side."""
    best = None
    for attempt in range(1 + a.retries):
        r = run(cmd, a.timeout, tag)
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
        THEIRS: [PYTHON, os.path.join(a.source_dir, "bench", "loader_reference.py")] + args,
    }


def med(values):
    return statistics.median(values)


def fmt(values, unit, digits):
    m = med(values)
    if len(values) == 1:
        return f"{m:.{digits}f}{unit}"
    return f"{m:.{digits}f}{unit} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def ratio(x):
    return f"{x:.2f}x"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="repetitions (default 5)")
    ap.add_argument("--quick", action="store_true", help="2 repetitions, no warm-up")
    ap.add_argument("--build-dir", default=os.environ.get("BUILD") or
                    os.path.join(os.path.dirname(here), "build"))
    ap.add_argument("--source-dir", default=os.path.dirname(here))
    ap.add_argument("--timeout", type=float, default=120, help="seconds per run")
    ap.add_argument("--no-self", action="store_true",
                    help="skip the own-command configuration (faster)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    # The reference's defaults: keep both sides equal by passing every one of them.
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--batches", type=int, default=40, help="batches per epoch")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--prefetch", type=int, default=2)
    ap.add_argument("--sample-floats", type=int, default=3 * 224 * 224)
    ap.add_argument("--work-us", type=int, default=2000)
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
    if a.quick:
        a.repeats = 2
    workloads = [w for w in a.workloads.split(",") if w]
    configs = [OURS_BIN] + ([] if a.no_self else [OURS_SELF]) + [THEIRS]
    want = expected_checksum(a.batch_size, a.batches, a.epochs)
    t_start = time.monotonic()
    if a.report:
        with open(a.report) as f:
            saved = json.load(f)
        results = {tuple(k.split("/")): v for k, v in saved.items()}
        workloads = [w for w in workloads if (w, THEIRS) in results]
        configs = [c for c in configs if (workloads[0], c) in results]
        a.repeats = len(results[(workloads[0], THEIRS)])
        return report(a, results, workloads, configs, t_start)

    print(f"bench-loader: {a.repeats} repetitions x {len(workloads)} workloads x "
          f"{len(configs)} configurations; {a.workers} workers, batch {a.batch_size}, "
          f"{a.batches} batches/epoch, {a.epochs} epochs, prefetch {a.prefetch}, "
          f"transfer sample {a.sample_floats} floats "
          f"({a.sample_floats * 4 * a.batch_size / 2**20:.1f} MiB/batch), compute "
          f"{a.work_us} us/sample", flush=True)
    if not a.quick:
        # Page cache and first-run effects (libtorch, Python's torch import) off the clock:
        # one short run (2 epochs of 4 batches) of every configuration.
        short = argparse.Namespace(**vars(a))
        short.batches, short.epochs = 4, 2
        cmds = commands(short, "transfer")
        for c in configs:
            run(cmds[c], a.timeout, f"warm-up {LABELS[c]}")
        print(f"  warm-up done ({time.monotonic() - t_start:.0f} s)", flush=True)

    results = {(w, c): [] for w in workloads for c in configs}
    for rep in range(1, a.repeats + 1):
        for w in workloads:
            cmds = commands(a, w)
            line = []
            for c in configs:
                r = measure(a, cmds[c], f"repetition {rep} {w} {LABELS[c]}", t_start)
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
    if a.json:
        with open(a.json, "w") as f:
            json.dump({f"{w}/{c}": v for (w, c), v in results.items()}, f, indent=1)
    return report(a, results, workloads, configs, t_start)


def report(a, results, workloads, configs, t_start):

    def vals(w, c, key):
        return [r.get(key, float("nan")) for r in results[(w, c)]]

    # Speed-ups are medians of per-repetition ratios: a repetition runs every side back to
    # back, so its ratio compares runs that shared the machine's load of that moment (this
    # machine may be busy with other work, which moves both sides' absolute numbers).
    def speedup(w, c, key, direction):
        pairs = zip(vals(w, c, key), vals(w, THEIRS, key))
        if direction == "theirs/ours":
            return med([t / o for o, t in pairs if o > 0] or [float("nan")])
        return med([o / t for o, t in pairs if t > 0] or [float("nan")])

    ours_cols = [c for c in configs if c != THEIRS]
    print()
    head = "| workload | metric | " + " | ".join(LABELS[c] for c in ours_cols) + \
        f" | {LABELS[THEIRS]} | " + " | ".join(
            "ratio, " + LABELS[c].split("(")[1].rstrip(")") for c in ours_cols) + " |"
    print(head)
    print("|" + " --- |" * (3 + 2 * len(ours_cols)))
    rows = [
        ("first_batch_s", "start → first batch", " s", 3, "theirs/ours", "sooner"),
        ("batches_per_s", "steady batches/s (epochs 2+, boundaries included)", "", 1,
         "ours/theirs", "faster"),
        ("epoch_boundary_matched_ms", "time lost at an epoch boundary (like-for-like)", " ms", 1,
         None, None),
        ("epoch_boundary_ms", "  same, reference's definition (vs the mean gap)", " ms", 1,
         None, None),
        ("peak_rss_mb", "peak memory, main + workers (sum of VmHWM)", " MiB", 0, "theirs/ours",
         "less"),
        ("other_cpus", "other processes' CPU use during the run (not ours)", " CPUs", 2, "info",
         None),
    ]
    for w in workloads:
        for key, label, unit, digits, direction, word in rows:
            if all(v != v for c in configs for v in vals(w, c, key)):
                continue  # not recorded (results saved by an older harness)
            cells = [fmt(vals(w, c, key), unit, digits) for c in ours_cols]
            theirs = vals(w, THEIRS, key)
            rs = []
            for c in ours_cols:
                if direction == "info":
                    rs.append("")
                elif direction:
                    rs.append(f"{speedup(w, c, key, direction):.2f}x {word}")
                else:
                    rs.append(f"{med(theirs) - med(vals(w, c, key)):.1f} ms less")
            print(f"| {w} | {label} | " + " | ".join(cells) + f" | {fmt(theirs, unit, digits)} | " +
                  " | ".join(rs) + " |")
    print()
    print(f"Median (min–max) of {a.repeats} repetitions; ratios: median of the per-repetition "
          f"ratios; {time.monotonic() - t_start:.0f} s in all. The ratios line is for "
          f"{LABELS[OURS_BIN]}.")
    ok = all(w in workloads for w in WORKLOADS)
    if not ok:
        print("(ratios need both workloads)")
        return 0
    first = min(speedup(w, OURS_BIN, "first_batch_s", "theirs/ours") for w in WORKLOADS)
    tr = speedup("transfer", OURS_BIN, "batches_per_s", "ours/theirs")
    co = speedup("compute", OURS_BIN, "batches_per_s", "ours/theirs")
    eb = max(med(vals(w, OURS_BIN, "epoch_boundary_matched_ms")) for w in WORKLOADS)
    print(f"ratios first_batch={first:.2f} transfer={tr:.2f} compute={co:.2f} "
          f"epoch_boundary_ms={eb:.2f}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        print(f"bench-loader: FAILED: {e}", file=sys.stderr)
        sys.exit(1)
