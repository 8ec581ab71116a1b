"""A test-only kubelet for the real control plane of scripts/cluster.sh (issue 23): it registers
Node objects and runs the pods the scheduler binds to them as local processes.

    local_node.py --kubeconfig FILE [--nodes N] [--name-prefix P] [--cpu C] [--memory M]
                  [--gpus G] [--work-dir DIR] [--cwd DIR] [--pod-start-delay SECONDS]
                  [--simulate]

What a pod gets, as a kubelet would give it (what a container runtime would add is not here:
no image, no namespaces, no mounts):
- Nodes `<prefix>0..N-1` (default `local-node-`), Ready, InternalIP 127.0.0.1, capacity and
  allocatable of cpu, memory, pods and `nvidia.com/gpu` (--gpus); their Leases in
  kube-node-lease and their Ready condition are renewed every 10 s, so the node-lifecycle
  controller never taints them.
- Each container of a pod bound to one of them (init containers first, one after another,
  then the others together) runs as `command` + `args` ($(VAR) expanded) from --cwd (or its
  workingDir, relative to --cwd), in its own session, killed with the node
  (setpriv --pdeathsig), with the environment: this program's own, then HOSTNAME, then the
  container's `env` (literal values, fieldRef metadata.name/namespace/uid/labels['k']/
  annotations['k'], spec.nodeName, spec.serviceAccountName, status.podIP/hostIP,
  configMapKeyRef and secretKeyRef). A fieldRef or source it cannot give fails the container
  (StartError) with the reason. emptyDir volumes are directories under the pod's work
  directory (not mounted: their paths are not the mountPath). A pod with a container that
  has no command (an image's entry point, e.g. the chart's operator Deployment) runs nothing
  and stays Pending, that container waiting with reason ImageNotRunnable, until deleted: never
  Failed, so a ReplicaSet does not replace it over and over.
- Secret volumes: a container's mount of a pod volume from a Secret is a directory of the
  pod's work directory holding one file per key, made before the container starts (waiting,
  as a kubelet does, until the Secret exists); every occurrence of the mountPath in argv and
  env is replaced by that directory.
- terminationMessagePath: every occurrence in argv and env is replaced by a file of the
  pod's work directory, read (4 KiB) into the terminated state's message; with
  FallbackToLogsOnError, the log's last 80 lines when the file is empty and the exit failed.
- Status: Pending -> Running (podIP 127.0.0.1, container states running) -> Succeeded or
  Failed (exit codes, reason Completed/Error, 128+n and the signal for a signal), with
  restartPolicy Never (OnFailure/Always restart the container, counted, 1 s apart).
- A pod annotated `local-node.spawnpoint.dev/own-pod-ip: "true"` gets a loopback address of
  its own instead (127.0.X.Y, X and Y from 1 to 254, taken in turn), as its podIP and
  status.podIP, so that several pods can each serve the same port on their podIP. Binding
  it is the pod's business: every process still shares the host's network. With the value
  "host" the pod's address is the host's first non-loopback IPv4 address instead: a
  connection to it from this machine comes from that address, not from loopback, as one from
  another node's pod would (one such pod per port).
- Deletion: when a pod gets a deletionTimestamp its processes get SIGTERM, then SIGKILL after
  its grace period (deletionGracePeriodSeconds); the pod then reports a terminal phase (Failed
  unless every container exited 0) and the node deletes it with grace 0, as a kubelet does:
  while it has finalizers (Kueue's kueue.x-k8s.io/managed) the API server keeps it, terminal,
  with its deletionTimestamp, and the node never runs it again. A bound pod the node never
  ran (it started after the deletion) is reported Failed before that delete.
- Status is written with a strategic merge patch, as a kubelet does: pod conditions of other
  writers (Kueue's TerminationTarget, DisruptionTarget) stay.
- --pod-start-delay: a SIMULATED wait before a pod's containers start (image pull, sandbox).
- --simulate: nothing runs (for the operator's tests, which play the kubelet's part themselves):
  a bound pod is reported Running with its containers running, and then left alone, so the
  test's own pods/status patches (Succeeded, Failed, exit codes) are what the operator sees;
  deletion is honoured at once (there is nothing to stop).
- Logs: <work-dir>/pods/<namespace>_<name>_<uid>/<container>.log (stdout and stderr).

It prints "local-node: ready N nodes" once the nodes are registered, and stops every process
it started on SIGTERM/SIGINT, leaving nothing behind. Standard library and PyYAML only.
"""

