"""The tables and the ratios line of `make bench-loader` (bench/loader_bench.py runs the
benchmark; this prints what it measured, also from saved runs with --report): the
configurations' names, the C++ table, the Python rows' table, the agent rows (through
loader_bench_agent.py), the context line and the ratios line.

The ratios line holds only headline ratios: each compares the same work done by
the two sides it names, measured over the same span. A ratio that also counts work only one
side does is printed on the `context` line before it (CONTEXT_KEYS), with what it compares:
default_first_batch_rank_start sets our C++ split rank (libtorch's load) against a Python
rank that also pays its own `import torch`. Standard library only.
"""

import statistics
import time

from loader_bench_agent import AGENT_CONFIGS, agent_table

WORKLOADS = ("transfer", "compute")
OURS_BIN = "ours-worker"  # configuration keys
OURS_SELF = "ours-self"
OURS_LINKED = "ours-linked"
THEIRS = "pytorch"
LABELS = {
    OURS_BIN: "ours (torch-free worker binary)",
    OURS_SELF: "ours (trainer's own command, split)",
    OURS_LINKED: "ours (trainer's own command, libtorch linked)",
    THEIRS: "PyTorch DataLoader",
}

PY_POOL = "py-pool"
PY_STOCK = "py-stock"
PY_CONFIGS = (PY_POOL, PY_STOCK)
PY_LABELS = {
    PY_POOL: "agent's pool (pythonPool: true)",
    PY_STOCK: "stock DataLoader (spawn, persistent)",
}

# The context line's keys, with what each compares.
CONTEXT_KEYS = {
    "default_first_batch_rank_start":
        "from the rank process's start: our C++ split rank, which loads libtorch, against a "
        "Python rank that also pays its own import torch",
}


def context_line(values):
    """The `context` line for {key: value} of CONTEXT_KEYS: not like-for-like, so not a
    headline ratio; each key is followed by what it compares."""
    return "context (not like-for-like) " + "; ".join(
        f"{k}={v:.2f}: {CONTEXT_KEYS[k]}" for k, v in values.items())


def med(values):
    return statistics.median(values)


def fmt(values, unit, digits):
    values = [v for v in values if v == v]
    if not values:
        return "–"
    m = med(values)
    if len(values) == 1:
        return f"{m:.{digits}f}{unit}"
    return f"{m:.{digits}f}{unit} ({min(values):.{digits}f}–{max(values):.{digits}f})"


OPPOSITE = {"sooner": "later", "faster": "slower", "less": "more"}


def worded(x, word):
    """"2.00x sooner"; a ratio below 1 as its inverse with the opposite word ("1.25x later")."""
    if x == x and 0 < x < 1 and word in OPPOSITE:
        return f"{1 / x:.2f}x {OPPOSITE[word]}"
    return f"{x:.2f}x {word}"


def ms_less(x):
    return f"{x:.1f} ms less" if x >= 0 else f"{-x:.1f} ms more"


