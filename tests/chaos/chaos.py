#!/usr/bin/python3
"""The chaos run of issue 15: the real operator (build/bin/spawnpoint-operator) behind
kube-fault-proxy, the real control plane of scripts/cluster.sh with local_node.py's two
nodes (tests/cluster/cluster_fixture.py), and two-node TrainingJobs of the example trainer
with loader workers, while a seeded schedule combines faults: the operator SIGKILLed and
restarted, the API server's 409/429/500, latency and cut watches, a rank SIGKILLed, a loader
worker SIGKILLed and one SIGSTOPped, an agent SIGTERMed, /dev/shm nearly full. Then it checks
every job's phase, parameters, status history and failure causes, what is left behind, and
that every planned fault was injected (tests/chaos/schedule.py plans and tallies them).

    chaos.py --source-dir REPO --build-dir BUILD [--seed S] [--seconds N]

CHAOS_SEED and CHAOS_SECONDS (environment) are the defaults of --seed and --seconds. The
schedule is a pure function of (seed, seconds), printed first: a failing seed replays.
The last line is
    chaos seed=S faults=N jobs=N succeeded=N failed_as_expected=N wrong_phase=N leaks=N \
        KIND=INJECTED/MISSED ... missed=N
(also written to --summary-file) and the exit code is 1 on any wrong phase, leak, status that
went backwards or planned fault not injected.

It runs in a mount namespace of its own (without root, in a user namespace of its own too)
whose /dev/shm is a private tmpfs of --shm-mb (a pod's memory-backed /dev/shm emptyDir):
filling it nearly full then costs that much memory at most, and its leak check sees only this
run's files. Standard library only, and local_node.py's API client (with python3-yaml).
"""

import argparse
import atexit
import collections
import errno
import http.client
import json
import os
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
import schedule  # noqa: E402  (this folder's)

NS = "default"
TJ_PATH = "/apis/spawnpoint.dev/v1alpha1/namespaces/%s/trainingjobs" % NS
PRIVATE_ENV = "SPAWNPOINT_CHAOS_PRIVATE_SHM"  # set in the namespace of the run's own
OUTSIDE_UID_ENV = "SPAWNPOINT_CHAOS_OUTSIDE_UID"  # the uid that started the run
FILL = "/dev/shm/chaos-fill"
# The example trainer's line at each epoch's start: rank, epoch, attempt (its restart count).
LOADER_UP = re.compile(r"loader rank=(\d+) epoch=(\d+) restart=(\d+)")
FINAL = re.compile(r"final rank=(\d+) loss=\S+ params=([0-9a-f]+)")
TERMINAL = ("Succeeded", "Failed")
# Phase moves the status may make (docs/trainingjob.md): forward, and Running <-> Restarting.
LEGAL = {"": {"Pending", "Running", "Restarting", "Succeeded", "Failed"},
         "Pending": {"Running", "Restarting", "Succeeded", "Failed"},
         "Running": {"Restarting", "Succeeded", "Failed"},
         "Restarting": {"Running", "Succeeded", "Failed"},
         "Succeeded": set(), "Failed": set()}
LOCAL_FAULTS, RESTARTING, KINDS = schedule.LOCAL_FAULTS, schedule.RESTARTING, schedule.KINDS


def log(msg):
    sys.stdout.write("[%7.1f] %s\n" % (time.monotonic() - T0, msg))
    sys.stdout.flush()


T0 = time.monotonic()
HURRIED_GAP = 1.0  # seconds between two hurried faults of a job (see Chaos.hurried)


