"""The TrainingJob CRD as a real API server sees it (issue 23): crds/trainingjob.yaml applied to
the pinned kube-apiserver that scripts/cluster.sh starts on loopback, driven with the pinned
kubectl. The server must default, validate and print TrainingJobs as docs/trainingjob.md
says: every default in its field table (read from the document, so the two cannot drift
apart), the documented rejections with the field's path, unknown fields refused by kubectl's
strict field validation (the server's), also inside spec.template (the CRD carries Kubernetes'
PodTemplateSpec schema, scripts/gen-pod-template-schema.py), a full pod template kept as
given, and the printer columns of `kubectl get tj`.

    python3 test_crd_on_real_server.py --source-dir REPO [--tools-bin DIR] [unittest args]

The control plane is started once for the module (cluster_fixture.py) and stopped at the
end. Tools come from REPO/.tools/bin (scripts/install-tools.sh --control-plane; a missing one
fails the test with the command that builds it). Standard library only.
"""

import json
import os
import re
import time
import unittest

import cluster_fixture


def args():
    """The command line (cluster_fixture.main)."""
    return cluster_fixture.ARGS

CLUSTER = {}

MINIMAL = """\
apiVersion: spawnpoint.dev/v1alpha1
kind: TrainingJob
metadata: {name: %s}
spec:
  nodes: 1
%s  template: {spec: {containers: [{name: trainer, image: example.invalid/trainer}]}}
"""


# A job with a full pod template: TEMPLATE % (name, pod spec lines, trainer container lines).
TEMPLATE = """\
apiVersion: spawnpoint.dev/v1alpha1
kind: TrainingJob
metadata: {name: %s}
spec:
  template:
    metadata: {labels: {team: vision}, creationTimestamp: null}
    spec:
%s      containers:
        - name: trainer
          image: example.invalid/trainer
          command: [python3, train.py]
%s"""

FULL_POD = """\
      securityContext: {runAsNonRoot: true, runAsUser: 1000, fsGroup: 1000}
      nodeSelector: {example.com/pool: gpu}
      tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
      volumes:
        - name: data
          emptyDir: {sizeLimit: 1Gi}
        - name: config
          configMap: {name: cfg, items: [{key: a, path: a.json}], defaultMode: 0644}
      imagePullSecrets: [{name: registry}]
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
              - matchExpressions: [{key: zone, operator: In, values: [a, b]}]
"""

FULL_CONTAINER = """\
          args: [--epochs, "2"]
          workingDir: /workspace
          env:
            - {name: BATCH, value: "256"}
            - name: POD_NAME
              valueFrom: {fieldRef: {fieldPath: metadata.name}}
            - name: TOKEN
              valueFrom: {secretKeyRef: {name: s, key: k}}
          envFrom: [{configMapRef: {name: cfg}}]
          resources:
            limits: {cpu: 2, memory: 4Gi}
            requests: {cpu: 500m, memory: 1Gi}
          securityContext:
            allowPrivilegeEscalation: false
            capabilities: {drop: [ALL]}
          ports: [{name: http, containerPort: 8080}]
          readinessProbe: {httpGet: {path: /healthz, port: http}, periodSeconds: 5}
          volumeMounts: [{name: data, mountPath: /data}, {name: config, mountPath: /cfg}]
"""


def kubectl(*args, stdin=None):
    """kubectl against the test cluster; (exit code, stdout + stderr)."""
    return CLUSTER["cluster"].kubectl(*args, stdin=stdin)


def documented_defaults(path):
    """{dotted field: default} from docs/trainingjob.md's field table; fields whose default is
    'required' or 'none' are left out."""
    defaults = {}
    with open(path) as f:
        lines = f.readlines()
    for line in lines:
        m = re.match(r"^\| `([a-zA-Z.]+)` \| ([^|]+) \|", line)
        if not m:
            continue
        field, text = m.group(1), m.group(2).strip()
        if text in ("required", "none"):
            continue
        text = text.strip("`")
        if text in ("true", "false"):
            value = text == "true"
        elif re.match(r"^-?\d+$", text):
            value = int(text)
        elif re.match(r"^-?\d+\.\d+$", text):
            value = float(text)
        elif text.startswith("[") and text.endswith("]"):
            value = [t.strip() for t in text[1:-1].split(",") if t.strip()]
        else:
            value = text
        defaults[field] = value
    return defaults


def lookup(obj, dotted):
    for part in dotted.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def setUpModule():
    CLUSTER["cluster"] = cluster_fixture.Cluster(args().source_dir, args().tools_bin)
    CLUSTER["cluster"].apply_crd()


def tearDownModule():
    if "cluster" in CLUSTER:
        CLUSTER["cluster"].stop()