def report(a, results, workloads, configs, py_workloads, t_start, agent_workloads=()):

    def vals(w, c, key):
        return [r.get(key, float("nan")) for r in results[(w, c)]]

    # Speed-ups are medians of per-repetition ratios: a repetition runs every side back to
    # back, so its ratio compares runs that shared the machine's load of that moment (this
    # machine may be busy with other work, which moves both sides' absolute numbers).
    def speedup(w, c, key, direction, base=THEIRS):
        pairs = zip(vals(w, c, key), vals(w, base, key))
        if direction == "theirs/ours":
            return med([t / o for o, t in pairs if o > 0] or [float("nan")])
        return med([o / t for o, t in pairs if t > 0] or [float("nan")])

    ratios = []
    context = {}
    if workloads:
        cpp_table(a, workloads, configs, vals, speedup)
    if all(w in workloads for w in WORKLOADS):
        first = min(speedup(w, OURS_BIN, "first_batch_s", "theirs/ours") for w in WORKLOADS)
        tr = speedup("transfer", OURS_BIN, "batches_per_s", "ours/theirs")
        co = speedup("compute", OURS_BIN, "batches_per_s", "ours/theirs")
        eb = max(med(vals(w, OURS_BIN, "epoch_boundary_matched_ms")) for w in WORKLOADS)
        ratios.append(f"first_batch={first:.2f} transfer={tr:.2f} compute={co:.2f} "
                      f"epoch_boundary_ms={eb:.2f}")
    elif workloads:
        print("(the C++ ratios need both workloads)")
    if py_workloads:
        py_table(a, py_workloads, vals, speedup)
    if all(w in py_workloads for w in WORKLOADS):
        first = min(speedup(w, PY_POOL, "first_batch_from_iter_s", "theirs/ours", PY_STOCK)
                    for w in WORKLOADS)
        tr = speedup("transfer", PY_POOL, "batches_per_s", "ours/theirs", PY_STOCK)
        co = speedup("compute", PY_POOL, "batches_per_s", "ours/theirs", PY_STOCK)
        eb = max(med(vals(w, PY_POOL, "epoch_boundary_matched_ms")) for w in WORKLOADS)
        ratios.append(f"py_first_batch={first:.2f} py_transfer={tr:.2f} py_compute={co:.2f} "
                      f"py_epoch_boundary_ms={eb:.2f}")
    elif py_workloads:
        print("(the Python ratios need the transfer and compute workloads)")
    if agent_workloads:
        def ratio(w, c, key, skey, direction):
            pairs = zip(vals(w, c, key), vals(w, PY_STOCK, skey))
            if direction == "theirs/ours":
                return med([t / o for o, t in pairs if o > 0] or [float("nan")])
            return med([o / t for o, t in pairs if t > 0] or [float("nan")])

        agent_table(a, agent_workloads, vals, ratio, fmt, worded, PY_STOCK)
        if all(w in agent_workloads for w in WORKLOADS):
            # From creating the loader (stock: iter(), which spawns its workers), and from
            # the rank process's start (libtorch's load / Python's import torch included).
            dfb = min(ratio(w, AGENT_CONFIGS[0], "first_batch_s", "first_batch_from_iter_s",
                            "theirs/ours") for w in WORKLOADS)
            dfs = min(ratio(w, AGENT_CONFIGS[0], "first_batch_from_process_start_s",
                            "first_batch_from_process_start_s", "theirs/ours")
                      for w in WORKLOADS)
            ratios.insert(1 if ratios and workloads else 0, f"default_first_batch={dfb:.2f}")
            context["default_first_batch_rank_start"] = dfs
    print()
    print(f"{time.monotonic() - t_start:.0f} s in all.")
    if context:
        print(context_line(context))
    if ratios:
        print("ratios " + " ".join(ratios))
    return 0