def print_schedule(seed, seconds, jobs):
    for line in schedule.schedule_lines(seed, seconds, jobs):
        log(line)


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
        self.missed = []  # "kind: why"
        self.state = "waiting"  # submitted, deleting, done
        self.uid = None
        self.phase = ""
        self.restarts = 0
        self.status = {}
        self.running_since = None
        self.last_fault_at = None
        self.fault_pending_since = None
        # The attempt (restart count) running when its last restarting fault was injected:
        # faults are hurried (see hurried) only in a later attempt.
        self.restarted_from = -1
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
    def __init__(self, args, jobs):
        self.args = args
        self.seed = args.seed
        self.jobs = [Job(s, 0) for s in jobs]
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.tally = schedule.Tally(jobs)  # faults planned, injected and missed by kind
        self.api_windows = []  # end times
        self.api_rules = []  # (kind, id, spec, job name) of the rules of the open window(s)
        self.api_told = 0  # when a window held open for its rules was last logged
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

    def inject(self, job, fault, note=""):
        """True when fault was injected (or can never be: then missed), False to try again
        shortly. note: what the log line adds (a hurried fault says so)."""
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
            if kind in RESTARTING:
                progress = self.attempt_progress(job)
                job.restarted_from = progress[0] if progress else -1
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
                ids.append((rule_kind, max(r["id"] for r in body["rules"]), spec, job.name))
            self.api_rules.extend(ids)
            self.api_windows.append(now + fault["window"])
            detail = "%ss: %s" % (fault["window"], ";".join(s for _, s in fault["rules"]))
        else:  # shm-full
            if self.args.shm_problem:
                self.miss(job, fault, "no private /dev/shm: %s" % self.args.shm_problem)
                return True
            fill_shm(self.args.shm_left_kb)
            self.shm_until = now + fault["window"]
            for other in self.jobs:
                if other.state == "submitted":
                    other.shm_overlap = True
            detail = "%ss, %d KiB left" % (fault["window"], free_kb("/dev/shm"))
        self.tally.inject(schedule.kind_of(fault))
        job.injected.append((kind, detail))
        log("fault %s (job %s): %s%s" % (kind, job.name, detail, note))
        return True

    def miss(self, job, fault, why):
        """A planned fault not injected: missed (the run fails), with why; an API window's
        rules with it."""
        kind = schedule.kind_of(fault)
        self.tally.miss(kind, "%s (job %s): %s" % (kind, job.name, why))
        job.missed.append("%s: %s" % (fault["kind"], why))
        for rule_kind, spec in fault.get("rules", ()):
            self.tally.miss(rule_kind, "%s (job %s): %s: its window never opened"
                            % (rule_kind, job.name, spec))
        log("fault %s (job %s) NOT injected: %s" % (fault["kind"], job.name, why))

    def drop_faults(self, job, why):
        """Every fault still planned for job is missed: why, and for the first, how long it
        found no process to signal."""
        for k, f in enumerate(job.faults):
            waited = ""
            if k == 0 and job.fault_pending_since is not None and \
                    time.monotonic() - job.fault_pending_since >= 1:
                waited = " (no process to signal for %.0f s)" % (
                    time.monotonic() - job.fault_pending_since)
            self.miss(job, f, why + waited)
        job.faults = []

    def end_windows(self, now, force=False):
        """Ends the API window once its time is over and every rule has fired (held open up
        to --api-hold s longer for one that has not: its requests may be late on a busy
        machine), /dev/shm's, and the operator's time down."""
        if self.api_windows and (force or max(self.api_windows) <= now):
            over = now - max(self.api_windows)
            unfired = [] if force else [spec for spec, n in self.api_fired() if n == 0]
            if unfired and over < self.args.api_hold:
                if now - self.api_told >= 5:
                    self.api_told = now
                    log("API faults held open %.0f s past their window for: %s"
                        % (over, "; ".join(unfired)))
            else:
                fired = self.collect_api_faults()
                self.proxy_call("DELETE", "/testing/faults")
                self.api_windows = []
                log("API faults cleared (fired: %s)" % ", ".join(
                    "%s x%d" % (spec, n) for spec, n in fired))
        if self.shm_until is not None and (force or self.shm_until <= now):
            unfill_shm()
            self.shm_until = None
            log("/dev/shm freed")
        if self.operator is None and (force or now >= self.operator_down_until):
            self.start_operator()
            log("operator started again (%d)" % self.operator_starts)

    def api_fired(self):
        """[(spec, times fired)] of the open window's rules, from the proxy."""
        code, body = self.proxy_call("GET", "/testing/faults")
        if code != 200:
            raise RuntimeError("reading the fault rules: HTTP %d %s" % (code, body))
        fired = {r["id"]: r["fired"] for r in body.get("rules", [])}
        return [(spec, fired.get(rule_id, 0)) for _, rule_id, spec, _ in self.api_rules]

    def collect_api_faults(self):
        """Tallies the open window's rules (a rule that never fired is missed): their
        [(spec, times fired)]."""
        fired = self.api_fired()
        for (kind, _, spec, name), (_, n) in zip(self.api_rules, fired):
            self.tally.rule_read(kind, n, " (job %s): %s" % (name, spec))
        self.api_rules = []
        return fired

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
                                          **({} if s["budget"] else
                                             {"retryOn": schedule.RETRY_ON})),
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
                self.drop_faults(job, "the job did not finish within %d s"
                                 % self.args.job_deadline)
                self.delete(job)
                return
            if not job.faults:
                return
            fault = job.faults[0]
            due = running_since is not None and \
                now - max(running_since, job.last_fault_at or 0) >= fault["after"]
            note = ""
            if not due:
                hurry = self.hurried(job)
                if hurry is None or now - (job.last_fault_at or 0) < HURRIED_GAP:
                    return
                note = " (hurried: attempt %d began epoch %d of %d)" % (
                    hurry[0], hurry[1], job.spec["epochs"])
            if fault["kind"] == "operator-kill" and self.operator is None:
                return  # still down from the last one
            if self.shm_until is not None and not (fault.get("under_shm") or
                                                   job.spec["budget"]):
                # /dev/shm is full: only the restart meant to meet it (shm_quiet), and the
                # budget job's rank, whose job fails on its kill whatever its cause then.
                return
            if fault["kind"] == "shm-full" and not self.shm_quiet(job, now):
                return
            if self.inject(job, fault, note):
                job.faults.pop(0)
                job.last_fault_at = now
                job.fault_pending_since = None
                job.told = 0
            else:  # no process to signal yet: tried again until the job ends
                job.fault_pending_since = job.fault_pending_since or now
                if now - job.fault_pending_since > 20 and now > job.told + 20:
                    job.told = now
                    log("fault %s (job %s): no process to signal for %.0f s; still trying"
                        % (fault["kind"], job.name, now - job.fault_pending_since))
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

    def epochs_begun(self, job):
        """[(attempt, rank, epoch)] of every epoch the job's ranks began, from its pod logs."""
        pods = os.path.join(self.cluster.node_dir, "pods")
        begun = []
        for d in os.listdir(pods) if os.path.isdir(pods) else []:
            if d.startswith("%s_%s-node-" % (NS, job.name)):
                text = read(os.path.join(pods, d, "trainer.log"), "r") or ""
                begun += [(int(a), int(r), int(e)) for r, e, a in LOADER_UP.findall(text)]
        return begun

    def loader_ranks(self, job):
        """The ranks whose loader started, from the job's pod logs."""
        return set(rank for _, rank, _ in self.epochs_begun(job))

    def attempt_progress(self, job):
        """(attempt, epoch): the newest attempt any of the job's ranks began an epoch in and
        the furthest epoch begun in it, or None."""
        begun = self.epochs_begun(job)
        if not begun:
            return None
        attempt = max(a for a, _, _ in begun)
        return attempt, max(e for a, _, e in begun if a == attempt)

    def hurried(self, job):
        """(attempt, epoch) when the job's faults are hurried: its newest attempt, later than
        the one its last restarting fault met, has begun one of its last two epochs. Its next
        fault then fires HURRIED_GAP s after the last without waiting for its `after` or for
        the Running phase, either of which could come after the job's end on a fast machine
        or behind a slow operator. None otherwise."""
        progress = self.attempt_progress(job)
        if progress is None or progress[0] <= job.restarted_from:
            return None
        return progress if progress[1] >= job.spec["epochs"] - 2 else None

    def finish(self, job):
        self.drop_faults(job, "the job ended first")
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
        if not self.args.shm_problem:
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
        # The agents' run directories (pool sockets, rings' files, progress records) go with
        # their agents: whatever is left in their TMPDIR is a leak.
        for name in sorted(os.listdir(self.tmp)) if os.path.isdir(self.tmp) else []:
            path = os.path.join(self.tmp, name)
            inside = sum(len(files) for _, _, files in os.walk(path))
            leaks.append("left in the agents' TMPDIR: %s%s" % (
                name, " (a directory of %d files)" % inside if os.path.isdir(path) else ""))
        return leaks

    def report(self):
        """Prints the tables and sets self.summary, the summary line; 0 when the run
        passed."""
        self.tally.close()
        tally = self.tally
        succeeded = sum(1 for j in self.jobs if j.phase == "Succeeded" and not j.spec["budget"]
                        and not j.problems)
        failed_ok = sum(1 for j in self.jobs if j.spec["budget"] and not j.problems)
        wrong = sum(1 for j in self.jobs if j.problems)
        backwards = sum(len(j.backwards) for j in self.jobs)
        leaks = sum(len(j.leaks) for j in self.jobs) + len(self.leaks)
        missed = tally.total_missed()
        print("")
        print("faults by kind (an API kind: its rules, and how often they fired)")
        print("  %-16s %-8s %-9s %s" % ("kind", "minimum", "injected", "missed"))
        for kind in KINDS:
            print("  %-16s %-8d %-9d %d" % (kind, tally.planned[kind], tally.injected[kind],
                                           tally.missed[kind]))
        for _, why in tally.reasons:
            print("  MISSED: %s" % why)
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
        print("status went backwards: %d" % backwards)
        for e in self.errors:
            print("ERROR: %s" % e)
        line = ("chaos seed=%d faults=%d jobs=%d succeeded=%d failed_as_expected=%d "
                "wrong_phase=%d leaks=%d %s missed=%d"
                % (self.seed, sum(tally.injected.values()), len(self.jobs), succeeded,
                   failed_ok, wrong, leaks, tally.per_kind(), missed))
        self.summary = line  # main prints it last
        why = ["%d %s" % (n, one if n == 1 else many) for n, one, many in (
            (wrong, "wrong phase", "wrong phases"), (leaks, "leak", "leaks"),
            (backwards, "status gone backwards", "statuses gone backwards"),
            (missed, "fault missed", "faults missed"),
            (len(self.errors), "error of the run's own", "errors of the run's own")) if n]
        if why:
            print("chaos run FAILED: %s" % ", ".join(why))
        sys.stdout.flush()
        return 1 if why else 0


