"""The real control plane for a test module (tests/cluster): started once with
scripts/cluster.sh in a temporary directory, driven with the pinned kubectl, stopped with
everything it started. Standard library only.

    cluster = Cluster(source_dir, nodes=2)   # starts it (and local_node.py's nodes)
    cluster.kubectl("get", "nodes") # (exit code, stdout + stderr)
    cluster.start_operator(build_dir)           # the CRD and the operator (log "operator")
    cluster.run_tool("helm3", "list")           # any pinned tool, as the cluster's admin
    cluster.stop()
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "support"))
import ports  # noqa: E402  (tests/support/ports.py)

# The command line of the test module being run (main() below): source_dir, tools_bin and,
# where asked for, build_dir.
ARGS = None


# helm flags that keep the chart's Deployments' pods Pending (no node has this label; the local
# node runs no images): the chart's objects are installed for real, the test runs the binaries.
PARK_PODS = ("--set-string", "nodeSelector.spawnpoint\\.dev/no-such-node=true")


def main(build_dir=False, required=()):
    """Parses --source-dir [--build-dir] [--tools-bin] and the options named in `required`
    (each "--name VALUE") into ARGS and runs the tests of __main__ (the rest of the command
    line goes to unittest). Exit status: 0 passed, 1 failed or none ran, 77 when a test was
    skipped (ctest reports it only with SKIP_RETURN_CODE 77; unittest's own exit 0 would
    pass it)."""
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    if build_dir:
        parser.add_argument("--build-dir", required=True)
    parser.add_argument("--tools-bin")
    for option in required:
        parser.add_argument(option, required=True)
    ARGS, rest = parser.parse_known_args()
    program = unittest.main(module="__main__", argv=[sys.argv[0]] + rest, verbosity=2,
                            exit=False)
    result = program.result
    if not result.wasSuccessful() or result.testsRun == 0:
        sys.exit(1)
    for test, reason in result.skipped:
        print("SKIP: %s: %s" % (test.id(), reason))
    sys.exit(77 if result.skipped else 0)


def wait_until(condition, deadline_s, interval_s=0.5):
    """Polls condition() until it holds (True) or deadline_s pass (False); the deadline times
    SPAWNPOINT_TEST_SLOWDOWN (scripts/sanitizer-tests.sh sets 3 under ASan, 6 under TSan)."""
    import time
    end = time.monotonic() + deadline_s * float(os.environ.get("SPAWNPOINT_TEST_SLOWDOWN", "1"))
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(interval_s)
    return condition()


def free_port():
    """A TCP port P free on every interface now, with P + 1 free too, drawn from outside the
    ephemeral range (tests/support/ports.py): a job's agents serve its gang next to its
    rendezvous port, and the local node's pods share this machine's network with every
    other test."""
    return ports.free_port(2)


class Cluster(object):
    def __init__(self, source_dir, tools_bin=None, nodes=0, kubectl="kubectl", gpus=0):
        self.source_dir = source_dir
        self.kubectl_name = kubectl  # which kubectl of the tools folder kubectl() runs
        self.tools = tools_bin or os.path.join(source_dir, ".tools", "bin")
        self.dir = tempfile.mkdtemp(prefix="spawnpoint-cluster-")
        self.home = os.path.join(self.dir, "home")
        os.makedirs(self.home)
        self.processes = []
        script = os.path.join(source_dir, "scripts", "cluster.sh")
        proc = subprocess.run(["bash", script, "up", "--dir", os.path.join(self.dir, "cp"),
                               "--nodes", str(nodes), "--gpus", str(gpus)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=600,
                              env=dict(os.environ, SPAWNPOINT_TOOLS_BIN=self.tools))
        sys.stderr.write(proc.stderr)
        last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
        if proc.returncode != 0 or not last.startswith("kubeconfig: "):
            self.stop()
            raise RuntimeError("scripts/cluster.sh up failed (exit %d): %s"
                               % (proc.returncode, proc.stderr[-2000:]))
        self.kubeconfig = last[len("kubeconfig: "):]
        # The local node's pod directories (with nodes > 0): <ns>_<pod>_<uid>/<container>.log
        self.node_dir = os.path.join(self.dir, "cp", "node")

    def kubectl(self, *args, stdin=None, timeout=120):
        env = dict(os.environ, HOME=self.home, KUBECACHEDIR=os.path.join(self.home, "cache"))
        proc = subprocess.run([os.path.join(self.tools, self.kubectl_name), "--kubeconfig",
                               self.kubeconfig] + list(args), input=stdin,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, env=env, timeout=timeout)
        return proc.returncode, proc.stdout

    def run_tool(self, tool, *args, env=None, stdin=None, timeout=300):
        """.tools/bin/TOOL ARGS as the cluster's admin (KUBECONFIG), with HOME and helm's
        directories inside the test's own: (exit code, stdout + stderr)."""
        home = self.home
        base = dict(os.environ, HOME=home, KUBECONFIG=self.kubeconfig,
                    HELM_CACHE_HOME=os.path.join(home, "helm-cache"),
                    HELM_CONFIG_HOME=os.path.join(home, "helm-config"),
                    HELM_DATA_HOME=os.path.join(home, "helm-data"))
        base.update(env or {})
        proc = subprocess.run([os.path.join(self.tools, tool)] + list(args), input=stdin,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, env=base, timeout=timeout)
        return proc.returncode, proc.stdout

    def helm(self, helm, *args):
        """`helm ARGS` (helm: the tool's name, helm3 or helm4) that must succeed: its output;
        AssertionError with that output if it fails."""
        code, out = self.run_tool(helm, *args)
        if code != 0:
            raise AssertionError("%s %s:\n%s" % (helm, " ".join(args), out))
        return out

    def install_chart(self, helm, release, namespace, *values):
        """The project's chart (charts/spawnpoint) installed as `release` in `namespace`
        (created), its pods parked (PARK_PODS), with `values` (more helm flags): helm's output,
        the NOTES. AssertionError with that output if helm fails."""
        return self.helm(helm, "install", release, os.path.join(self.source_dir, "charts",
                                                                 "spawnpoint"),
                         "-n", namespace, "--create-namespace", *values, *PARK_PODS)

    def service_account_kubeconfig(self, namespace, name):
        """A kubeconfig that authenticates as ServiceAccount namespace/name with a token the
        real TokenRequest API issued (as a pod's mounted token): its path."""
        code, token = self.kubectl("create", "token", name, "-n", namespace,
                                   "--duration=1h")
        if code != 0:
            raise RuntimeError("kubectl create token %s/%s: %s" % (namespace, name, token))
        code, view = self.kubectl("config", "view", "--raw", "--minify", "-o",
                                  "jsonpath={.clusters[0].cluster.server} "
                                  "{.clusters[0].cluster.certificate-authority}")
        if code != 0:
            raise RuntimeError("kubectl config view: %s" % view)
        server, ca = view.split()
        path = os.path.join(self.dir, "sa-%s-%s.kubeconfig" % (namespace, name))
        with open(path, "w") as f:
            f.write("apiVersion: v1\nkind: Config\n"
                    "clusters: [{name: c, cluster: {server: \"%s\", certificate-authority: "
                    "\"%s\"}}]\n"
                    "users: [{name: u, user: {token: \"%s\"}}]\n"
                    "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
                    "current-context: c\n" % (server, ca, token.strip()))
        return path

    def audit_events(self):
        """The API server's audit log so far (cluster.sh's policy: Metadata level), as
        dicts."""
        events = []
        with open(os.path.join(self.dir, "cp", "audit.log")) as f:
            for line in f:
                try:
                    events.append(json.loads(line))
                except ValueError:
                    pass  # a line still being written
        return events

    def start_process(self, name, argv, cwd=None):
        """Starts a helper (a node, an operator) whose output goes to DIR/NAME.log."""
        out = open(os.path.join(self.dir, name + ".log"), "w")
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                stdin=subprocess.DEVNULL)
        out.close()
        self.processes.append(proc)
        return proc

    def apply_crd(self):
        """Applies crds/trainingjob.yaml and waits until the server serves TrainingJobs."""
        crd = os.path.join(self.source_dir, "crds", "trainingjob.yaml")
        code, out = self.kubectl("apply", "-f", crd)
        if code != 0:
            raise RuntimeError("kubectl apply -f %s: %s" % (crd, out))
        self.wait_established("trainingjobs.spawnpoint.dev")

    def wait_established(self, crd, deadline_s=60):
        """Polls until CRD `crd` (plural.group) has condition Established=True. Not `kubectl
        wait --for=condition=Established`: right after the CRD is made, before the server has
        set any condition, that fails at once (".status.conditions accessor error: <nil>")."""
        jsonpath = '{.status.conditions[?(@.type=="Established")].status}'
        if not wait_until(lambda: self.kubectl("get", "crd", crd, "-o",
                                               "jsonpath=" + jsonpath) == (0, "True"),
                          deadline_s, 0.2):
            raise RuntimeError("CRD %s was not Established within %d s" % (crd, deadline_s))

    def start_operator(self, build_dir, agent_path=None, utilisation_interval="0",
                       kubeconfig=None, args=(), name="operator", crd=True):
        """The CRD (unless crd is False), then build_dir's spawnpoint-operator as pods on the
        local node need it: the agent used in place (agent_path, default build_dir's
        spawnpoint-agent), rendezvous on 127.0.0.1, and its agents' status on a port of this
        test's own (agents serve it on every interface: concurrent tests on the default 9400
        would read each other's); `args` first (a Deployment's, say), as the admin or
        `kubeconfig`'s user. Its output: the log `name`."""
        if crd:
            self.apply_crd()
        bin_dir = os.path.join(build_dir, "bin")
        self.agent_status_port = free_port()
        return self.start_process(name, [
            os.path.join(bin_dir, "spawnpoint-operator")] + list(args) + [
            "--kubeconfig", kubeconfig or self.kubeconfig,
            "--agent-path", agent_path or os.path.join(bin_dir, "spawnpoint-agent"),
            "--master-addr", "127.0.0.1", "--health-addr", "off", "--metrics-addr", "off",
            "--agent-status-port", str(self.agent_status_port),
            "--utilisation-interval", utilisation_interval])

    def log(self, name):
        with open(os.path.join(self.dir, name + ".log")) as f:
            return f.read()

    def stop(self):
        for proc in reversed(self.processes):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        subprocess.run(["bash", os.path.join(self.source_dir, "scripts", "cluster.sh"), "down",
                        "--dir", os.path.join(self.dir, "cp")], timeout=120)
        shutil.rmtree(self.dir, ignore_errors=True)


