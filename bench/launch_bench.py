#!/usr/bin/python3
"""spawnpoint-agent vs torchrun: the same 2-rank CPU/gloo DDP program under both launchers.

Measures, for the example trainer (build/bin/spawnpoint-example-trainer, 2 ranks, 1 node):
  1. start -> first completed allreduce on all ranks,
  2. a rank's death (SIGKILL) -> the restarted group's first allreduce, ours with
     backoffSeconds 0 and at the defaults (backoffSeconds 10: a first failure after a
     healthy run restarts at once), torchrun at its default --monitor_interval (5 s) and
     tuned to 0.1 s,
  3. peak memory (VmHWM) of the launcher process itself, not its children,
  4. the trainer's bare start: the same 2 ranks started directly (a shell sets torchrun's
     variables), start -> first allreduce. Each launcher's overhead is its time above it.

Timestamps come from the trainer (--timing prints "timing rank=R event=E unix_ns=T"), so
both launchers are timed by the same clock and the same code. Standard library only.
"""

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "tests", "support"))
from ports import free_port  # noqa: E402  (tests/support/ports.py)

PYTHON = "/usr/bin/python3"
STEPS = 10
FAIL_STEP = 3
FAIL_RANK = 1
WORLD = 2
TORCHRUN_DEFAULT_MONITOR = None  # None: torchrun's own default (5 s in torch 1.13)
TORCHRUN_TUNED_MONITOR = 0.1

TIMING_RE = re.compile(r"timing rank=(\d+) event=(\w+) unix_ns=(\d+)")
FINAL_RE = re.compile(r"final rank=(\d+) loss=\S+ params=([0-9a-f]+)")
RESTART_RE = re.compile(r"trainer: .*\brestart=(\d+)")


class BenchError(Exception):
    pass


def trainer_args(fail):
    args = ["--timing", "--epochs", "1", "--steps-per-epoch", str(STEPS)]
    if fail:
        args += ["--fail-at-step", str(FAIL_STEP), "--fail-rank", str(FAIL_RANK),
                 "--fail-signal", "9"]
    return args


def write_manifest(path, trainer, fail, defaults=False):
    args = ", ".join('"%s"' % a for a in trainer_args(fail))
    restarts = 1 if fail else 0
    backoff = "" if defaults else "\n    backoffSeconds: 0"
    with open(path, "w") as f:
        f.write(f"""apiVersion: spawnpoint.dev/v1alpha1
kind: TrainingJob
metadata:
  name: bench-launch
spec:
  nodes: 1
  gpusPerNode: 0
  procsPerNode: {WORLD}
  backend: gloo
  template:
    spec:
      containers:
        - name: trainer
          image: spawnpoint/example-trainer:latest
          command: ["{trainer}"]
          args: [{args}]
  loader:
    workersPerRank: 0
  restartPolicy:
    maxRestarts: {restarts}{backoff}
  rendezvous:
    port: 29500
  shmSize: 256Mi
""")


def ours_cmd(cfg, fail, workdir, defaults=False):
    manifest = os.path.join(workdir, "job-%s%s.yaml" % ("restart" if fail else "start",
                                                         "-defaults" if defaults else ""))
    if not os.path.exists(manifest):
        write_manifest(manifest, cfg.trainer, fail, defaults)
    return [cfg.agent, "run", "-f", manifest, "--master-port", str(free_port())]


def bare_cmd(cfg):
    """The trainer's ranks started by a shell with torchrun's variables: no launcher."""
    port = free_port()
    ranks = " ".join(
        "RANK=%d LOCAL_RANK=%d WORLD_SIZE=%d LOCAL_WORLD_SIZE=%d MASTER_ADDR=127.0.0.1 "
        "MASTER_PORT=%d %s %s &" % (r, r, WORLD, WORLD, port, cfg.trainer,
                                    " ".join(trainer_args(False)))
        for r in range(WORLD))
    return ["/bin/sh", "-c", ranks + " wait"]


def theirs_cmd(cfg, fail, monitor):
    cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", str(WORLD),
           "--nnodes", "1", "-r", "1", "-t", "1", "--master_port", str(free_port()),
           "--max_restarts", "1" if fail else "0"]
    if monitor is not None:
        cmd += ["--monitor_interval", str(monitor)]
    return cmd + ["--no_python", cfg.trainer] + trainer_args(fail)


