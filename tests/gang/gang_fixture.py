"""The real control plane with the real gang schedulers for a test module (tests/gang, issue
40): scripts/cluster.sh up --kueue / --volcano in a temporary directory, local_node.py's nodes
with `nvidia.com/gpu`, driven with the pinned kubectl, stopped with everything it started.
Standard library only (plus tests/cluster/cluster_fixture.py).

    cluster = GangCluster(source_dir, nodes=2, gpus=2, kueue=True)
    cluster.get("pods", "-n", "ns")            # parsed `kubectl get -o json`
    cluster.add_node("extra-node-", gpus=1)     # one more local node process
    cluster.stop()
"""

import json
import os
import shutil
import subprocess
import sys
import unittest

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "cluster"))
import cluster_fixture  # noqa: E402  (tests/cluster/cluster_fixture.py)

main = cluster_fixture.main
wait_until = cluster_fixture.wait_until


class GangCluster(cluster_fixture.Cluster):
    """cluster_fixture.Cluster started with --gpus and the gang schedulers asked for."""

    def __init__(self, source_dir, tools_bin=None, nodes=1, gpus=0, kueue=False,
                 volcano=False):
        import tempfile
        self.source_dir = source_dir
        self.kubectl_name = "kubectl"
        self.tools = tools_bin or os.path.join(source_dir, ".tools", "bin")
        self.dir = tempfile.mkdtemp(prefix="spawnpoint-gang-")
        self.home = os.path.join(self.dir, "home")
        os.makedirs(self.home)
        self.processes = []
        self.cp = os.path.join(self.dir, "cp")
        argv = ["bash", os.path.join(source_dir, "scripts", "cluster.sh"), "up", "--dir",
                self.cp, "--nodes", str(nodes), "--gpus", str(gpus)]
        argv += ["--kueue"] if kueue else []
        argv += ["--volcano"] if volcano else []
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=900,
                              env=dict(os.environ, SPAWNPOINT_TOOLS_BIN=self.tools,
                                       SPAWNPOINT_CLUSTER_TIMEOUT="400"))
        sys.stderr.write(proc.stderr)
        last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
        if proc.returncode != 0 or not last.startswith("kubeconfig: "):
            self.stop()
            raise RuntimeError("scripts/cluster.sh %s failed (exit %d): %s"
                               % (" ".join(argv[2:]), proc.returncode, proc.stderr[-3000:]))
        self.kubeconfig = last[len("kubeconfig: "):]
        self.node_dir = os.path.join(self.cp, "node")

    def get(self, *args):
        """`kubectl get ARGS -o json`, parsed; None when it is not found."""
        code, out = self.kubectl("get", *(list(args) + ["-o", "json"]))
        if code != 0:
            if "NotFound" in out or "not found" in out:
                return None
            raise RuntimeError("kubectl get %s: %s" % (" ".join(args), out))
        return json.loads(out)

    def apply(self, objects):
        """Creates the objects (dicts) with kubectl create; returns what the server made
        (after every admission webhook) as a list."""
        doc = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
        env = dict(os.environ, HOME=self.home, KUBECACHEDIR=os.path.join(self.home, "cache"))
        proc = subprocess.run([os.path.join(self.tools, self.kubectl_name), "--kubeconfig",
                               self.kubeconfig, "create", "-o", "json", "-f", "-"],
                              input=json.dumps(doc), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, env=env,
                              timeout=120)
        if proc.returncode != 0:
            raise RuntimeError("kubectl create: %s%s" % (proc.stdout, proc.stderr))
        made, text, at = [], proc.stdout, 0  # one JSON document per object
        decoder = json.JSONDecoder()
        while text[at:].strip():
            at += len(text[at:]) - len(text[at:].lstrip())
            obj, at = decoder.raw_decode(text, at)
            made.extend(obj["items"] if obj.get("kind") == "List" else [obj])
        return made

    def component_log(self, name):
        """The log of a component cluster.sh started (kueue, vc-scheduler, local-node)."""
        try:
            with open(os.path.join(self.cp, name + ".log")) as f:
                return f.read()
        except OSError as err:
            return "(%s)" % err

    def add_node(self, prefix, nodes=1, gpus=0, name=None):
        """One more local_node.py process with `nodes` nodes PREFIX0.. of `gpus` GPUs each;
        returns once they are Ready (its log: NAME, default the prefix)."""
        name = name or prefix.rstrip("-")
        work = os.path.join(self.dir, name)
        os.makedirs(work, exist_ok=True)
        proc = self.start_process(name, [
            sys.executable, os.path.join(self.source_dir, "tests", "cluster", "local_node.py"),
            "--kubeconfig", self.kubeconfig, "--nodes", str(nodes), "--name-prefix", prefix,
            "--gpus", str(gpus), "--work-dir", work, "--cwd", self.source_dir])

        def ready():
            if proc.poll() is not None:
                raise RuntimeError("local_node.py %s exited: %s" % (name, self.log(name)))
            listing = self.get("nodes")
            return sum(1 for n in listing["items"] if n["metadata"]["name"].startswith(prefix)
                       and any(c["type"] == "Ready" and c["status"] == "True"
                               for c in n["status"].get("conditions", []))) >= nodes
        if not wait_until(ready, 60, 0.2):
            raise RuntimeError("local_node.py %s: nodes not Ready in 60 s: %s"
                               % (name, self.log(name)))
        return proc


    def gpu_queue(self, namespace, quota, deadline_s, preemption=None):
        """Namespace `namespace`, ClusterQueue `gpus` of `quota` nvidia.com/gpu (one
        ResourceFlavor; `preemption`: its spec.preemption) and LocalQueue `team-queue` in it;
        returns once Kueue marks the ClusterQueue Active (before, nothing is admitted: a test
        would only measure Kueue's start-up). Raises with Kueue's log on a failure."""
        code, out = self.kubectl("create", "namespace", namespace)
        if code != 0:
            raise RuntimeError(out)
        spec = {"namespaceSelector": {},
                "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"],
                                    "flavors": [{"name": "gpu-flavor", "resources": [
                                        {"name": "nvidia.com/gpu", "nominalQuota": quota}]}]}]}
        if preemption:
            spec["preemption"] = preemption
        self.apply([
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
             "metadata": {"name": "gpu-flavor"}},
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
             "metadata": {"name": "gpus"}, "spec": spec},
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
             "metadata": {"name": "team-queue", "namespace": namespace},
             "spec": {"clusterQueue": "gpus"}}])
        if not wait_until(lambda: condition(self.get("clusterqueue", "gpus"),
                                            "Active").get("status") == "True", deadline_s):
            raise RuntimeError("ClusterQueue gpus not Active; kueue.log:\n" +
                               self.component_log("kueue")[-3000:])