def cpp_table(a, workloads, configs, vals, speedup):
    ours_cols = [c for c in configs if c != THEIRS]
    print()
    head = "| workload | metric | " + " | ".join(LABELS[c] for c in ours_cols) + \
        f" | {LABELS[THEIRS]} | " + " | ".join(
            "ratio, " + LABELS[c].split("(")[1].rstrip(")") for c in ours_cols) + " |"
    print(head)
    print("|" + " --- |" * (3 + 2 * len(ours_cols)))
    rows = [
        ("first_batch_s", "start → first batch", " s", 3, "theirs/ours", "sooner"),
        ("phase_spawn_s", "  of which: spawning the workers (ours)", " s", 4, "info", None),
        ("phase_connect_s", "  of which: to worker 0's Hello (exec, connect, configure)", " s", 4,
         "info", None),
        ("phase_probe_s", "  of which: batch 0 asked for and built (ours: in its ring slot)",
         " s", 4, "info", None),
        ("phase_build_s", "    of which the worker's build of batch 0", " s", 4, "info", None),
        ("phase_ring_s", "  of which: the ring made from it", " s", 4, "info", None),
        ("phase_handover_s", "  of which: the rest, to the batch in the trainer's hands", " s",
         4, "info", None),
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
                    rs.append(worded(speedup(w, c, key, direction), word))
                else:
                    rs.append(ms_less(med(theirs) - med(vals(w, c, key))))
            print(f"| {w} | {label} | " + " | ".join(cells) + f" | {fmt(theirs, unit, digits)} | " +
                  " | ".join(rs) + " |")
    print()
    print(f"Median (min–max) of {a.repeats} repetitions; ratios: median of the per-repetition "
          f"ratios. The ratios line's first four are for {LABELS[OURS_BIN]}.")


PY_ROWS = [  # key, label, unit, digits, ratio direction (pool "ours", stock "theirs"), word
    ("first_batch_from_iter_s", "iter() → first batch", " s", 3, "theirs/ours", "sooner"),
    ("first_batch_from_process_start_s", "rank process start → first batch", " s", 2,
     "theirs/ours", "sooner"),
    ("first_batch_from_launch_s", "`spawnpoint-agent run` → first batch", " s", 2,
     "theirs/ours", "sooner"),
    ("import_torch_s", "  the rank's own `import torch` (both sides)", " s", 2, "info", None),
    ("workers_cpu_to_first_batch_s", "  loader workers' CPU between iter() and the first batch",
     " s", 3, "info", None),
    ("batches_per_s", "steady batches/s (epochs 2+, boundaries included)", "", 1,
     "ours/theirs", "faster"),
    ("epoch_boundary_matched_ms", "time lost at an epoch boundary (like-for-like)", " ms", 1,
     None, None),
    ("epoch_boundary_ms", "  same, reference's definition (vs the mean gap)", " ms", 1, None,
     None),
    ("cpu_ms_per_batch_workers", "CPU per steady batch: the loader workers", " ms", 1,
     "theirs/ours", "less"),
    ("cpu_ms_per_batch_rank", "CPU per steady batch: the rank", " ms", 1, "theirs/ours",
     "less"),
    ("cpu_ms_per_batch_agent", "CPU per steady batch: the agent (the pool's service)", " ms",
     2, "info", None),
    ("peak_rss_mb", "peak memory, rank + loader workers (sum of VmHWM)", " MiB", 0,
     "theirs/ours", "less"),
    ("peak_rss_main_mb", "  of which the rank", " MiB", 0, "theirs/ours", "less"),
    ("agent_rss_mb", "the agent's own peak memory (VmHWM; runs the pool's service)", " MiB", 1,
     "info", None),
    ("restart_first_batch_from_iter_s", "after a gang restart: iter() → first batch", " s", 3,
     "theirs/ours", "sooner"),
    ("restart_first_batch_from_process_start_s",
     "after a gang restart: new rank's process start → first batch", " s", 2, "theirs/ours",
     "sooner"),
    ("restart_first_batch_from_kill_s", "after a gang restart: rank SIGKILLed → first batch",
     " s", 2, "theirs/ours", "sooner"),
    ("other_cpus", "other processes' CPU use during the run (not ours)", " CPUs", 2, "info",
     None),
]


def py_table(a, py_workloads, vals, speedup):
    print()
    print(f"| Python workload | metric | {PY_LABELS[PY_POOL]} | {PY_LABELS[PY_STOCK]} | ratio |")
    print("| --- | --- | --- | --- | --- |")
    for w in py_workloads:
        for key, label, unit, digits, direction, word in PY_ROWS:
            pool, stock = vals(w, PY_POOL, key), vals(w, PY_STOCK, key)
            if all(v != v for v in pool + stock):
                continue
            if direction == "info":
                r = ""
            elif direction:
                r = worded(speedup(w, PY_POOL, key, direction, PY_STOCK), word)
            else:
                r = ms_less(med(stock) - med(pool))
            print(f"| {w} | {label} | {fmt(pool, unit, digits)} | {fmt(stock, unit, digits)} | "
                  f"{r} |")
    print()
    print(f"Median (min–max) of {a.repeats} repetitions, each a 1-rank job under "
          f"spawnpoint-agent run (pool: the agent's warm workers, started with the rank; stock: "
          f"workers spawned cold at iter()); ratios: median of the per-repetition ratios, "
          f"stock/pool for times and memory, pool/stock for throughput.")