def example_trainer(build_dir, steps=5):
    """The example trainer's command line for a short CPU run of `steps` steps."""
    return [os.path.join(build_dir, "bin", "spawnpoint-example-trainer"), "--epochs", "1",
            "--steps-per-epoch", str(steps), "--batch-size", "8", "--data", "memory"]


def training_job(name, ns, command, nodes=2, procs=1, max_restarts=0, container=None,
                 template_metadata=None, **spec):
    """A TrainingJob of `nodes` pods of `procs` CPU ranks (gloo) whose trainer container runs
    `command` (plus `container`'s fields), with no loader workers, `max_restarts`, a free
    rendezvous port and a 64Mi /dev/shm; `spec` adds spec fields or replaces these."""
    template = {"spec": {"terminationGracePeriodSeconds": 5, "containers": [dict(
        {"name": "trainer", "image": "spawnpoint/example-trainer:latest", "command": command},
        **(container or {}))]}}
    if template_metadata:
        template["metadata"] = template_metadata
    return {
        "apiVersion": "spawnpoint.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": ns},
        "spec": dict({
            "nodes": nodes, "gpusPerNode": 0, "procsPerNode": procs, "backend": "gloo",
            "template": template,
            "loader": {"workersPerRank": 0},
            "restartPolicy": {"maxRestarts": max_restarts},
            "rendezvous": {"port": free_port()},
            "shmSize": "64Mi"}, **spec)}


