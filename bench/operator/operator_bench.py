#!/usr/bin/env python3
"""make bench-operator: spawnpoint-operator under load, against a real control plane.

The control plane is scripts/cluster.sh's (kube-apiserver, etcd, kube-controller-manager,
kube-scheduler at the pinned version), its local nodes simulating pods (bound pods are
reported Running, nothing runs: tests/cluster/local_node.py --simulate), the CRD applied
before the controllers start; the bench's own calls go through kube-fault-proxy (plain HTTP,
no faults), the operator talks to kube-apiserver directly with the admin kubeconfig.
(bench/RESULTS.md has the figures of the old imitation server beside these, measured before
it was deleted.)

N TrainingJobs of 2 nodes are created at once (from several threads, straight to the API);
measured: the time until every pod exists and until every job is Running, the
reconciles per second over that window, the p50/p99 reconcile latency (the operator's own
/metrics summary), the status writes, and the operator's peak resident memory (VmHWM).
Prints a table. Only the standard library; the binaries come from the build directory.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "tests", "support"))
from ports import free_port  # noqa: E402  (tests/support/ports.py)


def call(base, method, path, body=None, timeout=30):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def job(name, nodes):
    return {
        "apiVersion": "spawnpoint.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodes": nodes,
            "procsPerNode": 1,
            "template": {"spec": {"containers": [{
                "name": "trainer", "image": "trainer:1",
                "command": ["python3", "train.py"], "args": ["--epochs", "90"]}]}},
            "shmSize": "1Gi",
        },
    }


def count(base, path):
    """Objects under a list path. A real API server sets remainingItemCount only for lists
    without selectors, so the list is read whole (metadata only, as a table would be bigger)."""
    code, body = call(base, "GET", path)
    if code != 200:
        return -1
    return len(json.loads(body).get("items", []))


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        values[name] = float(value)
    return values


def histogram_quantile(q, before, after, name):
    """The q-quantile of a histogram's observations between two scrapes, summed over its
    label sets and interpolated linearly within the bucket, as PromQL's histogram_quantile."""
    buckets = {}
    for values, sign in ((after, 1), (before, -1)):
        for key, v in values.items():
            if key.startswith(name + "_bucket{"):
                le = key[key.index('le="') + 4:].split('"')[0]
                bound = float("inf") if le == "+Inf" else float(le)
                buckets[bound] = buckets.get(bound, 0) + sign * v
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return 0.0
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for b in bounds:
        if buckets[b] >= rank:
            if b == float("inf"):
                return lower
            return lower + (b - lower) * (rank - below) / max(buckets[b] - below, 1e-12)
        lower, below = b, buckets[b]
    return lower