import argparse
import base64
import http.client
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse

import yaml

RENEW_S = 10.0
OWN_POD_IP = "local-node.spawnpoint.dev/own-pod-ip"
IMAGE_ONLY_REASON = "ImageNotRunnable"
IMAGE_ONLY_MESSAGE = ("container %s has no command: the local node runs commands, not images "
                      "(give it a command, or run its program beside the cluster as "
                      "`make chart-local` does the operator's)")
_own_ips = {"next": 0, "lock": threading.Lock()}


def next_own_ip():
    """The next loopback address of 127.0.1.1 .. 127.0.254.254, in turn."""
    with _own_ips["lock"]:
        n = _own_ips["next"]
        _own_ips["next"] = (n + 1) % (254 * 254)
    return "127.0.%d.%d" % (1 + n // 254, 1 + n % 254)


def host_ip():
    """This machine's first non-loopback IPv4 address (of its interfaces, in index order), or
    127.0.0.1 when it has none."""
    import fcntl
    import socket
    import struct
    siocgifaddr = 0x8915
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), siocgifaddr,
                                     struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address
                continue
            address = socket.inet_ntoa(packed[20:24])
            if not address.startswith("127."):
                return address
    finally:
        s.close()
    return "127.0.0.1"


def log(line):
    sys.stderr.write("local-node: %s\n" % line)
    sys.stderr.flush()


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Api(object):
    """A minimal client of the API server from a kubeconfig with client certificates."""

    def __init__(self, kubeconfig):
        with open(kubeconfig) as f:
            cfg = yaml.safe_load(f)
        context = next(c["context"] for c in cfg["contexts"] if c["name"] == cfg["current-context"])
        cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in cfg["users"] if u["name"] == context["user"])
        url = urllib.parse.urlparse(cluster["server"])
        self.host, self.port = url.hostname, url.port or 443
        self.ctx = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self.ctx.load_cert_chain(user["client-certificate"], user["client-key"])

    def _conn(self, timeout=30):
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)

    def call(self, method, path, body=None, content_type="application/json"):
        """(status, parsed body)."""
        conn = self._conn()
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=data, headers={"Content-Type": content_type,
                                                           "Accept": "application/json"})
            resp = conn.getresponse()
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw else {})
        finally:
            conn.close()

    def watch(self, path, resource_version, timeout_s=None):
        """Yields watch events until the stream ends (after timeout_s when given)."""
        conn = self._conn(timeout=None if timeout_s is None else timeout_s + 30)
        sep = "&" if "?" in path else "?"
        query = "watch=1&allowWatchBookmarks=true&resourceVersion=%s" % resource_version
        if timeout_s is not None:
            query += "&timeoutSeconds=%d" % timeout_s
        conn.request("GET", "%s%s%s" % (path, sep, query))
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError("watch %s: HTTP %d" % (path, resp.status))
        try:
            while True:
                line = resp.readline()
                if not line:
                    return
                if line.strip():
                    yield json.loads(line)
        finally:
            conn.close()


class Container(object):
    def __init__(self, spec):
        self.spec = spec
        self.name = spec["name"]
        self.proc = None
        self.started_at = None
        self.restarts = 0
        self.state = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state = {}


