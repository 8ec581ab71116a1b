#!/usr/bin/python3
"""The chaos run of issue 15: the real operator (build/bin/spawnpoint-operator) behind
kube-fault-proxy, the real control plane of scripts/cluster.sh with local_node.py's two
nodes (tests/cluster/cluster_fixture.py), and two-node TrainingJobs of the example trainer
with loader workers, while a seeded schedule combines faults: the operator SIGKILLed and
restarted, the API server's 409/429/500, latency and cut watches, a rank SIGKILLed, a loader
worker SIGKILLed and one SIGSTOPped, an agent SIGTERMed, /dev/shm nearly full. Then it checks
every job's phase, parameters, status history and failure causes, and what is left behind.

    chaos.py --source-dir REPO --build-dir BUILD [--seed S] [--seconds N]

CHAOS_SEED and CHAOS_SECONDS (environment) are the defaults of --seed and --seconds. The
schedule is a pure function of (seed, seconds), printed first: a failing seed replays.
The last line is
    chaos seed=S faults=N jobs=N succeeded=N failed_as_expected=N wrong_phase=N leaks=N
and the exit code is 1 on any wrong phase, leak or status that went backwards.

As root it runs in a mount namespace of its own whose /dev/shm is a private tmpfs of
--shm-mb (a pod's memory-backed /dev/shm emptyDir): filling it nearly full then costs that
much memory at most, and its leak check sees only this run's files. Standard library only, and
local_node.py's API client (with python3-yaml).
"""

import argparse
import atexit
import collections
import errno
import http.client
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, "cluster"))
import cluster_fixture  # noqa: E402
from local_node import Api  # noqa: E402

NS = "default"
TJ_PATH = "/apis/spawnpoint.dev/v1alpha1/namespaces/%s/trainingjobs" % NS
PRIVATE_ENV = "SPAWNPOINT_CHAOS_PRIVATE_SHM"
FILL = "/dev/shm/chaos-fill"
LOADER_UP = re.compile(r"loader rank=(\d+) epoch=")
FINAL = re.compile(r"final rank=(\d+) loss=\S+ params=([0-9a-f]+)")
TERMINAL = ("Succeeded", "Failed")
# Phase moves the status may make (docs/trainingjob.md): forward, and Running <-> Restarting.
LEGAL = {"": {"Pending", "Running", "Restarting", "Succeeded", "Failed"},
         "Pending": {"Running", "Restarting", "Succeeded", "Failed"},
         "Running": {"Restarting", "Succeeded", "Failed"},
         "Restarting": {"Running", "Succeeded", "Failed"},
         "Succeeded": set(), "Failed": set()}
LOCAL_FAULTS = ("rank-kill", "worker-kill", "worker-stop", "agent-term")
GLOBAL_FAULTS = ("operator-kill", "api-faults", "shm-full")
API_KINDS = ("api-500", "api-429", "api-409", "api-watch-cut", "api-latency")


def log(msg):
    sys.stdout.write("[%7.1f] %s\n" % (time.monotonic() - T0, msg))
    sys.stdout.flush()


T0 = time.monotonic()


# --- the schedule: a pure function of (seed, seconds) ---------------------------------------

RESTARTING = ("rank-kill", "agent-term")  # the local faults that make the gang restart
# What the retryable jobs retry on (with retryOn given, the default 128-255 no longer applies):
# signals from outside and a gang started while /dev/shm was full (an agent that could not
# start says itself whether that is retryable: AgentError is no retryOn value).
RETRY_ON = ["Killed", "OOMKilled", "Terminated", "Crashed", "ShmExhausted"]