def vm_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.environ.get("BUILD", "build"))
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--creators", type=int, default=8, help="threads creating the jobs")
    ap.add_argument("--workers", type=int, default=4, help="--max-concurrent-reconciles")
    ap.add_argument("--qps", type=float, default=1000, help="--kube-api-qps (0: unlimited)")
    ap.add_argument("--burst", type=int, default=2000, help="--kube-api-burst")
    ap.add_argument("--simulated-nodes", type=int, default=8,
                    help="nodes at least (real: one per 100 pods, 110 fit on a node)")
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.chdir(root)
    bins = {"spawnpoint-operator": os.path.join(args.build, "bin", "spawnpoint-operator"),
            "kube-fault-proxy": os.path.join(root, ".tools", "bin", "kube-fault-proxy")}
    for name in bins:
        if not os.access(bins[name], os.X_OK):
            sys.exit(f"bench-operator: {bins[name]} is missing; build first (make build; "
                     "make cluster-tools for the control plane and the proxy)")
    work = tempfile.mkdtemp(prefix="spawnpoint-bench-operator-")
    procs = []
    cluster_down = None
    keep = None
    try:
        nodes = max(args.simulated_nodes, -(-args.jobs * args.nodes // 100))
        cluster_dir = os.path.join(work, "cluster")
        print(f"bench-operator: starting the control plane ({nodes} local nodes that "
              "simulate pods)", file=sys.stderr, flush=True)
        up = subprocess.run(
            ["bash", "scripts/cluster.sh", "up", "--dir", cluster_dir, "--nodes", str(nodes),
             "--simulate-pods", "--apply", "crds/trainingjob.yaml"],
            stdout=subprocess.PIPE, text=True)
        if up.returncode != 0:
            sys.exit("bench-operator: scripts/cluster.sh up failed (its output is above)")
        kubeconfig = up.stdout.strip().splitlines()[-1].split("kubeconfig: ", 1)[1]
        cluster_down = ["bash", "scripts/cluster.sh", "down", "--dir", cluster_dir]
        proxy = subprocess.Popen(
            [bins["kube-fault-proxy"], "--upstream-kubeconfig", kubeconfig],
            stdout=subprocess.PIPE, stderr=open(os.path.join(work, "proxy.log"), "w"),
            text=True)
        procs.append(proxy)
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", proxy.stdout.readline())
        if not m:
            sys.exit("bench-operator: kube-fault-proxy did not start")
        base = m.group(1)
        version = json.loads(call(base, "GET", "/version")[1]).get("gitVersion", "?")
        server_name = f"kube-apiserver {version} + etcd, {nodes} simulated local nodes"

        metrics_port = free_port()
        operator = subprocess.Popen(
            [bins["spawnpoint-operator"], "--kubeconfig", kubeconfig,
             "--metrics-addr", f"127.0.0.1:{metrics_port}", "--health-addr", "off",
             "--utilisation-interval", "0", "--max-concurrent-reconciles", str(args.workers),
             "--kube-api-qps", str(args.qps), "--kube-api-burst", str(args.burst),
             "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "operator.log"), "w"))
        procs.append(operator)
        deadline = time.time() + 20
        while True:
            try:
                scrape(metrics_port)
                break
            except OSError:
                if time.time() > deadline:
                    sys.exit("bench-operator: the operator did not serve /metrics")
                time.sleep(0.05)
        idle_rss = vm_kib(operator.pid, "VmRSS")
        before = scrape(metrics_port)

        # All jobs at once.
        names = [f"bench-{i:05d}" for i in range(args.jobs)]
        errors = []

        def create(chunk):
            for n in chunk:
                for _ in range(5):
                    code, body = call(base, "POST",
                                      "/apis/spawnpoint.dev/v1alpha1/namespaces/default/trainingjobs",
                                      job(n, args.nodes))
                    if code in (200, 201):
                        break
                else:
                    errors.append((n, code, body[:200]))

        t0 = time.monotonic()
        chunks = [names[i::args.creators] for i in range(args.creators)]
        threads = [threading.Thread(target=create, args=(c,)) for c in chunks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        t_created = time.monotonic() - t0
        if errors:
            sys.exit(f"bench-operator: {len(errors)} jobs could not be created: {errors[:3]}")

        want_pods = args.jobs * args.nodes
        t_pods = t_running = None
        peak = 0
        while time.monotonic() - t0 < args.timeout:
            peak = max(peak, vm_kib(operator.pid, "VmHWM"))
            if t_pods is None and count(base, "/api/v1/namespaces/default/pods?labelSelector="
                                             "spawnpoint.dev%2Fjob-name") >= want_pods:
                t_pods = time.monotonic() - t0
                after_pods = scrape(metrics_port)
            if t_pods is not None:
                code, body = call(base, "GET", "/apis/spawnpoint.dev/v1alpha1/trainingjobs")
                if code == 200:
                    items = json.loads(body)["items"]
                    if sum(1 for j in items if j.get("status", {}).get("phase") == "Running") == args.jobs:
                        t_running = time.monotonic() - t0
                        break
            time.sleep(0.1)
        if t_pods is None or t_running is None:
            keep = work
            sys.exit("bench-operator: timed out; see " + work)
        # Let the queue drain (the status writes of the last transitions).
        time.sleep(1.0)
        after = scrape(metrics_port)
        peak = max(peak, vm_kib(operator.pid, "VmHWM"))

        def total(values, name):
            return sum(v for k, v in values.items() if k.startswith(name + "{"))

        count_name = "spawnpoint_reconcile_duration_seconds_count"
        reconciles_to_pods = total(after_pods, count_name) - total(before, count_name)
        reconciles = total(after, count_name) - total(before, count_name)
        # Status writes are the operator's only PUTs (pods and services are POSTed).
        writes = (after.get('spawnpoint_api_requests_total{verb="PUT",code="200"}', 0) -
                  before.get('spawnpoint_api_requests_total{verb="PUT",code="200"}', 0))
        p50 = histogram_quantile(0.5, before, after, "spawnpoint_reconcile_duration_seconds")
        p99 = histogram_quantile(0.99, before, after, "spawnpoint_reconcile_duration_seconds")

        rows = [
            ("API server", server_name),
            ("TrainingJobs x nodes", f"{args.jobs} x {args.nodes} ({want_pods} pods)"),
            ("operator settings", f"{args.workers} workers, client qps {args.qps:g} / burst {args.burst}"),
            ("jobs created (all at once, {} threads)".format(args.creators), f"{t_created:.2f} s"),
            ("time until every pod exists", f"{t_pods:.2f} s"),
            ("time until every job is Running", f"{t_running:.2f} s"),
            ("reconciles until every pod exists", f"{reconciles_to_pods:.0f} ({reconciles_to_pods / t_pods:.0f}/s)"),
            ("reconciles until every job is Running", f"{reconciles:.0f} ({reconciles / t_running:.0f}/s)"),
            ("status writes", f"{writes:.0f}"),
            ("reconcile latency p50 (from the histogram)", f"{p50 * 1000:.2f} ms"),
            ("reconcile latency p99 (from the histogram)", f"{p99 * 1000:.2f} ms"),
            ("operator RSS idle", f"{idle_rss / 1024:.1f} MiB"),
            ("operator peak RSS (VmHWM)", f"{peak / 1024:.1f} MiB"),
        ]
        width = max(len(r[0]) for r in rows)
        vwidth = max(len(r[1]) for r in rows)
        print(f"| {'measurement'.ljust(width)} | {'value'.ljust(vwidth)} |")
        print(f"|{'-' * (width + 2)}|{'-' * (vwidth + 2)}|")
        for k, v in rows:
            print(f"| {k.ljust(width)} | {v.ljust(vwidth)} |")
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
        if cluster_down:
            subprocess.run(cluster_down, stdout=subprocess.DEVNULL)
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