def kubectl_ok(cluster, *argv, stdin=None):
    """`kubectl ARGV` on `cluster` as its admin; raises with its output when it fails."""
    code, out = cluster.kubectl(*argv, stdin=stdin)
    if code != 0:
        raise AssertionError("kubectl %s: %s" % (" ".join(argv), out))
    return out


class OperatorClusterTest(unittest.TestCase):
    """A test class on one Cluster of NODES local nodes of GPUS GPUs, with namespace NAMESPACE
    and the build's spawnpoint-operator (admin kubeconfig; OPERATOR_ARGS and
    UTILISATION_INTERVAL passed on, which setUpCluster may set) started after setUpCluster (a
    classmethod for what must exist first, e.g. a ResourceQuota); cls.tmp a directory of its own.
    Everything is stopped and removed at the end, also when the set-up fails."""
    NODES = 2
    GPUS = 0
    NAMESPACE = "default"
    OPERATOR_ARGS = ()
    UTILISATION_INTERVAL = "0"

    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster(ARGS.source_dir, ARGS.tools_bin, nodes=cls.NODES, gpus=cls.GPUS)
        cls.tmp = tempfile.mkdtemp(prefix="spawnpoint-%s-" % cls.__name__.lower())
        try:
            cls.kubectl_ok("create", "namespace", cls.NAMESPACE)
            cls.setUpCluster()
            cls.cluster.start_operator(ARGS.build_dir, args=cls.OPERATOR_ARGS,
                                       utilisation_interval=cls.UTILISATION_INTERVAL)
        except BaseException:
            cls.tearDownClass()  # unittest runs none after a failed setUpClass
            raise

    @classmethod
    def setUpCluster(cls):
        pass

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def kubectl_ok(cls, *argv, stdin=None):
        return kubectl_ok(cls.cluster, *argv, stdin=stdin)

    @classmethod
    def apply(cls, obj):
        """Creates the object (a dict)."""
        cls.kubectl_ok("create", "-f", "-", stdin=json.dumps(obj))

    def get(self, *argv):
        """`kubectl get ARGV -o json`, parsed."""
        return json.loads(self.kubectl_ok("get", *(list(argv) + ["-o", "json"])))