def write_summary(path, line):
    """The summary line, alone, in path (--summary-file), replacing what was there."""
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            f.write(line + "\n")
        os.replace(path + ".tmp", path)


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


def namespace_command():
    """The unshare command line (before "--") that gives this run a mount namespace of its
    own: as root a plain one; otherwise inside a user namespace of its own too, in which
    the run is root (uid 0 mapped to the caller's uid) and may mount a tmpfs."""
    if os.geteuid() == 0:
        return ["unshare", "--mount", "--propagation", "private"]
    return ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"]


def enter_private_shm(args):
    """Re-executes this program (once) in a mount namespace of its own (namespace_command)
    and mounts a tmpfs of --shm-mb on its /dev/shm. None when /dev/shm is this run's own;
    else why not (shm-full will then be missed, and the run fail)."""
    if os.environ.get(PRIVATE_ENV) == "1":
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%dm,mode=1777" % args.shm_mb,
                               "chaos-shm", "/dev/shm"], stderr=subprocess.PIPE,
                              universal_newlines=True)
        if proc.returncode != 0:
            return "mount -t tmpfs on /dev/shm: %s" % proc.stderr.strip()
        return None
    command = namespace_command()
    if not shutil.which("unshare"):
        return "no unshare (util-linux) on PATH"
    probe = subprocess.run(command + ["--", "true"], stderr=subprocess.PIPE,
                           universal_newlines=True)
    if probe.returncode != 0:
        return "%s: %s" % (" ".join(command), probe.stderr.strip())
    sys.stdout.flush()
    os.execvpe("unshare", command + ["--", sys.executable] + sys.argv,
               dict(os.environ, **{PRIVATE_ENV: "1", OUTSIDE_UID_ENV: str(os.geteuid())}))