def vm_hwm_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def run_launcher(cmd, log_path, timeout):
    """Runs cmd with stdout+stderr to log_path; returns (t0_ns, exit code, peak VmHWM KiB)."""
    with open(log_path, "wb") as log:
        t0 = time.time_ns()
        # A session of its own, so a timeout can stop the launcher and every rank it started.
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        peak = 0
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            peak = max(peak, vm_hwm_kib(proc.pid))
            if time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise BenchError("timed out after %g s: %s (log: %s)"
                                 % (timeout, " ".join(cmd), log_path))
            time.sleep(0.01)
    return t0, proc.returncode, peak


def tail(path, n=25):
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    return "\n".join("    " + l for l in lines[-n:])


def parse(log_path):
    """Per rank: a list of attempts (each a dict event -> unix_ns), split at "start" events."""
    attempts = {}
    finals = {}
    restarts = []
    with open(log_path, errors="replace") as f:
        for line in f:
            m = TIMING_RE.search(line)
            if m:
                rank, event, ns = int(m.group(1)), m.group(2), int(m.group(3))
                per_rank = attempts.setdefault(rank, [])
                if event == "start" or not per_rank:
                    per_rank.append({})
                per_rank[-1].setdefault(event, ns)
                continue
            m = FINAL_RE.search(line)
            if m:
                finals[int(m.group(1))] = m.group(2)
                continue
            m = RESTART_RE.search(line)
            if m:
                restarts.append(int(m.group(1)))
    return attempts, finals, restarts


def measure(name, cmd, workdir, tag, timeout, fail):
    log_path = os.path.join(workdir, tag + ".log")
    t0, code, peak = run_launcher(cmd, log_path, timeout)

    def fail_run(why):
        raise BenchError("%s: %s\n  command: %s\n  log: %s (last lines below)\n%s"
                         % (name, why, " ".join(cmd), log_path, tail(log_path)))

    if code != 0:
        fail_run("launcher exited %d" % code)
    attempts, finals, restarts = parse(log_path)
    if sorted(finals) != list(range(WORLD)):
        fail_run("expected a final line from ranks 0..%d, got ranks %s"
                 % (WORLD - 1, sorted(finals)))
    if len(set(finals.values())) != 1:
        fail_run("ranks ended with different parameters: %s" % finals)
    want = 2 if fail else 1
    for rank in range(WORLD):
        got = attempts.get(rank, [])
        if len(got) != want or any("first_allreduce" not in a for a in got):
            fail_run("rank %d: expected %d attempt(s) each with a first_allreduce, got %s"
                     % (rank, want, got))
    result = {"hash": finals[0], "peak_kib": peak,
              "start": (max(attempts[r][0]["first_allreduce"] for r in range(WORLD)) - t0) / 1e9,
              "spawn": (max(attempts[r][0]["start"] for r in range(WORLD)) - t0) / 1e9}
    if fail:
        if restarts[:1] != [0] or restarts[-1:] != [1]:
            fail_run("expected rank 0 to report restart=0 then restart=1, got %s" % restarts)
        fail_ns = attempts[FAIL_RANK][0].get("fail")
        if fail_ns is None:
            fail_run("rank %d printed no fail timing line" % FAIL_RANK)
        recovered = max(attempts[r][1]["first_allreduce"] for r in range(WORLD))
        respawned = max(attempts[r][1]["start"] for r in range(WORLD))
        if recovered <= fail_ns or respawned <= fail_ns:
            fail_run("the restarted attempt's timing lines are not after the failure")
        result["recovery"] = (recovered - fail_ns) / 1e9
        result["respawn"] = (respawned - fail_ns) / 1e9
    return result