class Pod(object):
    """One pod this node runs: its containers' processes and the status it reports."""

    def __init__(self, node, obj):
        self.node = node
        self.api = node.api
        self.meta = obj["metadata"]
        self.spec = obj["spec"]
        self.ns, self.name, self.uid = self.meta["namespace"], self.meta["name"], self.meta["uid"]
        own = (self.meta.get("annotations") or {}).get(OWN_POD_IP)
        self.ip = next_own_ip() if own == "true" else host_ip() if own == "host" else "127.0.0.1"
        self.dir = os.path.join(node.work_dir, "pods", "%s_%s_%s" % (self.ns, self.name, self.uid))
        self.inits = [Container(c) for c in self.spec.get("initContainers", [])]
        self.containers = [Container(c) for c in self.spec.get("containers", [])]
        self.phase = "Pending"
        self.deleting = False
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.run, daemon=True)

    # --- the environment ---
    def field(self, path):
        m = re.match(r"^metadata\.(labels|annotations)\['([^']+)'\]$", path)
        if m:
            return self.meta.get(m.group(1), {}).get(m.group(2), "")
        values = {"metadata.name": self.name, "metadata.namespace": self.ns,
                  "metadata.uid": self.uid, "spec.nodeName": self.spec.get("nodeName", ""),
                  "spec.serviceAccountName": self.spec.get("serviceAccountName", "default"),
                  "status.podIP": self.ip, "status.hostIP": "127.0.0.1",
                  "status.podIPs": self.ip, "status.hostIPs": "127.0.0.1"}
        if path not in values:
            raise ValueError("fieldRef %s is not supported by the local node" % path)
        return values[path]

    def key_ref(self, kind, ref):
        status, obj = self.api.call("GET", "/api/v1/namespaces/%s/%s/%s" % (
            self.ns, kind, urllib.parse.quote(ref["name"])))
        data = obj.get("data", {}) if status == 200 else {}
        if ref["key"] in data:
            value = data[ref["key"]]
            return base64.b64decode(value).decode() if kind == "secrets" else value
        if ref.get("optional"):
            return None
        raise ValueError("%s %s has no key %s" % (kind[:-1], ref["name"], ref["key"]))

    def environment(self, spec, term_path):
        env = dict(os.environ)
        env["HOSTNAME"] = self.name
        for item in spec.get("env", []):
            if "valueFrom" in item:
                source = item["valueFrom"]
                if "fieldRef" in source:
                    value = self.field(source["fieldRef"]["fieldPath"])
                elif "configMapKeyRef" in source:
                    value = self.key_ref("configmaps", source["configMapKeyRef"])
                elif "secretKeyRef" in source:
                    value = self.key_ref("secrets", source["secretKeyRef"])
                else:
                    raise ValueError("env %s: valueFrom %s is not supported by the local node"
                                     % (item["name"], sorted(source)))
                if value is None:
                    continue
            else:
                value = expand(item.get("value", ""), env)
            env[item["name"]] = value
        declared = spec.get("terminationMessagePath", "/dev/termination-log")
        return {k: v.replace(declared, term_path) for k, v in env.items()}

    def secret_mounts(self, spec):
        """{mountPath: directory} for the container's mounts of Secret volumes, their files
        written; raises ValueError when a Secret is still missing after 60 s."""
        volumes = {v["name"]: v for v in self.spec.get("volumes", []) if "secret" in v}
        mounts = {}
        for m in spec.get("volumeMounts", []):
            volume = volumes.get(m.get("name"))
            if volume is None:
                continue
            name = volume["secret"]["secretName"]
            deadline = time.monotonic() + 60
            while True:
                status, obj = self.api.call("GET", "/api/v1/namespaces/%s/secrets/%s" % (
                    self.ns, urllib.parse.quote(name)))
                if status == 200 or self.deleting or time.monotonic() > deadline:
                    break
                time.sleep(0.2)  # the kubelet keeps the pod ContainerCreating meanwhile
            if status != 200:
                raise ValueError("secret %s for volume %s: HTTP %s" % (name, m["name"], status))
            directory = os.path.join(self.dir, "volumes", m["name"])
            os.makedirs(directory, exist_ok=True)
            for key, value in (obj.get("data") or {}).items():
                with open(os.path.join(directory, key), "wb") as f:
                    f.write(base64.b64decode(value))
            mounts[m["mountPath"]] = directory
        return mounts

    # --- running ---
    def start(self, c):
        """Starts container c's process; False (and c's state) when it cannot start."""
        os.makedirs(self.dir, exist_ok=True)
        term_path = os.path.join(self.dir, c.name + ".termination-log")
        open(term_path, "w").close()
        try:
            env = self.environment(c.spec, term_path)
            mounts = self.secret_mounts(c.spec)
            for path in sorted(mounts, key=len, reverse=True):
                env = {k: v.replace(path, mounts[path]) for k, v in env.items()}
            argv = [expand(a, env) for a in c.spec.get("command", []) + c.spec.get("args", [])]
            for path in sorted(mounts, key=len, reverse=True):
                argv = [a.replace(path, mounts[path]) for a in argv]
            declared = c.spec.get("terminationMessagePath", "/dev/termination-log")
            argv = [a.replace(declared, term_path) for a in argv]
            cwd = os.path.join(self.node.cwd, c.spec.get("workingDir", ""))
            out = open(os.path.join(self.dir, c.name + ".log"), "ab")
            c.proc = subprocess.Popen(["setpriv", "--pdeathsig", "SIGKILL", "--"] + argv, cwd=cwd,
                                      env=env, stdout=out, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
            out.close()
        except (OSError, ValueError) as err:
            c.state = {"terminated": {"exitCode": 128, "reason": "StartError",
                                      "message": str(err), "finishedAt": now()}}
            return False
        c.term_path = term_path
        c.started_at = now()
        c.state = {"running": {"startedAt": c.started_at}}
        return True

    def finished(self, c, code):
        if code < 0:
            exit_code, signal_no = 128 - code, -code
        else:
            exit_code, signal_no = code, None
        with open(c.term_path, "rb") as f:
            message = f.read(4096).decode(errors="replace")
        if not message and exit_code != 0 and \
                c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            with open(os.path.join(self.dir, c.name + ".log"), "rb") as f:
                message = b"".join(f.readlines()[-80:])[-2048:].decode(errors="replace")
        state = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                 "startedAt": c.started_at, "finishedAt": now()}
        if signal_no:
            state["signal"] = signal_no
        if message:
            state["message"] = message
        c.state = {"terminated": state}

    def run(self):
        delay = self.node.pod_start_delay
        if delay > 0:  # SIMULATED: image pull and sandbox creation
            time.sleep(delay)
        if self.node.simulate:  # SIMULATED: Running, and nothing more from this node
            for c in self.containers:
                c.started_at = now()
                c.state = {"running": {"startedAt": c.started_at}}
            self.phase = "Running"
            self.report()
            if self.deleting:
                self.remove()
            return
        image_only = [c for c in self.inits + self.containers if not c.spec.get("command")]
        if image_only:
            # Nothing to run: the pod stays Pending, as one whose image never pulls would, so
            # that a ReplicaSet has no failed pod to replace (it made 318 in 30 s), until it
            # is deleted.
            for c in image_only:
                c.state = {"waiting": {"reason": IMAGE_ONLY_REASON,
                                       "message": IMAGE_ONLY_MESSAGE % c.name}}
            self.report()
            while not self.deleting:
                time.sleep(0.2)
            return self.end("Failed")
        for c in self.inits:
            if self.deleting or not self.start(c):
                return self.end("Failed")
            self.report()
            self.finished(c, c.proc.wait())
            if c.state["terminated"]["exitCode"] != 0:
                return self.end("Failed")
        started = [c for c in self.containers if not self.deleting and self.start(c)]
        if len(started) < len(self.containers):
            self.kill_all(signal.SIGKILL)
            return self.end("Failed")
        self.phase = "Running"
        self.report()
        policy = self.spec.get("restartPolicy", "Always")
        pending = list(self.containers)
        while pending:
            for c in list(pending):
                code = c.proc.poll()
                if code is None:
                    continue
                self.finished(c, code)
                restart = not self.deleting and (policy == "Always" or (
                    policy == "OnFailure" and c.state["terminated"]["exitCode"] != 0))
                if restart:
                    c.last_state, c.restarts = c.state, c.restarts + 1
                    time.sleep(1.0)
                    if self.start(c):
                        self.report()
                        continue
                pending.remove(c)
                self.report()
            time.sleep(0.05)
        codes = [c.state["terminated"]["exitCode"] for c in self.containers]
        self.end("Succeeded" if all(code == 0 for code in codes) else "Failed")

    def end(self, phase):
        self.phase = phase
        self.report()
        if self.deleting:
            self.remove()

    def kill_all(self, sig):
        for c in self.inits + self.containers:
            if c.proc is not None and c.proc.poll() is None:
                try:
                    os.killpg(c.proc.pid, sig)
                except OSError:
                    pass

    def delete(self, grace_s):
        """The pod got a deletionTimestamp: SIGTERM, SIGKILL after the grace, then removal."""
        if self.deleting:
            return
        self.deleting = True

        def terminate():
            self.kill_all(signal.SIGTERM)
            end = time.monotonic() + grace_s
            while time.monotonic() < end and any(
                    c.proc is not None and c.proc.poll() is None for c in self.containers):
                time.sleep(0.05)
            self.kill_all(signal.SIGKILL)
            if not self.thread.is_alive():
                self.remove()
        threading.Thread(target=terminate, daemon=True).start()

    def remove(self):
        self.api.call("DELETE", "/api/v1/namespaces/%s/pods/%s" % (self.ns, self.name),
                      {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                       "preconditions": {"uid": self.uid}})

    def statuses(self, containers):
        out = []
        for c in containers:
            s = {"name": c.name, "image": c.spec.get("image", ""), "imageID": "",
                 "ready": "running" in c.state, "started": "running" in c.state,
                 "restartCount": c.restarts, "state": c.state,
                 "containerID": "local://%d" % c.proc.pid if c.proc else ""}
            if c.last_state:
                s["lastState"] = c.last_state
            out.append(s)
        return out

    def report(self):
        with self.lock:
            ready = "True" if self.phase == "Running" else "False"
            status = {"phase": self.phase, "hostIP": "127.0.0.1", "podIP": self.ip,
                      "podIPs": [{"ip": self.ip}], "hostIPs": [{"ip": "127.0.0.1"}],
                      "startTime": self.meta.get("creationTimestamp"),
                      "conditions": [
                          {"type": "PodScheduled", "status": "True"},
                          {"type": "Initialized",
                           "status": "True" if self.phase != "Pending" else "False"},
                          {"type": "ContainersReady", "status": ready},
                          {"type": "Ready", "status": ready}],
                      "initContainerStatuses": self.statuses(self.inits),
                      "containerStatuses": self.statuses(self.containers)}
            code, body = self.api.call(
                "PATCH", "/api/v1/namespaces/%s/pods/%s/status" % (self.ns, self.name),
                {"status": status}, "application/strategic-merge-patch+json")
            if code >= 300 and code != 404:
                log("pod %s/%s status: HTTP %d %s"
                    % (self.ns, self.name, code, body.get("message")))


