"""A rank's death to its restarted first step, under spawnpoint-agent (its defaults: warm
standby ranks, the loader pool) and under torchrun of the same torch at its defaults, for two
trainers of bench/restart_scripts/: a DDP script importing torch and torchvision with
DataLoader workers, and a Lightning Trainer(strategy="ddp"). 2 CPU ranks on gloo, this
machine, same run, repetitions interleaved.

Each run: the launcher starts the trainer; once both ranks have made their first step (and,
under the agent, every standby said it is ready, as it is long before a real failure), the
bench creates the kill file and the last rank SIGKILLs itself at its next step. Measured: the
rank's `bench death` stamp to the last rank's first step of the next attempt (time.time()
of each process; one clock), and, for the first start, the launch to the last rank's first
step and to each phase the trainer stamps (`bench phase`: import torch, its first
collective, DDP(model) done; the last rank's). Prints tables of medians (min-max) and last

    ratios restart_torchvision=X restart_lightning=Y start_overhead_pct=Z

X, Y: torchrun's restart over ours (above 1: ours is back sooner); Z: the agent's first
start (launch to first step, both trainers' medians summed) over torchrun's, minus one, in
percent. Run it with the interpreter whose torch it compares (make bench-restart runs it in
the frameworks environment's torch 2.6, scripts/frameworks-env.sh, and with Debian's 1.13).

    python bench/restart_vs_torchrun.py --agent build/bin/spawnpoint-agent [--reps 3]
        [--trainers torchvision,lightning]
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = {"torchvision": os.path.join(HERE, "restart_scripts", "ddp_torchvision.py"),
           "lightning": os.path.join(HERE, "restart_scripts", "lightning_trainer.py")}
TORCHRUN = os.path.join(HERE, "restart_scripts", "torchrun.py")  # -m torch.distributed.run
FIRST = re.compile(r"bench first-step rank=(\d+) attempt=(\d) wall=([0-9.]+)")
PHASE = re.compile(r"bench phase rank=(\d+) attempt=0 name=(\w+) wall=([0-9.]+)")
DEATH = re.compile(r"bench death rank=\d wall=([0-9.]+)")
READY = re.compile(r"standby \(pid \d+\) is ready for a restart")
TIMEOUT_S = 900
HANG_S = 240  # from the kill file to the launcher's exit, at most

JOB = """\
apiVersion: spawnpoint.dev/v1alpha1
kind: TrainingJob
metadata: {name: restart-bench}
spec:
  nodes: 1
  gpusPerNode: %d
  procsPerNode: %d
  restartPolicy: {maxRestarts: 1}
  template:
    spec:
      containers:
        - name: trainer
          image: unused
          command: %s