def make_schedule(seed, seconds):
    """Jobs and, per job, the faults fired while it runs: each `after` seconds of the job's
    Running phase (counted from its last start of Running or from its previous fault,
    whichever is later). Every job but the last gets a gang restart (a rank SIGKILLed or an
    agent SIGTERMed) and one or two loader faults; the run's shared faults (the operator,
    the API, /dev/shm) come just before a job's restart, so that the restart happens under
    them. The first job's API window holds an operator restart (its lists and watches meet
    the faults too). The last job is given a budget its fault exceeds (maxRestarts 0)."""
    rng = random.Random(seed)
    n_jobs = max(2, int(round(seconds / 30.0)))
    jobs = []
    for i in range(n_jobs):
        budget_job = i == n_jobs - 1
        job = {"name": "chaos-%d" % i, "mode": rng.choice(["InPlace", "Recreate"]),
               "workers": rng.choice([1, 2]), "epochs": rng.choice([4, 5]),
               "budget": budget_job, "faults": []}
        if budget_job:
            kinds = ["rank-kill"]
        else:
            others = [k for k in LOCAL_FAULTS if k not in RESTARTING]
            kinds = [rng.choice(RESTARTING)] + rng.sample(others, rng.choice([1, 2]))
            rng.shuffle(kinds)
        for kind in kinds:
            job["faults"].append({"kind": kind, "node": rng.randrange(2),
                                  "after": round(rng.uniform(2, 8), 1)})
        jobs.append(job)

    def before_restart(job, fault, lead, kinds=RESTARTING):
        """Puts fault just before the job's first restarting fault (of `kinds`) not yet
        preceded by a shared one, which then follows it within `lead` seconds: that fault,
        or None (fault then goes anywhere)."""
        faults = job["faults"]
        for k, f in enumerate(faults):
            if f["kind"] in kinds and (k == 0 or faults[k - 1]["kind"] in LOCAL_FAULTS):
                f["after"] = round(rng.uniform(0.5, lead), 1)
                faults.insert(k, fault)
                return f
        faults.insert(rng.randrange(len(faults) + 1), fault)
        return None

    def shared(kind):
        fault = {"kind": kind, "after": round(rng.uniform(1, 6), 1)}
        if kind == "operator-kill":
            fault["down"] = round(rng.uniform(0.5, 5), 1)
        elif kind == "api-faults":
            fault["window"] = round(rng.uniform(15, 25), 1)
            fault["rules"] = api_rules(rng)
        else:  # long enough for the restarted rank to reach its Loader (its ring) under it
            fault["window"] = round(rng.uniform(6, 10), 1)
        return fault

    # The first job: API faults, the operator SIGKILLed within them, then its restart.
    api, kill = shared("api-faults"), shared("operator-kill")
    kill["after"] = round(rng.uniform(1, 3), 1)
    before_restart(jobs[0], kill, 3)
    jobs[0]["faults"].insert(jobs[0]["faults"].index(kill), api)
    # One more shared fault for each other retryable job; /dev/shm full at least once.
    anchors = list(range(1, n_jobs - 1)) or [0]
    kinds = ["shm-full"] + [rng.choice(GLOBAL_FAULTS) for _ in anchors[1:]]
    rng.shuffle(kinds)
    for k, kind in enumerate(kinds):
        fault, job = shared(kind), jobs[anchors[k]]
        if kind != "shm-full":
            before_restart(job, fault, 4)
            continue
        # Under a full /dev/shm only a rank restarted in place starts (see shm_quiet).
        job["mode"] = "InPlace"
        kill = before_restart(job, fault, 1.5, kinds=("rank-kill",))
        if kill is None:
            kill = {"kind": "rank-kill", "node": rng.randrange(2),
                    "after": round(rng.uniform(0.5, 1.5), 1)}
            job["faults"].insert(job["faults"].index(fault) + 1, kill)
        kill["under_shm"] = True
    for job in jobs:
        planned = sum(1 for f in job["faults"] if f["kind"] in RESTARTING)
        # A margin for the run's shared faults: a gang started while /dev/shm is full fails
        # (retryably here) and may fail again, after backoff, until the window ends.
        under_shm = any(f.get("under_shm") for f in job["faults"])
        job["maxRestarts"] = 0 if job["budget"] else planned + 4 + (4 if under_shm else 0)
    return jobs


def api_rules(rng):
    """A seeded set of fault-proxy rules (tools/faultproxy/faults.go) for one window."""
    rules = []
    for kind in rng.sample(API_KINDS, rng.choice([2, 3, 4])):
        rate = round(rng.uniform(0.1, 0.35), 2)
        if kind == "api-500":
            rules.append((kind, "code=500,rate=%s" % rate))
        elif kind == "api-429":
            rules.append((kind, "code=429,retryAfter=1,rate=%s" % rate))
        elif kind == "api-409":
            verb = rng.choice(["update", "patch", "create"])
            rules.append((kind, "code=409,verb=%s,rate=%s" % (verb, rate)))
        elif kind == "api-watch-cut":
            rules.append((kind, "verb=watch,cutAfterEvents=%d,midLine=%s,count=%d" % (
                rng.randrange(0, 4), rng.choice(["true", "false"]), rng.randrange(2, 6))))
        else:
            rules.append((kind, "latencyMs=%d,rate=%s" % (rng.randrange(50, 400), rate)))
    return rules


def print_schedule(seed, seconds, jobs):
    log("chaos schedule seed=%d seconds=%d jobs=%d" % (seed, seconds, len(jobs)))
    for job in jobs:
        log("  job %s mode=%s workersPerRank=%d epochs=%d maxRestarts=%d%s" % (
            job["name"], job["mode"], job["workers"], job["epochs"], job["maxRestarts"],
            " (budget exceeded: expect Failed)" if job["budget"] else ""))
        for f in job["faults"]:
            extra = ""
            if "node" in f:
                extra = " node=%d" % f["node"]
            if "down" in f:
                extra += " down=%ss" % f["down"]
            if "window" in f:
                extra += " window=%ss" % f["window"]
            if "rules" in f:
                extra += " rules=%s" % ";".join(r for _, r in f["rules"])
            log("    +%4.1fs running: %s%s" % (f["after"], f["kind"], extra))


# --- the API server, read directly (never through the proxy): local_node.py's client ------

# --- processes on the local node, through /proc ---------------------------------------------

def read(path, mode="rb"):
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:
        return None