def expand(text, env):
    """Kubernetes' $(VAR) expansion; $$ is a literal $."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


class LocalNode(object):
    def __init__(self, args):
        self.api = Api(args.kubeconfig)
        self.names = ["%s%d" % (args.name_prefix, i) for i in range(args.nodes)]
        self.work_dir = os.path.abspath(args.work_dir)
        self.cwd = os.path.abspath(args.cwd)
        self.pod_start_delay = args.pod_start_delay
        self.simulate = args.simulate
        self.capacity = {"cpu": args.cpu, "memory": args.memory, "pods": "110",
                         "nvidia.com/gpu": str(args.gpus), "ephemeral-storage": "100Gi"}
        self.pods = {}  # uid -> Pod
        self.stop = threading.Event()

    def node_status(self):
        return {"capacity": self.capacity, "allocatable": self.capacity,
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                              {"type": "Hostname", "address": "localhost"}],
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "local-node is posting ready status",
                                "lastHeartbeatTime": now(), "lastTransitionTime": now()}],
                "nodeInfo": {"kubeletVersion": "v0.0.0-local-node", "operatingSystem": "linux",
                             "architecture": "amd64",
                             "containerRuntimeVersion": "local://processes",
                             "kernelVersion": os.uname().release, "osImage": "local-node",
                             "kubeProxyVersion": "", "machineID": "", "systemUUID": "",
                             "bootID": ""}}

    def register(self):
        for name in self.names:
            node = {"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                          "kubernetes.io/os": "linux",
                                                          "spawnpoint.dev/local-node": "true"}}}
            code, body = self.api.call("POST", "/api/v1/nodes", node)
            if code not in (201, 409):
                raise RuntimeError("creating node %s: HTTP %d %s"
                                   % (name, code, body.get("message")))
        self.renew()

    def renew(self):
        for name in self.names:
            self.api.call("PATCH", "/api/v1/nodes/%s/status" % name,
                          {"status": self.node_status()}, "application/merge-patch+json")
            lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                     "metadata": {"name": name, "namespace": "kube-node-lease"},
                     "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                              "renewTime": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z",
                                                         time.gmtime())}}
            path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
            code, _ = self.api.call("PUT", "%s/%s" % (path, name), lease)
            if code == 404:
                self.api.call("POST", path, lease)

    def renew_loop(self):
        while not self.stop.wait(RENEW_S):
            try:
                self.renew()
            except Exception as err:  # the next round tries again
                log("renewing the nodes: %s" % err)

    def handle(self, obj):
        meta, spec = obj["metadata"], obj["spec"]
        if spec.get("nodeName") not in self.names:
            return
        pod = self.pods.get(meta["uid"])
        if pod is None and meta.get("deletionTimestamp") is None:
            if obj.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                return  # finished before this node started (a previous run of it)
            pod = self.pods[meta["uid"]] = Pod(self, obj)
            pod.thread.start()
        elif pod is None:  # bound here, never run here: terminal, then let it go (once)
            pod = self.pods[meta["uid"]] = Pod(self, obj)
            pod.deleting = True
            if obj.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
                pod.phase = "Failed"
                pod.report()
            pod.remove()
        elif meta.get("deletionTimestamp") is not None:
            pod.delete(float(meta.get("deletionGracePeriodSeconds", 30)))

    def serve(self):
        threading.Thread(target=self.renew_loop, daemon=True).start()
        while not self.stop.is_set():
            code, listing = self.api.call("GET", "/api/v1/pods")
            if code != 200:
                raise RuntimeError("listing pods: HTTP %d" % code)
            for obj in listing.get("items", []):
                self.handle(obj)
            try:
                for event in self.api.watch("/api/v1/pods", listing["metadata"]["resourceVersion"]):
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.handle(event["object"])
                    elif event["type"] == "ERROR":
                        break  # e.g. 410: list again
            except (OSError, http.client.HTTPException, RuntimeError) as err:
                log("pod watch ended (%s); listing again" % err)
                time.sleep(0.5)

    def shutdown(self):
        self.stop.set()
        for pod in self.pods.values():
            pod.kill_all(signal.SIGTERM)
        end = time.monotonic() + 2.0
        while time.monotonic() < end and any(
                c.proc is not None and c.proc.poll() is None
                for p in self.pods.values() for c in p.inits + p.containers):
            time.sleep(0.05)
        for pod in self.pods.values():
            pod.kill_all(signal.SIGKILL)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--name-prefix", default="local-node-")
    parser.add_argument("--cpu", default="8")
    parser.add_argument("--memory", default="32Gi")
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--work-dir", default=".")
    parser.add_argument("--cwd", default=".")
    parser.add_argument("--pod-start-delay", type=float, default=0.0,
                        help="SIMULATED seconds before a pod's containers start")
    parser.add_argument("--simulate", action="store_true",
                        help="SIMULATED pods: Running, then only what the API is told")
    args = parser.parse_args()
    node = LocalNode(args)

    def stop(signum, frame):
        node.shutdown()
        os._exit(0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    node.register()
    print("local-node: ready %d nodes" % len(node.names), flush=True)
    node.serve()


if __name__ == "__main__":
    main()