"""


def run_once(launcher, trainer, agent, nproc=2, gpus=0, agent_args=(), during=None):
    """One run of `nproc` ranks (`gpus` GPUs each under the agent; torch picks CUDA where it
    sees one): {"start": launch -> first step, "restart": death -> restarted first step,
    "phases": {phase: launch -> the last rank's stamp}}. `agent_args`: more flags for
    `spawnpoint-agent run`; `during`, if given, is called once every rank has stepped, before
    the kill, with what the launcher and the ranks have said so far."""
    with tempfile.TemporaryDirectory(prefix="spawnpoint-restart-bench-") as tmp:
        kill_file = os.path.join(tmp, "kill")
        events = os.path.join(tmp, "events")
        command = [sys.executable, SCRIPTS[trainer], kill_file]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPAWNPOINT_")}
        env["BENCH_EVENTS"] = events  # the ranks' stamps, whatever a launcher does with stdout
        # Debian 13's torch 2.6 has no libuv, which torchrun's own store asks for since 2.4
        # (the agent's shim sets this for its ranks by itself); 1.13 has neither.
        env.setdefault("USE_LIBUV", "0")
        if launcher == "ours":
            with open(os.path.join(tmp, "job.yaml"), "w") as f:
                f.write(JOB % (gpus, nproc, json.dumps(command)))
            argv = [agent, "run", "-f", os.path.join(tmp, "job.yaml"), "--master-port", "0"]
            argv += list(agent_args) or ["--gpu-backend", "none", "--metrics-addr", "off"]
        else:
            # torchrun's single-node form (its c10d rendezvous on a free port), through
            # restart_scripts/torchrun.py (Debian 13's 2.6 needs it to start at all).
            # --redirects/--tee 1: stdout to a log and here (Debian's 1.13 on Python 3.11
            # cannot leave them unset: "'NoneType' object has no attribute 'get'").
            argv = [sys.executable, TORCHRUN, "--standalone",
                    "--nproc_per_node", str(nproc), "--max_restarts", "1", "--redirects", "1",
                    "--tee", "1"] + command[1:]
        lines = []
        start = time.time()
        proc = subprocess.Popen(argv, cwd=tmp, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, universal_newlines=True,
                                start_new_session=True)
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        deadline = time.monotonic() + TIMEOUT_S
        def stamps():
            try:
                with open(events) as f:
                    return f.read()
            except OSError:
                return ""

        while time.monotonic() < deadline and proc.poll() is None:
            text = stamps() + "".join(lines)
            firsts = {int(m.group(1)) for m in FIRST.finditer(text) if m.group(2) == "0"}
            standbys = len(READY.findall(text))
            if firsts == set(range(nproc)) and (launcher != "ours" or standbys >= nproc):
                if during:
                    during(text)
                open(kill_file, "w").close()
                break
            time.sleep(0.05)
        # Once the kill file is there a run ends within seconds; a restarted attempt that
        # hangs (torchrun's gloo ranks, now and then, in init_process_group) is ended here
        # and fails the run.
        try:
            code = proc.wait(timeout=max(1, min(deadline - time.monotonic(), HANG_S)))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            code = proc.wait()
        reader.join(timeout=10)
        output = "".join(lines)
        text = stamps()
    firsts = {}
    for m in FIRST.finditer(text):
        firsts.setdefault(int(m.group(2)), {})[int(m.group(1))] = float(m.group(3))
    death = DEATH.search(text)
    if code != 0 or death is None or sorted(firsts.get(1, {})) != list(range(nproc)):
        raise RunFailed("%s/%s failed (exit %s):\n%s\n%s" % (launcher, trainer, code, text,
                                                            output[-6000:]))
    phases = {}
    for m in PHASE.finditer(text):
        phases[m.group(2)] = max(phases.get(m.group(2), 0.0), float(m.group(3)) - start)
    phases["first_step"] = max(firsts[0].values()) - start
    return {"start": phases["first_step"], "phases": phases,
            "restart": max(firsts[1].values()) - float(death.group(1))}


class RunFailed(Exception):
    pass


TORCHRUN_TRIES = 8


def run_counted(launcher, trainer, agent, failures):
    """run_once; a torchrun run that fails by itself in its restarted attempt (its gloo ranks
    now and then fail to connect: "Connection reset by peer", "connectFullMesh failed", or
    hang in init_process_group) is run again, up to TORCHRUN_TRIES runs, each failure
    counted in failures[trainer]; None when every one failed. One of ours that fails stops
    the bench."""
    for tries in range(TORCHRUN_TRIES):
        try:
            return run_once(launcher, trainer, agent)
        except RunFailed as err:
            if launcher == "ours":
                sys.exit(str(err))
            failures[trainer] = failures.get(trainer, 0) + 1
            print("torchrun/%s failed, run again: %s" % (trainer, str(err).splitlines()[0]),
                  flush=True)
    print("torchrun/%s: %d runs in a row failed; this repetition has no torchrun row" % (
        trainer, TORCHRUN_TRIES), flush=True)
    return None


def describe(values):
    if not values:
        return "no run"
    return "%.2f s (%.2f-%.2f)" % (statistics.median(values), min(values), max(values))


def median_of(results, key):
    """The median of `key` over a launcher's runs; None when it has none."""
    values = [r[key] for r in results]
    return statistics.median(values) if values else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agent", required=True, help="spawnpoint-agent to run")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--trainers", default="torchvision,lightning")
    args = parser.parse_args()
    args.agent = os.path.abspath(args.agent)
    import torch  # the torch compared: this interpreter's

    trainers = [t for t in args.trainers.split(",") if t]
    results = {(l, t): [] for l in ("ours", "torchrun") for t in trainers}
    failures = {}
    for rep in range(args.reps):
        for trainer in trainers:
            for launcher in ("ours", "torchrun"):
                r = run_counted(launcher, trainer, args.agent, failures)
                if r is None:
                    continue
                results[(launcher, trainer)].append(r)
                print("rep %d %s %s: start %.2f s, restart %.2f s" % (
                    rep + 1, trainer, launcher, r["start"], r["restart"]), flush=True)
    print("\ntorch %s, Python %s, %d CPUs; medians (min-max) of %d runs\n" % (
        torch.__version__, sys.version.split()[0], os.cpu_count(), args.reps))
    print("| trainer | launcher | launch -> first step | rank death -> restarted first step |")
    print("| --- | --- | --- | --- |")
    for trainer in trainers:
        for launcher in ("ours", "torchrun"):
            rs = results[(launcher, trainer)]
            print("| %s | %s | %s | %s |" % (
                trainer, "spawnpoint-agent (defaults)" if launcher == "ours" else
                "torchrun (defaults)", describe([r["start"] for r in rs]),
                describe([r["restart"] for r in rs])))
    for trainer, n in sorted(failures.items()):
        print("\ntorchrun/%s: %d run(s) failed in the restarted attempt and were run again"
              % (trainer, n))
    for trainer in trainers:
        names = [n for n in results[("ours", trainer)][0]["phases"]]
        print("\n%s, first start: launch -> the last rank's phase\n" % trainer)
        print("| phase | spawnpoint-agent (defaults) | torchrun (defaults) | difference |")
        print("| --- | --- | --- | --- |")
        for name in names:
            ours = [r["phases"][name] for r in results[("ours", trainer)]]  # ours never fail
            theirs = [r["phases"][name] for r in results[("torchrun", trainer)]
                      if name in r["phases"]]
            if not theirs:
                continue
            print("| %s | %s | %s | %+.2f s (%+.1f %%) |" % (
                name, describe(ours), describe(theirs),
                statistics.median(ours) - statistics.median(theirs),
                100 * (statistics.median(ours) / statistics.median(theirs) - 1)))
    ratios = []
    for trainer in trainers:
        ours = median_of(results[("ours", trainer)], "restart")
        theirs = median_of(results[("torchrun", trainer)], "restart")
        ratios.append("restart_%s=%s" % (trainer, "nan" if theirs is None else
                                           "%.2f" % (theirs / ours)))
    starts = [(median_of(results[("ours", t)], "start"), median_of(results[("torchrun", t)],
                                                                   "start")) for t in trainers]
    if all(theirs is not None for _, theirs in starts):
        overhead = 100 * (sum(o for o, _ in starts) / sum(t for _, t in starts) - 1)
        ratios.append("start_overhead_pct=%.1f" % overhead)
    else:
        ratios.append("start_overhead_pct=nan")
    print("ratios " + " ".join(ratios))


if __name__ == "__main__":
    main()
