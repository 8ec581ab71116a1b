#!/usr/bin/python3
"""make bench-restart: a gang restart through the operator, in place vs recreated.

On the real control plane of scripts/cluster.sh, whose local nodes run each pod's trainer
container as a local process (tests/cluster/local_node.py), spawnpoint-operator runs a job of
2 nodes x 1 CPU rank of the example DDP trainer (gloo); rank 1 (node 1) SIGKILLs itself at
step 3 of its first attempt. Measured: the death (the trainer's "fail" timing line) -> every
rank's first completed allreduce of the next attempt ("first_allreduce"), the slowest rank's,
and the part of it that is the trainer's own start (its "start" -> "first_allreduce" in that
attempt), for restartPolicy.mode InPlace and Recreate at the defaults (backoffSeconds 10: a
first failure after a healthy run restarts at once).

Both modes run twice: on local nodes that start a pod as fast as a process starts, and on
local nodes with a SIMULATED pod start latency (--pod-start-delay, default 5 s: the
Kubernetes SLO's p99 for a pod start without an image pull), which a recreated pod pays and
an in-place restart does not. Timestamps come from the trainer (--timing: "timing rank=R
event=E unix_ns=T"), the same clock for every process. Prints a table, then

    context (not like-for-like) inplace_vs_recreate_sim=Y: ...
    ratios inplace_vs_recreate=X

(Recreate's time over InPlace's: how many times faster the in-place restart is). X is the
headline: both modes restart the same job on the same local nodes. Y is context, not a
headline ratio: most of Recreate's time there is the pod start latency the bench injects
(SIMULATED), which InPlace never pays. Standard library only; the binaries come from the
build directory, kubectl from .tools/bin.
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "tests", "support"))
from ports import free_port  # noqa: E402  (tests/support/ports.py)

TIMING_RE = re.compile(r"timing rank=(\d+) event=(\w+) unix_ns=(\d+)")
FAIL_STEP = 3
STEPS = 10


class BenchError(Exception):
    pass


def manifest(name, mode, trainer):
    return f"""apiVersion: spawnpoint.dev/v1alpha1
kind: TrainingJob
metadata:
  name: {name}
spec:
  nodes: 2
  procsPerNode: 1
  backend: gloo
  template:
    metadata:
      annotations:
        local-node.spawnpoint.dev/own-pod-ip: "true"
    spec:
      terminationGracePeriodSeconds: 5
      containers:
        - name: trainer
          image: spawnpoint/example-trainer:latest
          command: ["{trainer}"]
          args: [--timing, --epochs, "1", --steps-per-epoch, "{STEPS}", --fail-at-step,
                 "{FAIL_STEP}", --fail-rank, "1", --fail-signal, "9"]
          env:
            - name: POD_IP
              valueFrom:
                fieldRef:
                  fieldPath: status.podIP
  loader:
    workersPerRank: 1
  restartPolicy:
    mode: {mode}
  rendezvous:
    port: {free_port()}
  shmSize: 256Mi
  runPolicy:
    cleanPodPolicy: None
