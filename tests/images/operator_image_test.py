"""The operator image runs the operator as the chart's Deployment would (issue 20).

    operator_image_test.py --source-dir REPO --build-dir BUILD --archive BUILD/images/operator.tar

1. The image (build/images/operator.tar, from `make images`): named
   ghcr.io/spawnpoint/operator:<the chart's appVersion>, under 60 MB, user 65532:65532, OCI
   labels, and nothing in it but the operator, the libraries it links and the loader, and a
   few files of /etc: no shell, no package manager.
2. On the real control plane (scripts/cluster.sh, local_node.py's node running pods as
   processes), the chart installed with helm (its ServiceAccount, RBAC and Lease role; its
   Deployment's pod parked on no node), the image's entry point runs inside the image with
   buildah, as the Deployment's pod would get it: the Deployment's arguments, its user and
   group (65532) and read-only root file system (securityContext), its /tmp volume, the
   status-token key's Secret (the installed one's key, mode 0644 as a kubelet writes it), its
   POD_NAMESPACE/POD_NAME, and the ServiceAccount's credentials mounted where a kubelet
   mounts them (/var/run/secrets/kubernetes.io/serviceaccount: a TokenRequest token, the
   cluster's CA, the namespace) with KUBERNETES_SERVICE_HOST/PORT, so it configures itself
   in-cluster. What differs, because pods here are processes: the agent is used in place
   (--agent-path, no init container; tests/images/agent_image_test.py runs that copy), the
   rendezvous is on 127.0.0.1 and the ports are the test's own.
   It must become ready (/readyz), run as uid 65532 with a read-only root (its /proc says),
   and bring a TrainingJob to Running, and then, when its rank is let go, to Succeeded.
Exit status: 0 passed, 1 failed, 77 skipped (not root).
"""

import base64
import json
import os
import re
import shutil
import sys
import tempfile
import unittest
import urllib.error
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))

import cluster_fixture  # noqa: E402
import image_run  # noqa: E402

NS = "spawnpoint-system"
RELEASE = "spawnpoint"
REPOSITORY = "ghcr.io/spawnpoint/operator"
MAX_BYTES = 60 * 1000 * 1000
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# The status-token key's Secret (charts/spawnpoint/templates/status-token-key.yaml).
KEY_DIR = "/etc/spawnpoint/status-token-key"
DEADLINE_S = 300
# The Deployment's own pod stays Pending: no node has this label.
PARK = ["--set-string", "nodeSelector.spawnpoint\\.dev/no-such-node=true"]
# The Deployment's flags replaced with this machine's (pods are processes on one loopback).
LOCAL_FLAGS = ("--metrics-addr", "--health-addr", "--agent-status-port")
# What the image may hold besides the operator and its libraries.
ALLOWED = {"etc/passwd", "etc/group", "etc/ssl/certs/ca-certificates.crt",
           "usr/lib/ssl/cert.pem", "usr/lib/ssl/certs", "usr/local/bin/spawnpoint-operator"}

JOB = """\
apiVersion: spawnpoint.dev/v1alpha1
kind: TrainingJob
metadata: {name: image-op}
spec:
  nodes: 1
  gpusPerNode: 0
  procsPerNode: 2
  template:
    spec:
      containers:
        - name: trainer
          image: example.invalid/none  # local_node.py runs the command as it is
          command: [/bin/sh, -c, 'while [ ! -e %(go)s ]; do sleep 0.2; done']
  loader: {workersPerRank: 0}
  restartPolicy: {maxRestarts: 0}
  rendezvous: {port: %(port)d}
  runPolicy: {cleanPodPolicy: None}
"""


def args():
    return cluster_fixture.ARGS


def app_version():
    with open(os.path.join(args().source_dir, "charts", "spawnpoint", "Chart.yaml")) as f:
        return re.search(r'^appVersion:\s*"?([^"\s]+)"?', f.read(), re.M).group(1)


class OperatorImageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.store = image_run.Store()
        cls.dir = tempfile.mkdtemp(prefix="spawnpoint-operator-image-")
        cls.cluster = cluster_fixture.Cluster(args().source_dir, args().tools_bin, nodes=1)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        cls.store.close()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def kubectl(self, *argv, stdin=None):
        code, out = self.cluster.kubectl(*argv, stdin=stdin)
        self.assertEqual(code, 0, "kubectl %s: %s" % (" ".join(argv), out))
        return out

    def wait(self, what, condition, log, deadline_s=DEADLINE_S):
        if cluster_fixture.wait_until(condition, deadline_s):
            return
        with open(log) as f:
            self.fail("%s not within %d s\noperator (in its image):\n%s" % (
                what, deadline_s, f.read()[-4000:]))

    def check_image(self, image, root):
        config = image.config.get("config", {})
        labels = config.get("Labels") or {}
        self.assertEqual(image.ref, "%s:%s" % (REPOSITORY, app_version()),
                         "the archive's image name (the chart's default image)")
        self.assertLess(image.size, MAX_BYTES, "image size %.1f MB" % (image.size / 1e6))
        print("operator image: %.1f MB in %d layer(s)" % (image.size / 1e6, len(image.layers)))
        self.assertEqual(config.get("User"), "65532:65532")
        self.assertEqual(config.get("Entrypoint"), ["/usr/local/bin/spawnpoint-operator"])
        self.assertEqual(labels.get("org.opencontainers.image.version"), app_version())
        for label in ("source", "licenses", "revision", "title"):
            self.assertTrue(labels.get("org.opencontainers.image." + label), label)
        self.assertEqual(labels.get("org.opencontainers.image.licenses"), "Apache-2.0")
        # Nothing but the operator, its libraries and loader, and ALLOWED: no shell, no apt.
        files = []
        for dirpath, dirnames, filenames in os.walk(root):
            for name in filenames + [d for d in dirnames
                                     if os.path.islink(os.path.join(dirpath, d))]:
                files.append(os.path.relpath(os.path.join(dirpath, name), root))
        libraries = [f for f in files if re.match(r"^lib(64)?/.*\.so(\.\d+)*$", f)]
        others = sorted(set(files) - set(libraries) - ALLOWED)
        # buildah's mount points of the prepared runs, empty files.
        others = [f for f in others if f not in ("etc/hosts", "etc/hostname", "etc/resolv.conf")]
        self.assertEqual(others, [], "files in the image beyond the operator's own")
        self.assertIn("lib64/ld-linux-x86-64.so.2", libraries)
        for shell in ("bin/sh", "bin/bash", "usr/bin/apt-get", "usr/bin/dpkg", "bin/busybox"):
            self.assertFalse(os.path.lexists(os.path.join(root, shell)), shell)

    def installed_deployment(self):
        code, out = self.cluster.run_tool("helm3", "install", RELEASE,
                                          os.path.join(args().source_dir, "charts", "spawnpoint"),
                                          "-n", NS, "--create-namespace", *PARK)
        self.assertEqual(code, 0, out)
        self.cluster.wait_established("trainingjobs.spawnpoint.dev")
        import yaml
        code, manifest = self.cluster.run_tool("helm3", "get", "manifest", RELEASE, "-n", NS)
        self.assertEqual(code, 0, manifest)
        # The operator's (the status watchdog's runs the same image with its own arguments).
        deployments = [d for d in yaml.safe_load_all(manifest)
                       if d and d["kind"] == "Deployment" and
                       d["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"]
        self.assertEqual(len(deployments), 1)
        return deployments[0]

    def service_account_dir(self, deployment):
        """What a kubelet mounts at SA_DIR for the Deployment's ServiceAccount."""
        sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        token = self.kubectl("create", "token", sa, "-n", NS, "--duration=1h").strip()
        view = self.kubectl("config", "view", "--raw", "--minify", "-o",
                            "jsonpath={.clusters[0].cluster.server} "
                            "{.clusters[0].cluster.certificate-authority}")
        server, ca = view.split()
        path = os.path.join(self.dir, "serviceaccount")
        os.mkdir(path)
        with open(os.path.join(path, "token"), "w") as f:
            f.write(token)
        shutil.copy(ca, os.path.join(path, "ca.crt"))
        with open(os.path.join(path, "namespace"), "w") as f:
            f.write(NS)
        for name in os.listdir(path):  # a kubelet's projected volume: readable by the pod
            os.chmod(os.path.join(path, name), 0o644)
        os.chmod(path, 0o755)
        return path, urllib.parse.urlparse(server)

    def secret_dir(self, pod, mount):
        """What a kubelet mounts for `mount`, a volume of the installed Secret: one file per key,
        mode 0644 (a secret volume's default), in a directory of its own."""
        volume = [v for v in pod["volumes"] if v["name"] == mount["name"]][0]
        self.assertNotIn("defaultMode", volume["secret"],
                         "the operator (uid 65532) reads files a kubelet writes as root")
        secret = json.loads(self.kubectl("get", "secret", volume["secret"]["secretName"], "-n",
                                         NS, "-o", "json"))
        path = os.path.join(self.dir, "secret-" + mount["name"])
        os.mkdir(path)
        for key, value in secret["data"].items():
            with open(os.path.join(path, key), "wb") as f:
                f.write(base64.b64decode(value))
            os.chmod(os.path.join(path, key), 0o644)
        os.chmod(path, 0o755)
        return path

    def operator_process(self, health_port):
        """The pid of the operator started with our --health-addr, from /proc."""
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"spawnpoint-operator") and \
                    ("--health-addr=127.0.0.1:%d" % health_port).encode() in argv:
                return pid
        return None

    def test_operator_image_runs_a_job_as_the_chart_would(self):
        image = image_run.Store.image(args().archive)
        ctr = self.store.container(args().archive)
        self.check_image(image, self.store.mount(ctr))

        deployment = self.installed_deployment()
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        security = dict(pod.get("securityContext") or {})
        security.update(container.get("securityContext") or {})
        self.assertEqual(container["image"], image.ref, "the chart names the image built")
        sa_dir, server = self.service_account_dir(deployment)
        mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
        self.assertEqual(set(mounts), {"/tmp", KEY_DIR},
                         "the Deployment's volumes (the test gives /tmp and the key's Secret)")
        tmp = os.path.join(self.dir, "tmp")
        os.mkdir(tmp)
        os.chmod(tmp, 0o1777)  # an emptyDir
        key_dir = self.secret_dir(pod, mounts[KEY_DIR])

        health, metrics = cluster_fixture.free_port(), cluster_fixture.free_port()
        argv = list(image.config["config"]["Entrypoint"]) + [
            a for a in container["args"] if not a.startswith(LOCAL_FLAGS)] + [
            "--health-addr=127.0.0.1:%d" % health, "--metrics-addr=127.0.0.1:%d" % metrics,
            "--agent-status-port=%d" % cluster_fixture.free_port(),
            "--agent-path=" + os.path.join(args().build_dir, "bin", "spawnpoint-agent"),
            "--master-addr=127.0.0.1"]
        self.assertFalse([a for a in argv if a.startswith("--kubeconfig")])
        env_names = {e["name"] for e in container.get("env", [])}
        self.assertEqual(env_names, {"POD_NAMESPACE", "POD_NAME"})
        env = ["KUBERNETES_SERVICE_HOST=" + server.hostname,
               "KUBERNETES_SERVICE_PORT=%d" % server.port,
               "POD_NAMESPACE=" + NS, "POD_NAME=%s-image-test" % RELEASE]
        user = "%d:%d" % (security["runAsUser"], security["runAsGroup"])
        self.assertEqual(user, "65532:65532")
        self.assertTrue(security.get("readOnlyRootFilesystem"))
        log = os.path.join(self.dir, "operator.log")
        print("$ buildah run --user %s (read-only root) %s" % (user, " ".join(argv)))
        proc = self.store.popen(ctr, argv, log, user=user, env=env, read_only=True,
                                volumes=[(sa_dir, SA_DIR, "ro"), (tmp, "/tmp", "rw"),
                                         (key_dir, KEY_DIR, "ro")],
                                prepare=[argv[0], "--help"])
        try:
            self.run_job(proc, log, health, server.geturl())
        finally:
            image_run.Store.stop(proc)
            with open(log) as f:
                print("--- operator (in its image), last lines:\n" + f.read()[-3000:])

    def run_job(self, proc, log, health, server_url):
        def ready():
            self.assertIsNone(proc.poll(), "the operator exited")
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/readyz" % health,
                                            timeout=5) as r:
                    return r.status == 200
            except (urllib.error.URLError, OSError):
                return False
        self.wait("the operator in its image ready (/readyz)", ready, log, 120)
        # In-cluster configuration: no --kubeconfig, the server from KUBERNETES_SERVICE_*,
        # and the API server saw the ServiceAccount's requests.
        with open(log) as f:
            text = f.read()
        self.assertIn("server=%s " % server_url, text)
        sa_user = "system:serviceaccount:%s:%s" % (NS, RELEASE)
        self.assertTrue(any(e.get("user", {}).get("username") == sa_user
                            for e in self.cluster.audit_events()),
                        "no request of %s in the API server's audit log" % sa_user)

        pid = self.operator_process(health)
        self.assertIsNotNone(pid, "the operator's process")
        with open("/proc/%s/status" % pid) as f:
            ids = dict(line.split(":", 1) for line in f if line.startswith(("Uid", "Gid")))
        self.assertEqual(ids["Uid"].split(), ["65532"] * 4)
        self.assertEqual(ids["Gid"].split(), ["65532"] * 4)
        with open("/proc/%s/mountinfo" % pid) as f:
            root = [line.split() for line in f if line.split()[4] == "/"]
        self.assertEqual(len(root), 1, root)
        self.assertIn("ro", root[0][5].split(","), "the root is mounted read-only: %s" % root)

        go = os.path.join(self.dir, "go")
        self.kubectl("apply", "-f", "-",
                     stdin=JOB % {"go": go, "port": cluster_fixture.free_port()})

        def phase():
            code, out = self.cluster.kubectl("get", "tj", "image-op", "-o",
                                             "jsonpath={.status.phase}")
            return out if code == 0 else ""
        self.wait("phase Running", lambda: phase() in ("Running", "Failed", "Succeeded"), log)
        self.assertEqual(phase(), "Running")
        pods = json.loads(self.kubectl("get", "pods", "-l", "spawnpoint.dev/job-name=image-op",
                                       "-o", "json"))["items"]
        self.assertEqual([p["status"]["phase"] for p in pods], ["Running"])
        with open(go, "w"):
            pass
        self.wait("phase Succeeded", lambda: phase() in ("Succeeded", "Failed"), log)
        job = json.loads(self.kubectl("get", "tj", "image-op", "-o", "json"))
        self.assertEqual(job["status"]["phase"], "Succeeded", json.dumps(job["status"]))
        self.assertIsNone(proc.poll(), "the operator is still running")


def main():
    image_run.require_root_and_buildah()
    cluster_fixture.main(build_dir=True, required=("--archive",))


if __name__ == "__main__":
    main()