class CrdOnRealServerTest(unittest.TestCase):
    def apply(self, name, spec_lines="", *flags):
        return kubectl("apply", *flags, "-f", "-", stdin=MINIMAL % (name, spec_lines))

    def test_the_server_applies_every_documented_default(self):
        defaults = documented_defaults(os.path.join(args().source_dir, "docs", "trainingjob.md"))
        self.assertIn("loader.prefetchFactor", defaults)  # the table was read
        code, out = self.apply("defaults")
        self.assertEqual(code, 0, out)
        code, out = kubectl("get", "tj", "defaults", "-o", "json")
        self.assertEqual(code, 0, out)
        spec = json.loads(out)["spec"]
        for field, want in sorted(defaults.items()):
            got = lookup(spec, field)
            if want == [] and got is None:
                continue  # an empty list and no list mean the same
            self.assertEqual(got, want, "spec.%s: the server defaulted %r, docs/trainingjob.md "
                             "says %r" % (field, got, want))

    def test_documented_rejections_name_the_field(self):
        cases = [
            ("  nodes: 0\n", "spec.nodes", "greater than or equal to 1"),
            ("  loader: {startMethod: fork}\n", "spec.loader.startMethod",
             'Unsupported value: "fork"'),
            ("  backend: mpi\n", "spec.backend", 'Unsupported value: "mpi"'),
            ("  gpuAssignment: both\n", "spec.gpuAssignment", "Unsupported value"),
            ("  gpuResource: example.com/tpu\n", "spec.gpuResource", "Unsupported value"),
            ("  loader: {prefetchFactor: 0}\n", "spec.loader.prefetchFactor",
             "greater than or equal to 1"),
            ("  loader: {workersPerRank: lots}\n", "spec.loader.workersPerRank", "lots"),
            ("  restartPolicy: {maxRestarts: -1}\n", "spec.restartPolicy.maxRestarts",
             "greater than or equal to 0"),
            ("  restartPolicy: {mode: Sometimes}\n", "spec.restartPolicy.mode",
             'Unsupported value: "Sometimes"'),
            ("  runPolicy: {cleanPodPolicy: Sometimes}\n", "spec.runPolicy.cleanPodPolicy",
             "Unsupported value"),
            ("  rendezvous: {port: 70000}\n", "spec.rendezvous.port",
             "less than or equal to 65535"),
            ("  shmSize: huge\n", "spec.shmSize", "huge"),
            # The CRD's CEL rules: what the operator would otherwise refuse only later.
            ("  backend: nccl\n  gpusPerNode: 0\n", "spec.backend", '"nccl" needs GPUs'),
            ("  nodes: 10000\n  gpusPerNode: 8\n", "spec.nodes",
             "the job's GPUs (nodes x gpusPerNode) must be at most 32768"),
        ]
        for spec_lines, field, words in cases:
            with self.subTest(field=field):
                code, out = self.apply("rejected", spec_lines)
                self.assertNotEqual(code, 0, "accepted: %s" % spec_lines)
                self.assertIn(field, out)
                self.assertIn(words, out)
                self.assertNotIn("created", out)

    def test_a_name_too_long_for_its_pods_is_refused(self):
        # 52 characters: "-node-NNN" still fits a pod's hostname in 63; 53 never do.
        code, out = self.apply("n" * 52)
        self.assertEqual(code, 0, out)
        code, out = self.apply("n" * 53)
        self.assertNotEqual(code, 0, out)
        self.assertIn("metadata.name must be at most 52 characters", out)
        self.assertNotIn("created", out)

    def test_unknown_fields_are_refused_with_their_path(self):
        code, out = self.apply("typo", "  nodez: 2\n")
        self.assertNotEqual(code, 0, out)
        self.assertIn('unknown field "spec.nodez"', out)
        code, _ = kubectl("get", "tj", "typo")
        self.assertNotEqual(code, 0, "the job with a typo was created")

    def apply_template(self, name, container_lines, pod_lines=""):
        """Applies a job whose trainer container has `container_lines` (YAML at the
        container's indentation) and whose pod spec has `pod_lines`."""
        manifest = TEMPLATE % (name, pod_lines, container_lines)
        return kubectl("apply", "-f", "-", stdin=manifest)

    def test_pod_template_typos_are_refused_with_their_path(self):
        # kubectl's default, strict field validation (kubectl >= 1.27), done by the server
        # against the CRD's PodTemplateSpec schema.
        code, out = self.apply_template("tmpl-typo", "          arg: [--epochs, '2']\n")
        self.assertNotEqual(code, 0, out)
        self.assertIn('unknown field "spec.template.spec.containers[0].arg"', out)
        code, _ = kubectl("get", "tj", "tmpl-typo")
        self.assertNotEqual(code, 0, "the job with a typo in its template was created")
        code, out = self.apply_template("tmpl-typo", "", "      nodeSelectr: {a: b}\n")
        self.assertNotEqual(code, 0, out)
        self.assertIn('unknown field "spec.template.spec.nodeSelectr"', out)

    def test_pod_template_types_are_checked(self):
        cases = [
            ("          command: python3\n", "spec.template.spec.containers[0].command"),
            ("          resources: {limits: {memory: lots}}\n",
             "spec.template.spec.containers[0].resources.limits.memory"),
            ("          ports: [{containerPort: http}]\n",
             "spec.template.spec.containers[0].ports[0].containerPort"),
            # A CRD's int-or-string takes no fractions (the agent says so too: "500m").
            ("          resources: {requests: {cpu: 0.5}}\n",
             "spec.template.spec.containers[0].resources.requests.cpu"),
            ("          env: [{name: A, value: '1'}, {name: A, value: '2'}]\n",
             "spec.template.spec.containers[0].env[1]: Duplicate value"),
            ("          volumeMounts: [{name: data}]\n",
             "spec.template.spec.containers[0].volumeMounts[0].mountPath: Required value"),
        ]
        for lines, field in cases:
            with self.subTest(field=field):
                code, out = self.apply_template("tmpl-type", lines)
                self.assertNotEqual(code, 0, "accepted: %s" % lines)
                self.assertIn(field, out)

    def test_a_full_pod_template_is_accepted_and_kept(self):
        container = FULL_CONTAINER
        code, out = self.apply_template("tmpl-full", container, FULL_POD)
        self.assertEqual(code, 0, out)
        code, out = kubectl("get", "tj", "tmpl-full", "-o", "json")
        self.assertEqual(code, 0, out)
        tmpl = json.loads(out)["spec"]["template"]
        c = tmpl["spec"]["containers"][0]
        self.assertEqual(c["env"][1], {"name": "POD_NAME",
                                       "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
        self.assertEqual(c["env"][2]["valueFrom"]["secretKeyRef"], {"name": "s", "key": "k"})
        self.assertEqual(c["resources"]["limits"], {"cpu": 2, "memory": "4Gi"})
        self.assertEqual(c["resources"]["requests"]["cpu"], "500m")
        self.assertEqual(c["securityContext"]["capabilities"], {"drop": ["ALL"]})
        self.assertEqual(c["readinessProbe"]["httpGet"]["port"], "http")
        self.assertEqual(c["ports"], [{"name": "http", "containerPort": 8080,
                                       "protocol": "TCP"}])  # the server's default
        self.assertEqual(tmpl["metadata"]["labels"], {"team": "vision"})
        self.assertEqual(tmpl["spec"]["volumes"][0]["emptyDir"], {"sizeLimit": "1Gi"})
        self.assertEqual(tmpl["spec"]["nodeSelector"], {"example.com/pool": "gpu"})
        self.assertEqual(tmpl["spec"]["tolerations"][0]["key"], "nvidia.com/gpu")
        self.assertEqual(tmpl["spec"]["securityContext"]["fsGroup"], 1000)

    def test_the_crd_fits_kubectls_last_applied_annotation(self):
        # Client-side `kubectl apply` keeps the whole CRD in an annotation, and annotations
        # are limited to 256 KiB in all: the PodTemplateSpec schema must leave room.
        code, out = kubectl("get", "crd", "trainingjobs.spawnpoint.dev", "-o", "json")
        self.assertEqual(code, 0, out)
        crd = json.loads(out)
        applied = crd["metadata"]["annotations"][
            "kubectl.kubernetes.io/last-applied-configuration"]
        self.assertLess(len(applied), 200 * 1024)
        self.assertIn("readinessProbe", applied)  # the generated schema is in it

    def test_printer_columns_and_short_name(self):
        code, out = self.apply("columns", "  procsPerNode: 2\n")
        self.assertEqual(code, 0, out)
        code, out = kubectl("get", "tj", "columns")
        self.assertEqual(code, 0, out)
        header, row = out.splitlines()[0].split(), out.splitlines()[1].split()
        self.assertEqual(header, ["NAME", "PHASE", "NODES", "GPUS", "RESTARTS", "GPU-UTIL",
                                  "DATA-STALL", "STALLED", "UPDATED", "STALE", "AGE"])
        self.assertEqual(row[0:2], ["columns", "1"], out)  # no phase yet: the operator sets it
        # A running job whose operator stopped reading it: UPDATED says how long ago its
        # utilisation was read (issue 41: it read Running with live-looking numbers).
        then = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 600))
        # And the status watchdog marked it: STALE says so (the StatusStale condition).
        status = {"status": {"phase": "Running", "utilisation": {"gpu": 0.89, "updated": then},
                             "conditions": [{"type": "StatusStale", "status": "True",
                                             "reason": "OperatorNotRunning", "message": "m",
                                             "lastTransitionTime": then}]}}
        code, out = kubectl("patch", "tj", "columns", "--subresource=status", "--type=merge",
                            "-p", json.dumps(status))
        self.assertEqual(code, 0, out)
        code, out = kubectl("get", "tj", "columns")
        self.assertEqual(code, 0, out)
        head, line = out.splitlines()[0], out.splitlines()[1]

        def cell(column):  # empty cells are blanks: read by the header's offsets
            at = head.index(column)
            return line[at:].split(" ", 1)[0]
        self.assertEqual(cell("PHASE"), "Running", out)
        self.assertEqual(cell("GPU-UTIL"), "0.89", out)
        self.assertRegex(cell("UPDATED"), r"^(10|11)m$", out)
        self.assertEqual(cell("STALE"), "True", out)
        code, out = kubectl("get", "trainingjobs.spawnpoint.dev", "columns", "-o", "name")
        self.assertEqual((code, out.strip()), (0, "trainingjob.spawnpoint.dev/columns"))


if __name__ == "__main__":
    cluster_fixture.main(build_dir=False)