def check_private_shm(args):
    """Test only (--check-private-shm): /dev/shm is this run's own tmpfs of --shm-mb, which
    fill_shm leaves --shm-left-kb of and unfill_shm frees. 0 when so, else 1, said why."""
    problems = []
    if args.shm_problem:
        problems.append("no private /dev/shm: %s" % args.shm_problem)
    else:
        mounts = [line.split() for line in read("/proc/self/mountinfo", "r").splitlines()]
        mine = [m for m in mounts if m[4] == "/dev/shm"]
        source = mine[-1][-2] if mine else None  # the last mount on it is the one seen
        if source != "chaos-shm":
            problems.append("/dev/shm is mounted from %s, not the run's chaos-shm" % source)
        st = os.statvfs("/dev/shm")
        if st.f_blocks * st.f_frsize != args.shm_mb << 20:
            problems.append("/dev/shm holds %d bytes, not --shm-mb %d MiB"
                            % (st.f_blocks * st.f_frsize, args.shm_mb))
        fill_shm(args.shm_left_kb)
        full = free_kb("/dev/shm")
        unfill_shm()
        if full > args.shm_left_kb:
            problems.append("filled, /dev/shm has %d KiB free, not %d"
                            % (full, args.shm_left_kb))
        if free_kb("/dev/shm") < (args.shm_mb << 10) - 64:
            problems.append("freed, /dev/shm has only %d KiB free" % free_kb("/dev/shm"))
    for p in problems:
        print("FAIL: %s" % p)
    if not problems:
        print("PASS: a private /dev/shm of %d MiB, filled to %d KiB free and freed, run by uid "
              "%s" % (args.shm_mb, args.shm_left_kb, os.environ.get(OUTSIDE_UID_ENV)))
    return 1 if problems else 0


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
    ap.add_argument("--api-hold", type=int, default=30,
                    help="seconds an API window stays open past its time for a rule that has "
                         "not fired yet (then it is missed)")
    ap.add_argument("--min-per-kind", type=int, default=0,
                    help="refuse a schedule that plans fewer faults of some kind (before "
                         "anything starts): chaos_short asks for 1, every kind")
    ap.add_argument("--summary-file", default=os.environ.get("CHAOS_SUMMARY_FILE", ""),
                    help="also write the summary line, alone, to this file")
    ap.add_argument("--unreachable-fault", action="store_true",
                    help="test only: one short job whose only fault can never be injected "
                         "(a rank on node 2 of a two-node job); the run must fail, missed=1")
    ap.add_argument("--leave-file", action="store_true",
                    help="test only: leave a file in the agents' TMPDIR once the jobs are "
                         "done, as an agent that did not clean up would; the run must fail, "
                         "leaks=1")
    ap.add_argument("--check-private-shm", action="store_true",
                    help="test only: enter the private /dev/shm, fill it, free it, and exit")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    if args.seed is None:
        env_seed = os.environ.get("CHAOS_SEED", "")
        args.seed = int(env_seed) if env_seed else int(time.time()) % 100000
    args.source_dir = os.path.abspath(args.source_dir)
    args.build_dir = os.path.abspath(args.build_dir)
    if args.summary_file:
        args.summary_file = os.path.abspath(args.summary_file)
        if os.environ.get(PRIVATE_ENV) != "1" and os.path.exists(args.summary_file):
            os.unlink(args.summary_file)  # no earlier run's line stands for this one
    if args.unreachable_fault:
        jobs = schedule.unreachable_schedule()
    else:
        jobs = schedule.make_schedule(args.seed, args.seconds)
    plan = schedule.planned(jobs)
    short = [k for k in KINDS if plan[k] < args.min_per_kind]
    if short:
        sys.stderr.write("chaos.py: seed %d with --seconds %d plans fewer than --min-per-kind "
                         "%d faults of %s; choose another seed\n"
                         % (args.seed, args.seconds, args.min_per_kind, ", ".join(short)))
        return 2
    args.shm_problem = enter_private_shm(args)
    if args.check_private_shm:
        return check_private_shm(args)
    if args.shm_problem:
        log("no private /dev/shm (%s): shm-full cannot be injected, so the run fails"
            % args.shm_problem)
    else:
        log("/dev/shm: a tmpfs of %d MiB in a mount namespace of the run's own%s" % (
            args.shm_mb, "" if os.environ.get(OUTSIDE_UID_ENV) == "0" else
            " and a user namespace (started by uid %s)" % os.environ.get(OUTSIDE_UID_ENV)))
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
    chaos = Chaos(args, jobs)
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
    if args.leave_file and os.path.isdir(getattr(chaos, "tmp", "")):
        with open(os.path.join(chaos.tmp, "left-by-leave-file"), "w") as f:
            f.write("left by chaos.py --leave-file\n")
    if chaos.cluster is not None:
        try:
            chaos.leaks = chaos.final_leaks()
        except Exception as err:
            chaos.errors.append("leak check: %s" % err)
    log("run took %.0f s" % (time.monotonic() - started))
    code = chaos.report()
    if chaos.cluster is not None:
        if code != 0 or args.keep:
            try:  # every request the operator made, and the faults each met
                status, body = chaos.proxy_call("GET", "/testing/requests")
                with open(os.path.join(chaos.cluster.dir, "requests.json"), "w") as f:
                    json.dump(body, f)
            except Exception as err:
                print("the proxy's request log was not saved: %s" % err)
            kept = os.path.join(args.work_dir, "cluster")
            shutil.copytree(chaos.cluster.dir, kept, symlinks=True,
                            ignore=shutil.ignore_patterns("etcd*", "*.sock"))
            print("logs: %s" % kept)
        chaos.cluster.stop()
    if code == 0 and not args.keep:
        shutil.rmtree(args.work_dir, ignore_errors=True)
    print(chaos.summary)
    sys.stdout.flush()
    write_summary(args.summary_file, chaos.summary)
    return code


if __name__ == "__main__":
    sys.exit(main())