def process_table():
    """{pid: (ppid, state, argv, env)} of every process this run can see."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = read("/proc/%s/stat" % name)
        if stat is None:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        table[int(name)] = (int(fields[1]), fields[0].decode(), None, None)
    return table


def descendants(root):
    """{pid: {"ppid", "state", "argv", "env", "pod"}} of root's descendants: "pod" is the
    HOSTNAME of the child of root it descends from (local_node.py runs each container as its
    child, with HOSTNAME the pod's name)."""
    table = process_table()
    children = collections.defaultdict(list)
    for pid, (ppid, _, _, _) in table.items():
        children[ppid].append(pid)
    out = {}
    stack = [(c, None) for c in children.get(root, [])]
    while stack:
        pid, pod = stack.pop()
        argv = (read("/proc/%d/cmdline" % pid) or b"").split(b"\0")
        env = {}
        for item in (read("/proc/%d/environ" % pid) or b"").split(b"\0"):
            k, _, v = item.partition(b"=")
            if k:
                env[k.decode(errors="replace")] = v.decode(errors="replace")
        if pod is None:
            pod = env.get("HOSTNAME", "?")
        out[pid] = {"ppid": table[pid][0], "state": table[pid][1], "pod": pod, "env": env,
                    "argv": [a.decode(errors="replace") for a in argv if a]}
        stack.extend((c, pod) for c in children.get(pid, []))
    return out


def role(p):
    """agent, rank, worker or other."""
    exe = os.path.basename(p["argv"][0]) if p["argv"] else ""
    if "SPAWNPOINT_LOADER_WORKER_ID" in p["env"]:
        return "worker"
    if exe == "spawnpoint-agent" or (exe == "sh" and "agent-on-pod-ip.sh" in " ".join(
            p["argv"])):
        return "agent"
    if exe == "spawnpoint-example-trainer" and "RANK" in p["env"]:
        return "rank"
    return "other"


def listening_ports():
    """{port} of the TCP sockets listening now (IPv4 and IPv6)."""
    ports = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in (read(name, "r") or "").splitlines()[1:]:
            parts = line.split()
            if len(parts) > 3 and parts[3] == "0A":
                ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


# --- the run ---------------------------------------------------------------------------------

class Job(object):
    def __init__(self, spec, port):
        self.spec = spec
        self.name = spec["name"]
        self.port = port
        self.faults = list(spec["faults"])
        self.injected = []  # (kind, detail)
        self.missed = []
        self.state = "waiting"  # submitted, deleting, done
        self.uid = None
        self.phase = ""
        self.restarts = 0
        self.status = {}
        self.running_since = None
        self.last_fault_at = None
        self.fault_pending_since = None
        self.submitted_at = None
        self.finished_at = None
        self.history = []  # (t, phase, restarts)
        self.problems = []  # wrong phase, early success, failures without cause
        self.backwards = []
        self.leaks = []
        self.params = {}
        self.delete_deadline = None
        self.told = 0  # when leftovers were last logged
        self.agent_lost = None  # (restarts then, when) after an agent-term, until it restarts
        self.shm_overlap = False  # a /dev/shm-full window fell in its life


class Chaos(object):
    def __init__(self, args):
        self.args = args
        self.seed = args.seed
        self.jobs = [Job(s, 0) for s in make_schedule(args.seed, args.seconds)]
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.counts = collections.Counter()  # faults injected by kind
        self.api_windows = []  # end times
        self.api_rules = []  # (kind, id)
        self.shm_until = None
        self.operator = None
        self.operator_up_at = None
        self.operator_starts = 0
        self.operator_down_until = 0
        self.leaks = []
        self.errors = []
        self.cluster = None
        self.proxy = None

    # --- setup ---
    def start(self):
        a = self.args
        self.tmp = os.path.join(a.work_dir, "tmp")
        os.makedirs(self.tmp, exist_ok=True)
        os.environ["TMPDIR"] = self.tmp  # the agents' run directories, checked at the end
        self.cluster = cluster_fixture.Cluster(a.source_dir, nodes=2)
        self.node_pid = int(read(os.path.join(self.cluster.dir, "cp", "local-node.pid"),
                                 "r").strip())
        self.api = Api(self.cluster.kubeconfig)
        self.cluster.apply_crd()
        proxy_kubeconfig = os.path.join(self.cluster.dir, "proxy.kubeconfig")
        self.proxy = self.cluster.start_process("fault-proxy", [
            os.path.join(self.cluster.tools, "kube-fault-proxy"), "--upstream-kubeconfig",
            self.cluster.kubeconfig, "--kubeconfig-out", proxy_kubeconfig,
            "--seed", str(self.seed)])
        ok = cluster_fixture.wait_until(
            lambda: re.search(r"listening on http://127\.0\.0\.1:(\d+)",
                              self.cluster.log("fault-proxy")) or self.proxy.poll() is not None,
            30, 0.1)
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", self.cluster.log("fault-proxy"))
        if not ok or not m:
            raise RuntimeError("kube-fault-proxy did not start: %s"
                               % self.cluster.log("fault-proxy"))
        self.proxy_port = int(m.group(1))
        self.proxy_kubeconfig = proxy_kubeconfig
        # Every pod gets a loopback address of its own and its agent serves its status there
        # (the operator reads each agent's /status on its pod's address).
        self.agent_wrapper = os.path.join(self.cluster.dir, "agent-on-pod-ip.sh")
        with open(self.agent_wrapper, "w") as f:
            f.write('#!/bin/sh\n: "${POD_IP:?the pod\'s own address}"\nprev=\n'
                    'for a in "$@"; do\n  shift\n'
                    '  if [ "$prev" = --metrics-addr ]; then a="$POD_IP$a"; fi\n'
                    '  set -- "$@" "$a"\n  prev=$a\ndone\nexec %s "$@"\n'
                    % os.path.join(a.build_dir, "bin", "spawnpoint-agent"))
        os.chmod(self.agent_wrapper, 0o755)
        self.status_port = cluster_fixture.free_port()
        if not cluster_fixture.wait_until(lambda: self.api.call(
                "GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200, 60):
            raise RuntimeError("no default ServiceAccount")
        self.start_operator()
        threading.Thread(target=self.watch_jobs, daemon=True).start()

    def start_operator(self):
        self.operator_starts += 1
        bin_dir = os.path.join(self.args.build_dir, "bin")
        self.operator = self.cluster.start_process("operator-%d" % self.operator_starts, [
            os.path.join(bin_dir, "spawnpoint-operator"), "--kubeconfig", self.proxy_kubeconfig,
            "--namespace", NS, "--agent-path", self.agent_wrapper, "--master-addr", "127.0.0.1",
            "--health-addr", "off", "--metrics-addr", "off",
            "--agent-status-port", str(self.status_port), "--utilisation-interval", "0",
            "--gang-status-interval", "300ms", "--log-level", "debug"])
        self.operator_up_at = None

    def proxy_call(self, method, path, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.proxy_port, timeout=10)
        try:
            conn.request(method, path, body=body, headers={"Content-Type": "text/plain"})
            resp = conn.getresponse()
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw else {})
        finally:
            conn.close()

    # --- watching every job's status throughout ---
    def watch_jobs(self):
        while not self.stop.is_set():
            try:
                code, listing = self.api.call("GET", TJ_PATH)
                if code != 200:
                    raise RuntimeError("listing TrainingJobs: HTTP %d" % code)
                for obj in listing.get("items", []):
                    self.observe(obj)
                rv = listing["metadata"]["resourceVersion"]
                for event in self.api.watch(TJ_PATH, rv, timeout_s=60):
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self.observe(event["object"])
                    elif event.get("type") == "ERROR":
                        break
                    if self.stop.is_set():
                        return
            except Exception as err:  # the next round lists again
                if not self.stop.is_set():
                    log("status watch: %s; listing again" % err)
                    self.stop.wait(0.5)

    def observe(self, obj):
        name = obj["metadata"]["name"]
        job = next((j for j in self.jobs if j.name == name), None)
        if job is None or obj["metadata"]["uid"] != job.uid and job.uid is not None:
            return
        st = obj.get("status") or {}
        phase = st.get("phase", "")
        restarts = int(st.get("restarts", 0) or 0)
        with self.lock:
            job.uid = obj["metadata"]["uid"]
            now = time.monotonic()
            if restarts < job.restarts:
                job.backwards.append("restarts %d -> %d" % (job.restarts, restarts))
            if phase != job.phase and phase not in LEGAL.get(job.phase, set()):
                job.backwards.append("phase %s -> %s" % (job.phase or "(none)", phase))
            if restarts > job.restarts and not (st.get("lastFailure") or {}).get("reason"):
                job.problems.append("restarts %d -> %d without lastFailure.reason"
                                    % (job.restarts, restarts))
            if phase != job.phase or restarts != job.restarts:
                job.history.append((round(now - T0, 1), phase, restarts))
            if phase == "Running" and job.phase != "Running":
                job.running_since = now
            if phase != "Running":
                job.running_since = None
            if phase in TERMINAL and job.phase not in TERMINAL:
                job.finished_at = now
                if phase == "Succeeded":
                    # Succeeded only once every rank has ended training: both final lines.
                    job.params = self.final_params(job)
                    if sorted(job.params) != [0, 1]:
                        job.problems.append("Succeeded early: final lines of ranks %s only"
                                            % sorted(job.params))
            if job.phase not in TERMINAL:
                job.phase = phase
            job.restarts = max(job.restarts, restarts)
            job.status = st

    def final_params(self, job):
        """{rank: params} from the last final line of each rank in the job's pod logs."""
        params = {}
        pods = os.path.join(self.cluster.node_dir, "pods")
        dirs = []
        for d in os.listdir(pods) if os.path.isdir(pods) else []:
            if d.startswith("%s_%s-node-" % (NS, job.name)):
                path = os.path.join(pods, d, "trainer.log")
                if os.path.exists(path):
                    dirs.append((os.path.getmtime(path), path))
        for _, path in sorted(dirs):
            for rank, value in FINAL.findall(read(path, "r") or ""):
                params[int(rank)] = value
        return params

    # --- faults ---
    def pod_processes(self, pod, want):
        return sorted(pid for pid, p in descendants(self.node_pid).items()
                      if p["pod"] == pod and role(p) == want and p["state"] not in "ZT")

    def inject(self, job, fault):
        """True when fault was injected (or can never be), False to try again shortly."""
        kind = fault["kind"]
        now = time.monotonic()
        if kind in LOCAL_FAULTS:
            pod = "%s-node-%d" % (job.name, fault["node"])
            want = {"rank-kill": "rank", "worker-kill": "worker", "worker-stop": "worker",
                    "agent-term": "agent"}[kind]
            pids = self.pod_processes(pod, want)
            if not pids:
                return False
            sig = {"rank-kill": signal.SIGKILL, "worker-kill": signal.SIGKILL,
                   "worker-stop": signal.SIGSTOP, "agent-term": signal.SIGTERM}[kind]
            # The agent's wrapper execs it: the agent is the pod's first process.
            os.kill(pids[0], sig)
            if kind == "agent-term":
                with self.lock:
                    job.agent_lost = (job.restarts, now)
            detail = "%s pid %d of %s" % (want, pids[0], pod)
        elif kind == "operator-kill":
            self.operator.kill()
            self.operator.wait()
            self.operator_down_until = now + fault["down"]
            self.operator = None
            detail = "SIGKILL, restarted after %ss" % fault["down"]
        elif kind == "api-faults":
            ids = []
            for rule_kind, spec in fault["rules"]:
                code, body = self.proxy_call("POST", "/testing/faults", spec)
                if code >= 300:
                    raise RuntimeError("adding fault %s: HTTP %d %s" % (spec, code, body))
                ids.append((rule_kind, max(r["id"] for r in body["rules"])))
            self.api_rules.extend(ids)
            self.api_windows.append(now + fault["window"])
            detail = "%ss: %s" % (fault["window"], ";".join(s for _, s in fault["rules"]))
        else:  # shm-full
            if not self.args.private_shm:
                job.missed.append("shm-full: no private /dev/shm (not root?)")
                return True
            fill_shm(self.args.shm_left_kb)
            self.shm_until = now + fault["window"]
            for other in self.jobs:
                if other.state == "submitted":
                    other.shm_overlap = True
            detail = "%ss, %d KiB left" % (fault["window"], free_kb("/dev/shm"))
        self.counts[kind if kind != "api-faults" else "api-window"] += 1
        job.injected.append((kind, detail))
        log("fault %s (job %s): %s" % (kind, job.name, detail))
        return True

    def end_windows(self, now, force=False):
        if self.api_windows and (force or max(self.api_windows) <= now):
            self.collect_api_faults()
            self.proxy_call("DELETE", "/testing/faults")
            self.api_windows = []
            log("API faults cleared")
        if self.shm_until is not None and (force or self.shm_until <= now):
            unfill_shm()
            self.shm_until = None
            log("/dev/shm freed")
        if self.operator is None and (force or now >= self.operator_down_until):
            self.start_operator()
            log("operator started again (%d)" % self.operator_starts)

    def collect_api_faults(self):
        code, body = self.proxy_call("GET", "/testing/faults")
        fired = {r["id"]: r["fired"] for r in body.get("rules", [])} if code == 200 else {}
        for kind, rule_id in self.api_rules:
            self.counts[kind] += fired.get(rule_id, 0)
        self.api_rules = []

    # --- jobs ---
    def manifest(self, job):
        s = job.spec
        trainer = os.path.join(self.args.build_dir, "bin", "spawnpoint-example-trainer")
        return {"apiVersion": "spawnpoint.dev/v1alpha1", "kind": "TrainingJob",
                "metadata": {"name": job.name, "namespace": NS},
                "spec": {
                    "nodes": 2, "procsPerNode": 1, "backend": "gloo",
                    "template": {
                        "metadata": {"annotations": {
                            "local-node.spawnpoint.dev/own-pod-ip": "true"}},
                        "spec": {"containers": [{
                            "name": "trainer", "image": "spawnpoint/example-trainer:latest",
                            "command": [trainer],
                            "args": ["--epochs", str(s["epochs"]), "--steps-per-epoch",
                                     str(self.args.steps), "--batch-size", "32"],
                            "env": [{"name": "POD_IP", "valueFrom": {
                                "fieldRef": {"fieldPath": "status.podIP"}}}]}]}},
                    "loader": {"workersPerRank": s["workers"], "timeoutSeconds": 10},
                    "restartPolicy": dict({"mode": s["mode"],
                                           "maxRestarts": s["maxRestarts"],
                                           "backoffSeconds": 1},
                                          **({} if s["budget"] else {"retryOn": RETRY_ON})),
                    "rendezvous": {"port": job.port}, "shmSize": "128Mi"}}

    def submit(self, job):
        job.port = cluster_fixture.free_port()
        code, out = self.cluster.kubectl("apply", "-f", "-",
                                         stdin=json.dumps(self.manifest(job)))
        if code != 0:
            raise RuntimeError("kubectl apply %s: %s" % (job.name, out))
        job.state = "submitted"
        job.submitted_at = time.monotonic()
        if self.shm_until is not None:
            job.shm_overlap = True
        log("job %s submitted (%s, rendezvous port %d)" % (job.name, job.spec["mode"],
                                                          job.port))

    def step_job(self, job, now):
        with self.lock:
            phase, running_since = job.phase, job.running_since
        if job.state == "submitted":
            if phase in TERMINAL:
                self.finish(job)
                return
            if now - job.submitted_at > self.args.job_deadline:
                job.problems.append("not finished within %d s (phase %s)"
                                    % (self.args.job_deadline, phase or "none"))
                self.delete(job)
                return
            if not job.faults or running_since is None:
                job.fault_pending_since = None
                return
            start = max(running_since, job.last_fault_at or 0)
            fault = job.faults[0]
            if now - start < fault["after"]:
                return
            if fault["kind"] == "operator-kill" and self.operator is None:
                return  # still down from the last one
            if self.shm_until is not None and not fault.get("under_shm"):
                return  # /dev/shm is full: only the restart meant to meet it (shm_quiet)
            if fault["kind"] == "shm-full" and not self.shm_quiet(job, now):
                return
            if self.inject(job, fault):
                job.faults.pop(0)
                job.last_fault_at = now
                job.fault_pending_since = None
            else:
                job.fault_pending_since = job.fault_pending_since or now
                if now - job.fault_pending_since > 20:
                    job.missed.append("%s: no process to signal" % fault["kind"])
                    job.faults.pop(0)
                    job.fault_pending_since = None
        elif job.state == "deleting":
            self.check_deleted(job, now)

    def shm_quiet(self, job, now):
        """Whether /dev/shm may fill now: every job has run for a while and no pod is about to
        be recreated (an agent SIGTERMed: its pod comes back with a new agent). An agent
        starting under a full /dev/shm fails its pod for good (exit 1: the agent's check says
        spec.shmSize is too small), as it should on a real node, where /dev/shm is each pod's
        own emptyDir and empty when the pod starts; the local node's pods share this machine's
        instead. So only a rank restarted in place (its agent and pod stay) meets it."""
        with self.lock:
            for o in self.jobs:
                if o.agent_lost and (o.restarts > o.agent_lost[0] or now - o.agent_lost[1] > 60):
                    o.agent_lost = None  # its pod came back (a restart counted)
            # Every job running for a while, none with a SIGTERMed agent whose pod (and a new
            # agent) has yet to come back, the anchor job included.
            jobs = [o for o in self.jobs if o.state == "submitted"]
            if not all(o.running_since is not None and now - o.running_since > 3 and
                       not o.agent_lost for o in jobs):
                return False
        # And every rank's loader is up (its ring reserved): a job's first ranks start slowly
        # on a busy machine or under a sanitizer, long after the pods run.
        return all(len(self.loader_ranks(o)) >= 2 for o in jobs)

    def loader_ranks(self, job):
        """The ranks whose loader started, from the job's pod logs."""
        pods = os.path.join(self.cluster.node_dir, "pods")
        ranks = set()
        for d in os.listdir(pods) if os.path.isdir(pods) else []:
            if d.startswith("%s_%s-node-" % (NS, job.name)):
                text = read(os.path.join(pods, d, "trainer.log"), "r") or ""
                ranks.update(LOADER_UP.findall(text))
        return ranks

    def finish(self, job):
        for f in job.faults:
            job.missed.append("%s: the job ended first" % f["kind"])
        job.faults = []
        st = job.status
        lf = st.get("lastFailure") or {}
        conds = {c.get("type"): c for c in st.get("conditions", [])}
        if job.spec["budget"]:
            allowed = {"Killed"}
            if job.shm_overlap:
                allowed |= {"ShmExhausted", "AgentError"}
            failed = conds.get("Failed", {})
            if job.phase != "Failed":
                job.problems.append("phase %s, expected Failed (maxRestarts 0, a rank killed)"
                                    % job.phase)
            elif not any(k == "rank-kill" for k, _ in job.injected):
                job.problems.append("Failed before its rank was killed: %s %s"
                                    % (lf.get("reason"), lf.get("message")))
            elif lf.get("reason") not in allowed or failed.get("status") != "True":
                job.problems.append("Failed with cause %s (condition %s), expected %s"
                                    % (lf.get("reason"), failed.get("reason"),
                                       "/".join(sorted(allowed))))
        else:
            if job.phase != "Succeeded":
                job.problems.append("phase %s, expected Succeeded (retryable faults within "
                                    "maxRestarts %d): lastFailure %s %s"
                                    % (job.phase, job.spec["maxRestarts"], lf.get("reason"),
                                       lf.get("message")))
            elif len(set(job.params.values())) != 1 or sorted(job.params) != [0, 1]:
                job.problems.append("Succeeded with params %s" % job.params)
            if job.restarts > job.spec["maxRestarts"]:
                job.problems.append("restarts %d > maxRestarts %d"
                                    % (job.restarts, job.spec["maxRestarts"]))
        if job.phase == "Failed" and not lf.get("reason"):
            # (A spec the operator refuses is no failure of a run: its condition says why.)
            failed = conds.get("Failed", {})
            job.problems.append("Failed without a cause in status.lastFailure (condition %s: %s)"
                                % (failed.get("reason"), failed.get("message")))
        log("job %s %s restarts=%d lastFailure=%s params=%s history=%s" % (
            job.name, job.phase, job.restarts, lf.get("reason"),
            sorted(set(job.params.values())), job.history))
        self.delete(job)

    def delete(self, job):
        code, out = self.cluster.kubectl("delete", "tj", job.name, "--wait=true",
                                         "--timeout=120s")
        if code != 0:
            self.errors.append("kubectl delete tj %s: %s" % (job.name, out))
        job.state = "deleting"
        job.delete_deadline = time.monotonic() + 120

    def job_leftovers(self, job):
        prefix = job.name + "-node-"
        code, pods = self.api.call("GET", "/api/v1/namespaces/%s/pods" % NS)
        left = ["pod %s" % p["metadata"]["name"] for p in pods.get("items", [])
                if p["metadata"]["name"].startswith(prefix)] if code == 200 else ["pods?"]
        left += ["process %d (%s of %s, state %s)" % (pid, role(p), p["pod"], p["state"])
                 for pid, p in descendants(self.node_pid).items()
                 if p["pod"].startswith(prefix)]
        ports = listening_ports()
        left += ["listening socket on port %d" % port
                 for port in (job.port, job.port + 1) if port in ports]
        return left

    def check_deleted(self, job, now):
        left = self.job_leftovers(job)
        if not left:
            job.state = "done"
            log("job %s deleted: nothing left" % job.name)
        elif now > job.delete_deadline - 110 and now > job.told + 10:
            job.told = now
            log("job %s deleted: still there: %s" % (job.name, left))
        if job.state != "done" and now > job.delete_deadline:
            job.leaks.extend(left)
            job.state = "done"
            log("job %s deleted: LEFT %s" % (job.name, left))

    # --- the loop ---
    def run(self):
        waiting = list(self.jobs)
        deadline = time.monotonic() + self.args.seconds * 4 + 300
        while True:
            now = time.monotonic()
            if now > deadline:
                self.errors.append("the run did not end within %d s" % (deadline - T0))
                break
            active = [j for j in self.jobs if j.state == "submitted"]
            while waiting and len(active) < self.args.concurrency and self.shm_until is None:
                job = waiting.pop(0)
                self.submit(job)
                active.append(job)
            for job in self.jobs:
                self.step_job(job, now)
            self.end_windows(now)
            if self.operator is not None and self.operator.poll() is not None:
                self.errors.append("the operator exited by itself (%s), see %s"
                                   % (self.operator.returncode, self.cluster.dir))
                log("operator exited by itself: %s" % self.operator.returncode)
                self.start_operator()
            if not waiting and all(j.state == "done" for j in self.jobs):
                break
            time.sleep(0.2)  # the loop's cadence: every check above polls with a deadline
        self.end_windows(time.monotonic(), force=True)

    def final_leaks(self):
        """What is left once every job is deleted, given 120 s to go (the garbage collector
        and the node's grace periods)."""
        deadline = time.monotonic() + 120
        while True:
            code, pods = self.api.call("GET", "/api/v1/namespaces/%s/pods" % NS)
            pods = [p["metadata"]["name"] for p in pods.get("items", [])] if code == 200 \
                else ["(pods not listed: HTTP %d)" % code]
            procs = descendants(self.node_pid)
            if not (pods or procs) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        leaks = ["pod %s" % name for name in pods]
        leaks += ["process %d (%s of %s): %s" % (pid, role(p), p["pod"], " ".join(p["argv"]))
                  for pid, p in procs.items()]
        if self.args.private_shm:
            leaks += ["shm file /dev/shm/%s" % n for n in os.listdir("/dev/shm")]
        else:
            leaks += ["shm file /dev/shm/%s" % n for n in os.listdir("/dev/shm")
                      if n not in self.shm_before and n.startswith("spawnpoint-")]
        ports = listening_ports()
        leaks += ["listening socket on port %d" % p for p in [self.status_port] if p in ports]
        for line in (read("/proc/net/unix", "r") or "").splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 8 and parts[7].startswith(self.tmp) and parts[5] == "01":
                leaks.append("listening unix socket %s" % parts[7])
        return leaks

    def report(self):
        faults = sum(self.counts.values())
        succeeded = sum(1 for j in self.jobs if j.phase == "Succeeded" and not j.spec["budget"]
                        and not j.problems)
        failed_ok = sum(1 for j in self.jobs if j.spec["budget"] and not j.problems)
        wrong = sum(1 for j in self.jobs if j.problems)
        backwards = sum(len(j.backwards) for j in self.jobs)
        leaks = sum(len(j.leaks) for j in self.jobs) + len(self.leaks)
        print("")
        print("faults injected by kind")
        for kind in LOCAL_FAULTS + ("operator-kill", "api-window") + API_KINDS + ("shm-full",):
            print("  %-16s %d" % (kind, self.counts.get(kind, 0)))
        print("jobs by outcome")
        print("  %-9s %-9s %-10s %-9s %-8s %s" % ("job", "mode", "phase", "restarts",
                                                  "expected", "faults injected / notes"))
        for j in self.jobs:
            notes = ",".join(k for k, _ in j.injected) or "-"
            if j.missed:
                notes += "; not injected: " + ", ".join(j.missed)
            print("  %-9s %-9s %-10s %-9s %-8s %s" % (
                j.name, j.spec["mode"], j.phase or "-", "%d/%d" % (j.restarts,
                                                                  j.spec["maxRestarts"]),
                "Failed" if j.spec["budget"] else "Succeeded", notes))
            for p in j.problems:
                print("    WRONG: %s" % p)
            for b in j.backwards:
                print("    BACKWARDS: %s" % b)
        print("leaks found: %d" % leaks)
        for j in self.jobs:
            for leak in j.leaks:
                print("  %s: %s" % (j.name, leak))
        for leak in self.leaks:
            print("  after the run: %s" % leak)
        stale = sorted(os.listdir(self.tmp)) if os.path.isdir(self.tmp) else []
        if stale:
            print("files left in the agents' TMPDIR (not counted): %s" % ", ".join(stale))
        print("status went backwards: %d" % backwards)
        for e in self.errors:
            print("ERROR: %s" % e)
        print("chaos seed=%d faults=%d jobs=%d succeeded=%d failed_as_expected=%d wrong_phase=%d "
              "leaks=%d" % (self.seed, faults, len(self.jobs), succeeded, failed_ok, wrong,
                            leaks))
        sys.stdout.flush()
        return 0 if not (wrong or leaks or backwards or self.errors) else 1


# --- /dev/shm nearly full, always undone -------------------------------------------------------

def free_kb(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize // 1024


def fill_shm(left_kb):
    """Grows the fill file until left_kb are free. The jobs' rings may take space meanwhile
    (their slots are reserved in the background): an allocation that fails (ENOSPC, undone
    by tmpfs) is tried again with what is free then."""
    fd = os.open(FILL, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        for _ in range(50):
            size = (free_kb("/dev/shm") - left_kb) * 1024
            if size <= 0:
                return
            try:
                os.posix_fallocate(fd, os.fstat(fd).st_size, size)
                return
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)


def unfill_shm():
    try:
        os.unlink(FILL)
    except FileNotFoundError:
        pass


def enter_private_shm(args):
    """As root: re-executes this program in a mount namespace of its own (once) and mounts a
    tmpfs of --shm-mb on its /dev/shm. True when /dev/shm is this run's own."""
    if os.environ.get(PRIVATE_ENV) == "1":
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%dm,mode=1777" % args.shm_mb,
                               "chaos-shm", "/dev/shm"], stderr=subprocess.PIPE,
                              universal_newlines=True)
        if proc.returncode != 0:
            log("no private /dev/shm (%s): shm-full is skipped" % proc.stderr.strip())
            return False
        return True
    if os.geteuid() == 0 and shutil.which("unshare"):
        probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                               stderr=subprocess.DEVNULL)
        if probe.returncode == 0:
            sys.stdout.flush()
            os.execvpe("unshare", ["unshare", "-m", "--propagation", "private", "--",
                                   sys.executable] + sys.argv,
                       dict(os.environ, **{PRIVATE_ENV: "1"}))
    log("not root or no unshare: /dev/shm is shared with the machine; shm-full is skipped")
    return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--seconds", type=int, default=int(os.environ.get("CHAOS_SECONDS", 240)))
    ap.add_argument("--concurrency", type=int, default=2, help="jobs running at once")
    ap.add_argument("--steps", type=int, default=120, help="steps per epoch of each job")
    ap.add_argument("--job-deadline", type=int, default=300)
    ap.add_argument("--shm-mb", type=int, default=1024, help="the private /dev/shm's size")
    ap.add_argument("--shm-left-kb", type=int, default=16, help="free space while full")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    if args.seed is None:
        env_seed = os.environ.get("CHAOS_SEED", "")
        args.seed = int(env_seed) if env_seed else int(time.time()) % 100000
    args.source_dir = os.path.abspath(args.source_dir)
    args.build_dir = os.path.abspath(args.build_dir)
    args.private_shm = enter_private_shm(args)
    jobs = make_schedule(args.seed, args.seconds)
    print_schedule(args.seed, args.seconds, jobs)
    log("replay: make chaos CHAOS_SEED=%d CHAOS_SECONDS=%d" % (args.seed, args.seconds))

    atexit.register(unfill_shm)

    def on_signal(signum, frame):
        unfill_shm()
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    import tempfile
    args.work_dir = tempfile.mkdtemp(prefix="spawnpoint-chaos-")
    tempfile.tempdir = args.work_dir  # the cluster's directory; TMPDIR (the agents') is apart
    chaos = Chaos(args)
    chaos.shm_before = set(os.listdir("/dev/shm"))
    started = time.monotonic()
    try:
        chaos.start()
        chaos.run()
    except BaseException as err:  # SIGTERM/SIGINT (SystemExit) too: clean up all the same
        chaos.errors.append("%s: %s" % (type(err).__name__, err))
        log("run aborted: %s" % err)
        for job in chaos.jobs if chaos.cluster is not None else []:
            if job.state == "submitted":
                chaos.cluster.kubectl("delete", "tj", job.name, "--wait=true", "--timeout=60s")
    finally:
        unfill_shm()
        chaos.stop.set()
    if chaos.cluster is not None:
        try:
            chaos.leaks = chaos.final_leaks()
        except Exception as err:
            chaos.errors.append("leak check: %s" % err)
    log("run took %.0f s" % (time.monotonic() - started))
    code = chaos.report()
    if chaos.cluster is not None:
        if code != 0 or args.keep:
            kept = os.path.join(args.work_dir, "cluster")
            shutil.copytree(chaos.cluster.dir, kept, symlinks=True,
                            ignore=shutil.ignore_patterns("etcd*", "*.sock"))
            print("logs: %s" % kept)
        chaos.cluster.stop()
    if code == 0 and not args.keep:
        shutil.rmtree(args.work_dir, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