"""


class Cluster:
    """scripts/cluster.sh's control plane with 2 local nodes that run pods, and an operator."""

    def __init__(self, root, build, work, delay):
        self.root, self.work, self.delay = root, work, delay
        self.dir = os.path.join(work, "cluster-delay-%g" % delay)
        self.kubectl_bin = os.path.join(root, ".tools", "bin", "kubectl")
        up = subprocess.run(
            ["bash", "scripts/cluster.sh", "up", "--dir", self.dir, "--nodes", "2",
             "--pod-start-delay", str(delay), "--apply", "crds/trainingjob.yaml"],
            cwd=root, stdout=subprocess.PIPE, text=True)
        if up.returncode != 0:
            raise BenchError("scripts/cluster.sh up failed (its output is above)")
        self.kubeconfig = up.stdout.strip().splitlines()[-1].split("kubeconfig: ", 1)[1]
        # The agent serves its status on the pod's own address (the local nodes share the
        # host's network), where the operator reads it.
        self.agent = os.path.join(work, "agent-on-pod-ip.sh")
        with open(self.agent, "w") as f:
            f.write('#!/bin/sh\nprev=\nfor a in "$@"; do\n  shift\n'
                    '  if [ "$prev" = --metrics-addr ]; then a="$POD_IP$a"; fi\n'
                    '  set -- "$@" "$a"\n  prev=$a\ndone\nexec %s "$@"\n'
                    % os.path.join(os.path.abspath(build), "bin", "spawnpoint-agent"))
        os.chmod(self.agent, 0o755)
        self.operator_log = open(os.path.join(work, "operator-delay-%g.log" % delay), "w")
        self.operator = subprocess.Popen(
            [os.path.join(build, "bin", "spawnpoint-operator"), "--kubeconfig", self.kubeconfig,
             "--namespace", "default", "--metrics-addr", "off", "--health-addr", "off",
             "--agent-path", self.agent, "--master-addr", "127.0.0.1",
             "--agent-status-port", str(free_port()), "--agent-gang-port", str(free_port()),
             "--utilisation-interval", "0"],
            cwd=root, stdout=subprocess.DEVNULL, stderr=self.operator_log)

    def kubectl(self, *args, stdin=None):
        p = subprocess.run([self.kubectl_bin, "--kubeconfig", self.kubeconfig, "-n", "default"] +
                           list(args), input=stdin, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        return p.returncode, p.stdout

    def logs(self, job):
        """Every incarnation's trainer log of the job's pods."""
        pods = os.path.join(self.dir, "node", "pods")
        out = []
        for d in sorted(os.listdir(pods)):
            if d.startswith("default_%s-node-" % job):
                path = os.path.join(pods, d, "trainer.log")
                if os.path.exists(path):
                    with open(path, errors="replace") as f:
                        out.append(f.read())
        return "\n".join(out)

    def stop(self):
        self.operator.terminate()
        try:
            self.operator.wait(20)
        except subprocess.TimeoutExpired:
            self.operator.kill()
        subprocess.run(["bash", "scripts/cluster.sh", "down", "--dir", self.dir], cwd=self.root,
                       stdout=subprocess.DEVNULL)


def measure(cluster, name, mode, trainer, timeout):
    """(death -> every rank's first allreduce of the next attempt, the trainer's own start in
    it), seconds."""
    code, out = cluster.kubectl("apply", "-f", "-", stdin=manifest(name, mode, trainer))
    if code != 0:
        raise BenchError("kubectl apply: " + out)
    deadline = time.time() + timeout
    phase = ""
    while time.time() < deadline:
        code, out = cluster.kubectl("get", "tj", name, "-o", "jsonpath={.status.phase}")
        phase = out.strip() if code == 0 else ""
        if phase in ("Succeeded", "Failed"):
            break
        time.sleep(0.5)
    if phase != "Succeeded":
        raise BenchError("%s (%s) ended %r; logs:\n%s" % (name, mode, phase, cluster.logs(name)))
    events = {}
    for rank, event, ns in TIMING_RE.findall(cluster.logs(name)):
        events.setdefault((int(rank), event), []).append(int(ns) / 1e9)
    fail = min(events.get((1, "fail"), [0]))
    if not fail:
        raise BenchError("%s: no fail timing line" % name)
    after, start = [], []
    for rank in (0, 1):
        firsts = sorted(t for t in events.get((rank, "first_allreduce"), []) if t > fail)
        starts = sorted(t for t in events.get((rank, "start"), []) if t > fail)
        if not firsts or not starts:
            raise BenchError("%s: rank %d has no attempt after the death" % (name, rank))
        after.append(firsts[0] - fail)
        start.append(firsts[0] - starts[0])
    code, out = cluster.kubectl("get", "tj", name, "-o", "jsonpath={.status.restarts}")
    if out.strip() != "1":
        raise BenchError("%s: status.restarts %r, not 1" % (name, out))
    cluster.kubectl("delete", "tj", name, "--wait=true", "--timeout=60s")
    return max(after), max(start)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.environ.get("BUILD", "build"))
    ap.add_argument("--runs", type=int, default=3, help="jobs per mode and latency (median)")
    ap.add_argument("--pod-start-delay", type=float, default=5.0,
                    help="the SIMULATED pod start latency of the second round (s)")
    ap.add_argument("--quick", action="store_true", help="one run each")
    ap.add_argument("--timeout", type=float, default=180)
    args = ap.parse_args()
    runs = 1 if args.quick else args.runs
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    build = os.path.join(root, args.build) if not os.path.isabs(args.build) else args.build
    trainer = os.path.join(build, "bin", "spawnpoint-example-trainer")
    for binary in ("spawnpoint-operator", "spawnpoint-agent", "spawnpoint-example-trainer"):
        if not os.access(os.path.join(build, "bin", binary), os.X_OK):
            sys.exit("bench-restart: %s/bin/%s is missing; build first (make build)"
                     % (build, binary))
    work = tempfile.mkdtemp(prefix="spawnpoint-bench-restart-")
    results = {}
    try:
        for delay in (0.0, args.pod_start_delay):
            print("bench-restart: control plane, pod start delay %g s%s" %
                  (delay, " (SIMULATED)" if delay else ""), file=sys.stderr, flush=True)
            cluster = Cluster(root, build, work, delay)
            try:
                for mode in ("InPlace", "Recreate"):
                    got = []
                    for i in range(runs):
                        name = "restart-%s-%d" % (mode.lower(), i)
                        got.append(measure(cluster, name, mode, trainer, args.timeout))
                        print("bench-restart: %s delay %g: %.2f s (trainer start %.2f s)"
                              % (mode, delay, got[-1][0], got[-1][1]), file=sys.stderr,
                              flush=True)
                    results[(mode, delay)] = got
            finally:
                cluster.stop()
    except BenchError as e:
        print("bench-restart: " + str(e), file=sys.stderr)
        print("bench-restart: work directory kept: " + work, file=sys.stderr)
        sys.exit(1)
    shutil.rmtree(work, ignore_errors=True)
    summary(results, runs, args.pod_start_delay)