def summary(values, unit="s"):
    med = statistics.median(values)
    if unit == "MiB":
        return med, "%.1f MiB (%.1f–%.1f)" % (med, min(values), max(values))
    return med, "%.3f s (%.3f–%.3f)" % (med, min(values), max(values))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="repetitions (default 5)")
    ap.add_argument("--quick", action="store_true", help="2 repetitions")
    ap.add_argument("--build-dir", default=os.environ.get("BUILD") or
                    os.path.join(os.path.dirname(here), "build"))
    ap.add_argument("--timeout", type=float, default=90, help="seconds per launcher run")
    ap.add_argument("--no-warmup", action="store_true",
                    help="skip the unmeasured first run of each launcher (page cache warm-up)")
    ap.add_argument("--keep-logs", action="store_true", help="keep the launchers' logs")
    cfg = ap.parse_args()
    repeats = 2 if cfg.quick else cfg.repeats
    if repeats < 1:
        ap.error("--repeats must be >= 1")
    build = os.path.abspath(cfg.build_dir)
    cfg.agent = os.path.join(build, "bin", "spawnpoint-agent")
    cfg.trainer = os.path.join(build, "bin", "spawnpoint-example-trainer")
    for b in (cfg.agent, cfg.trainer, PYTHON):
        if not os.access(b, os.X_OK):
            sys.exit("launch_bench: %s is missing or not executable (make build)" % b)

    workdir = tempfile.mkdtemp(prefix="spawnpoint-bench-launch-")
    runs = {
        "bare_start": lambda: bare_cmd(cfg),
        "ours_start": lambda: ours_cmd(cfg, False, workdir),
        "theirs_start": lambda: theirs_cmd(cfg, False, TORCHRUN_DEFAULT_MONITOR),
        "bare_start_again": lambda: bare_cmd(cfg),  # a second bare start, next to the restarts
        "ours_restart": lambda: ours_cmd(cfg, True, workdir),
        "ours_restart_defaults": lambda: ours_cmd(cfg, True, workdir, defaults=True),
        "theirs_restart_default": lambda: theirs_cmd(cfg, True, TORCHRUN_DEFAULT_MONITOR),
        "theirs_restart_tuned": lambda: theirs_cmd(cfg, True, TORCHRUN_TUNED_MONITOR),
    }
    results = {k: [] for k in runs}
    print("launch bench: %d rank(s) of %s, %d steps, %d repetition(s); logs in %s"
          % (WORLD, cfg.trainer, STEPS, repeats, workdir), flush=True)
    bench_start = time.monotonic()
    try:
        if not cfg.no_warmup:
            measure("warm-up (spawnpoint-agent)", runs["ours_start"](), workdir, "warmup-ours",
                    cfg.timeout, False)
            measure("warm-up (torchrun)", theirs_cmd(cfg, False, TORCHRUN_TUNED_MONITOR),
                    workdir, "warmup-theirs", cfg.timeout, False)
        for i in range(repeats):
            for key, make_cmd in runs.items():
                who = ("spawnpoint-agent" if key.startswith("ours") else
                       "no launcher" if key.startswith("bare") else "torchrun")
                results[key].append(measure("%s (%s, repetition %d)" % (key, who, i + 1),
                                            make_cmd(), workdir, "%s-%d" % (key, i + 1),
                                            cfg.timeout, "restart" in key))
            r = {k: v[-1] for k, v in results.items()}
            print("rep %d/%d: start ours %.3fs theirs %.3fs | death->recovery ours %.3fs "
                  "theirs %.3fs (monitor 5s) %.3fs (monitor 0.1s) | launcher VmHWM ours %.1f MiB "
                  "theirs %.1f MiB"
                  % (i + 1, repeats, r["ours_start"]["start"], r["theirs_start"]["start"],
                     r["ours_restart"]["recovery"], r["theirs_restart_default"]["recovery"],
                     r["theirs_restart_tuned"]["recovery"], r["ours_start"]["peak_kib"] / 1024,
                     r["theirs_start"]["peak_kib"] / 1024), flush=True)
        hashes = {k: {x["hash"] for x in v} for k, v in results.items()}
        if len(set().union(*hashes.values())) != 1:
            raise BenchError("the launchers' runs ended with different parameters (the same "
                             "program should train identically): %s" % hashes)
    except BenchError as e:
        print("launch bench FAILED: %s" % e, file=sys.stderr, flush=True)
        sys.exit(1)

    def col(key, field, unit="s", scale=1.0):
        return summary([x[field] * scale for x in results[key]], unit)

    rows = []
    ratios = {}

    def row(label, ours, theirs, word, ratio_key=None):
        ratio = theirs[0] / ours[0] if ours[0] > 0 else float("inf")
        if ratio_key:
            ratios[ratio_key] = ratio
        rows.append("| %s | %s | %s | %.2fx %s |" % (label, ours[1], theirs[1], ratio, word))

    row("start → first allreduce on all ranks", col("ours_start", "start"),
        col("theirs_start", "start"), "faster", "start")
    row("  of which: start → last rank's main()", col("ours_start", "spawn"),
        col("theirs_start", "spawn"), "faster")
    row("rank death → restarted group's first allreduce (torchrun default --monitor_interval 5)",
        col("ours_restart", "recovery"), col("theirs_restart_default", "recovery"), "faster",
        "restart_default")
    row("the same, both at their defaults (ours: backoffSeconds 10, resetAfterSeconds 600)",
        col("ours_restart_defaults", "recovery"), col("theirs_restart_default", "recovery"),
        "faster", "restart_defaults")
    row("rank death → restarted group's first allreduce (torchrun --monitor_interval 0.1)",
        col("ours_restart", "recovery"), col("theirs_restart_tuned", "recovery"), "faster",
        "restart_tuned")
    row("  of which: death → last restarted rank's main() (--monitor_interval 0.1)",
        col("ours_restart", "respawn"), col("theirs_restart_tuned", "respawn"), "faster")
    row("launcher peak memory (VmHWM of the launcher process)",
        col("ours_start", "peak_kib", "MiB", 1 / 1024),
        col("theirs_start", "peak_kib", "MiB", 1 / 1024),
        "smaller", "launcher_memory")

    print()
    print("%d rank(s), 1 node, CPU/gloo, %d repetition(s); median (min–max); %.0f s in all"
          % (WORLD, repeats, time.monotonic() - bench_start))
    print()
    print("| metric | spawnpoint-agent (ours) | torchrun (theirs) | theirs/ours |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        print(r)
    # The launchers' own cost: their times above the trainer's bare start. Per repetition
    # (its runs are back to back, under the same load), minus the mean of that repetition's
    # two bare starts; the median over repetitions, and its range.
    bares = [(a["start"] + b["start"]) / 2
             for a, b in zip(results["bare_start"], results["bare_start_again"])]
    overhead = {}
    print()
    print("the trainer's bare start (no launcher, twice per repetition): %s; each launcher's "
          "overhead above it, per repetition, median (min–max):"
          % summary([x["start"] for x in results["bare_start"] + results["bare_start_again"]])[1])
    print()
    print("| overhead above the bare start | spawnpoint-agent (ours) | torchrun (theirs) |")
    print("| --- | --- | --- |")

    def above_bare(key, field):
        diffs = [(x[field] - b) * 1000 for x, b in zip(results[key], bares)]
        return statistics.median(diffs), "%.0f ms (%.0f–%.0f)" % (
            statistics.median(diffs), min(diffs), max(diffs))

    for label, ours_key, theirs_key, field, name in (
            ("start → first allreduce", "ours_start", "theirs_start", "start", "start"),
            ("death → restarted allreduce, tuned (ours backoff 0, torchrun monitor 0.1 s)",
             "ours_restart", "theirs_restart_tuned", "recovery", "restart"),
            ("death → restarted allreduce, both at their defaults", "ours_restart_defaults",
             "theirs_restart_default", "recovery", "restart_defaults")):
        o = above_bare(ours_key, field)
        overhead[name] = o[0]
        print("| %s | %s | %s |" % (label, o[1], above_bare(theirs_key, field)[1]))
    print()
    print("ratios start=%.2f restart_default=%.2f restart_tuned=%.2f launcher_memory=%.2f "
          "restart_defaults=%.2f overhead_start_ms=%.0f overhead_restart_ms=%.0f"
          % (ratios["start"], ratios["restart_default"], ratios["restart_tuned"],
             ratios["launcher_memory"], ratios["restart_defaults"], overhead["start"],
             overhead["restart"]), flush=True)
    if not cfg.keep_logs:
        for name in os.listdir(workdir):
            os.unlink(os.path.join(workdir, name))
        os.rmdir(workdir)


if __name__ == "__main__":
    main()