class GangTest(unittest.TestCase):
    """A test class on one GangCluster: its setUpClass sets cls.cluster and cls.tmp (and calls
    tearDownClass itself when it fails after that: unittest does not); tearDownClass stops the
    cluster and removes tmp. wait() fails with the tails of the logs LOGS names."""
    DEADLINE_S = 180
    POLL_S = None  # wait_until's own interval
    LOGS = ()  # (log, characters): a component of cluster.sh's (kueue, vc-scheduler,
    # local-node) or a process the cluster started (operator)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        if getattr(cls, "tmp", None):
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def wait(self, what, check, deadline_s=None):
        deadline_s = deadline_s or self.DEADLINE_S
        if wait_until(check, deadline_s, *([self.POLL_S] if self.POLL_S else [])):
            return
        tails = []
        for name, chars in self.LOGS:
            text = (self.cluster.log(name) if name == "operator"
                    else self.cluster.component_log(name))
            tails.append("%s:\n%s" % (name, text[-chars:]))
        self.fail("%s not within %d s\n%s" % (what, deadline_s, "\n".join(tails)))


def training_job(build_dir, name, ns, script, nodes=1, gpus=1, scheduling=None,
                 max_restarts=1):
    """A TrainingJob of `nodes` pods of 1 CPU rank, each pod asking `gpus` nvidia.com/gpu (the
    ranks use none: there is no GPU here), handed to `scheduling`; each container runs
    `bash -c script trainer...` (the script execs "$@" to train the example trainer)."""
    return cluster_fixture.training_job(
        name, ns, ["bash", "-c", script, "trainer"] + cluster_fixture.example_trainer(build_dir),
        nodes=nodes, container={"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}},
        scheduling=scheduling or {},
        restartPolicy={"maxRestarts": max_restarts, "backoffSeconds": 1},
        runPolicy={"cleanPodPolicy": "None"})


def wait_for(path):
    """A training_job script that waits for the file `path`, then trains."""
    return 'while [ ! -e %s ]; do sleep 0.1; done; exec "$@"' % path


def condition(obj, kind):
    """The status condition of type `kind` of obj, or {}."""
    for c in (obj or {}).get("status", {}).get("conditions") or []:
        if c.get("type") == kind:
            return c
    return {}


def gates(pod):
    return [g["name"] for g in pod["spec"].get("schedulingGates") or []]