def summary(results, runs, pod_start_delay):
    """Prints the table, the context line and the ratios line from `results`:
    {(mode, delay): [(SIGKILL -> every rank's first allreduce, the trainer's own start)]} for
    mode InPlace and Recreate and delay 0 and `pod_start_delay` (s)."""

    def cell(values):
        return "%.2f s (%.2f–%.2f)" % (statistics.median(values), min(values), max(values))

    def median(mode, delay):
        return statistics.median(g[0] for g in results[(mode, delay)])

    print("2 nodes x 1 CPU rank (gloo), %d run(s) each; median (min–max)" % runs)
    print()
    print("| restartPolicy.mode | pod start latency | SIGKILL -> every rank's first allreduce "
          "| of which the trainer's own start |")
    print("| --- | --- | --- | --- |")
    for delay in (0.0, pod_start_delay):
        for mode in ("InPlace", "Recreate"):
            got = results[(mode, delay)]
            label = "%g s (SIMULATED)" % delay if delay else "none (a local process)"
            print("| %s | %s | %s | %s |" % (mode, label, cell([g[0] for g in got]),
                                             cell([g[1] for g in got])))
    ratio = median("Recreate", 0.0) / median("InPlace", 0.0)
    ratio_sim = median("Recreate", pod_start_delay) / median("InPlace", pod_start_delay)
    print("context (not like-for-like) inplace_vs_recreate_sim=%.2f: the same over a pod start "
          "latency of %g s injected by the bench (SIMULATED), which Recreate pays and InPlace "
          "never does, so it is mostly that delay" % (ratio_sim, pod_start_delay))
    print("ratios inplace_vs_recreate=%.2f" % ratio)


if __name__ == "__main__":
    main()
