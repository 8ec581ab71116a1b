"""The TrainingJob CRD as a real API server sees it (issue 23): crds/trainingjob.yaml applied to
the pinned kube-apiserver that scripts/cluster.sh starts on loopback, driven with the pinned
kubectl. The server must default, validate and print TrainingJobs as docs/trainingjob.md
says: every default in its field table (read from the document, so the two cannot drift
apart), the documented rejections with the field's path, unknown fields refused by kubectl's
strict field validation (the server's), and the printer columns of `kubectl get tj`.

    python3 test_crd_on_real_server.py --source-dir REPO [--tools-bin DIR] [unittest args]

The control plane is started once for the module (cluster_fixture.py) and stopped at the
end. Tools come from REPO/.tools/bin (scripts/install-tools.sh --control-plane; a missing one
fails the test with the command that builds it). Standard library only.
"""

import json
import os
import re
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
            ("  runPolicy: {cleanPodPolicy: Sometimes}\n", "spec.runPolicy.cleanPodPolicy",
             "Unsupported value"),
            ("  rendezvous: {port: 70000}\n", "spec.rendezvous.port",
             "less than or equal to 65535"),
            ("  shmSize: huge\n", "spec.shmSize", "huge"),
        ]
        for spec_lines, field, words in cases:
            with self.subTest(field=field):
                code, out = self.apply("rejected", spec_lines)
                self.assertNotEqual(code, 0, "accepted: %s" % spec_lines)
                self.assertIn(field, out)
                self.assertIn(words, out)
                self.assertNotIn("created", out)

    def test_unknown_fields_are_refused_with_their_path(self):
        code, out = self.apply("typo", "  nodez: 2\n")
        self.assertNotEqual(code, 0, out)
        self.assertIn('unknown field "spec.nodez"', out)
        code, _ = kubectl("get", "tj", "typo")
        self.assertNotEqual(code, 0, "the job with a typo was created")

    def test_printer_columns_and_short_name(self):
        code, out = self.apply("columns", "  procsPerNode: 2\n")
        self.assertEqual(code, 0, out)
        code, out = kubectl("get", "tj", "columns")
        self.assertEqual(code, 0, out)
        header, row = out.splitlines()[0].split(), out.splitlines()[1].split()
        self.assertEqual(header, ["NAME", "PHASE", "NODES", "GPUS", "RESTARTS", "GPU-UTIL",
                                  "DATA-STALL", "AGE"])
        self.assertEqual(row[0:2], ["columns", "1"], out)  # no phase yet: the operator sets it
        code, out = kubectl("get", "trainingjobs.spawnpoint.dev", "columns", "-o", "name")
        self.assertEqual((code, out.strip()), (0, "trainingjob.spawnpoint.dev/columns"))


if __name__ == "__main__":
    cluster_fixture.main(build_dir=False)
