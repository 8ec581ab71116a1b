"""The CRD's torchrun rules (scripts/gen-torchrun-cel.py) on the real API server, against the
operator's own reading of the same manifests (issue 41): `kubectl apply` refuses a trainer
whose torchrun flags contradict the spec, where CEL can tell, and never refuses what the
operator would run.

- Every contradiction listed below, in each launcher form and flag spelling, is refused by the
  server with its rule's message, and the operator's decoder (`spawnpoint-agent plan`, the same
  api/ code the operator's InvalidSpec comes from) refuses it too.
- Over a corpus of 400 generated command lines and specs (fixed seed), every manifest the server
  refuses for a torchrun rule is one the decoder refuses for a torchrun flag: the rules are a
  subset of the operator's refusals. The decoder's refusals the server let through are counted
  (what CEL cannot tell: a value written at its default, forms the rules do not read).

    python3 test_torchrun_cel_on_real_server.py --source-dir REPO --build-dir BUILD

Standard library only.
"""

import json
import os
import random
import re
import subprocess
import tempfile
import unittest

import cluster_fixture

CLUSTER = {}
RULE_WORDS = "the trainer's torchrun --"
# What the decoder says of a torchrun flag it refuses (api/torchrun_spec.cc, torchrun_command.cc).
DECODER_TORCHRUN = re.compile(r"(torchrun|torch\.distributed\.launch)'s ")

LAUNCHERS = [
    ["torchrun"],
    ["/usr/local/bin/torchrun"],
    ["python3", "-m", "torch.distributed.run"],
    ["python", "-m", "torch.distributed.launch"],
    ["python3.11", "/usr/bin/torchrun"],
    # Forms the decoder reads and the rules do not: never refused by the server.
    ["python3", "-u", "-m", "torch.distributed.run"],
    ["python3", "-mtorch.distributed.run"],
    ["bash", "-c", "torchrun --nproc_per_node=3 train.py"],
]

# Option elements, each one or two argv elements.
OPTIONS = [
    ["--nproc_per_node=2"], ["--nproc-per-node=4"], ["--nproc_per_node", "4"],
    ["--nproc_per_node=gpu"], ["--nproc_per_node=cpu"], ["--nproc_per_node=auto"],
    ["--nproc_per_node=$(NPROC)"], ["--nproc_per_node=04"], ["--nnodes=2"], ["--nnodes", "3"],
    ["--nnodes=1:4"], ["--nnodes=3:3"], ["--nnodes=2:1"], ["--standalone"],
    ["--max_restarts=2"], ["--max-restarts=5"], ["--max_restarts", "3"],
    ["--master_port", "1234"], ["--master-port=29500"], ["--master_port=4321"],
    ["--rdzv_backend=c10d"], ["--rdzv_endpoint", "host:29400"], ["--rdzv-id", "job"],
    ["-r", "3"], ["-t3"], ["--no_python"], ["--log_dir", "--nproc_per_node=7"],
    ["--monitor_interval=1"], ["--"],
]

SCRIPT_ARGS = [[], ["--epochs", "2"], ["--nproc_per_node=7"], ["--nnodes=9", "--standalone"]]

SPECS = {
    "gpusPerNode": [None, 0, 2, 4],
    "procsPerNode": [None, 1, 4],
    "nodes": [None, 1, 2, 3],
    "restartPolicy.maxRestarts": [None, 3, 5],
    "rendezvous.port": [None, 29500, 1234],
}

# (spec fields, argv): each refused by the server and by the decoder.
CONTRADICTIONS = [
    ({"gpusPerNode": 2}, ["torchrun", "--nproc_per_node=4", "train.py"]),
    ({"gpusPerNode": 2}, ["torchrun", "--nproc-per-node", "4", "train.py"]),
    ({"gpusPerNode": 2}, ["torchrun", "--nnodes", "1", "--nproc_per_node=3", "train.py"]),
    ({"gpusPerNode": 2}, ["python3", "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node=3", "train.py"]),
    ({"gpusPerNode": 2}, ["python3", "/usr/bin/torchrun", "--nproc_per_node", "1", "t.py"]),
    ({"gpusPerNode": 2}, ["torchrun", "--nproc_per_node=cpu", "train.py"]),
    ({"gpusPerNode": 0}, ["torchrun", "--nproc_per_node=gpu", "train.py"]),
    ({"procsPerNode": 4}, ["torchrun", "--nproc_per_node=2", "train.py"]),
    ({"nodes": 2}, ["torchrun", "--standalone", "train.py"]),
    ({"nodes": 2}, ["torchrun", "--nnodes=3", "train.py"]),
    ({"nodes": 5}, ["python", "-m", "torch.distributed.launch", "--nnodes=1:4", "train.py"]),
    ({"restartPolicy.maxRestarts": 5}, ["torchrun", "--max-restarts=2", "train.py"]),
    ({"rendezvous.port": 1234}, ["torchrun", "--master_port", "29400", "train.py"]),
]

# (spec fields, argv): accepted by the server (the decoder agrees, or the rules cannot tell).
ACCEPTED = [
    ({"gpusPerNode": 2}, ["torchrun", "--nproc_per_node=2", "train.py"]),
    ({"gpusPerNode": 2}, ["torchrun", "train.py", "--nproc_per_node=4"]),
    ({"gpusPerNode": 2}, ["torchrun", "--nproc_per_node=$(N)", "train.py"]),
    ({"nodes": 2}, ["torchrun", "--nnodes=1:4", "train.py"]),
    ({"nodes": 2}, ["torchrun", "--log_dir", "x", "--nnodes=2", "train.py"]),
    ({}, ["torchrun", "--nnodes=3", "--nproc_per_node=4", "--max_restarts=1", "train.py"]),
]


def manifest(name, fields, argv):
    """A TrainingJob: `fields` ({"a.b": value}) in spec, argv as the trainer's command."""
    spec = {"template": {"spec": {"containers": [
        {"name": "trainer", "image": "example.invalid/trainer", "command": argv}]}}}
    for dotted, value in fields.items():
        if value is None:
            continue
        node = spec
        parts = dotted.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return json.dumps({"apiVersion": "spawnpoint.dev/v1alpha1", "kind": "TrainingJob",
                       "metadata": {"name": name}, "spec": spec})


def corpus(n, seed=41):
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        fields = {key: rng.choice(values) for key, values in SPECS.items()}
        argv = list(rng.choice(LAUNCHERS))
        for _ in range(rng.randint(0, 5)):
            argv += rng.choice(OPTIONS)
        argv.append(rng.choice(["train.py", "pkg.train"]))
        argv += rng.choice(SCRIPT_ARGS)
        cases.append((fields, argv))
    return cases


class TorchrunCelOnRealServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="spawnpoint-torchrun-cel-")
        # The script the decoder's plan looks for: it exists, so only the flags are judged.
        for script in ("train.py", "t.py"):
            open(os.path.join(cls.dir, script), "w").close()

    def verdicts(self, cases):
        """[(server refusal message or None, decoder torchrun error or None)] for cases."""
        cluster = CLUSTER["cluster"]
        files = []
        for i, (fields, argv) in enumerate(cases):
            path = os.path.join(self.dir, "job-%03d.json" % i)
            with open(path, "w") as f:
                f.write(manifest("job-%03d" % i, fields, argv))
            files.append(path)
        flags = []
        for path in files:
            flags += ["-f", path]
        # One apply for all: the server judges each object on its own.
        _, out = cluster.kubectl("apply", "--dry-run=server", *flags, timeout=600)
        server = {}
        for line in out.splitlines():
            # "Error from server (Invalid): error when creating "PATH": TrainingJob.spawnpoint.dev
            # "job-NNN" is invalid: MESSAGE"
            m = re.search(r'"job-(\d+)" is invalid: (.*)', line)
            if m:
                server[int(m.group(1))] = m.group(2)
            elif re.match(r"trainingjob\.spawnpoint\.dev/job-\d+ created \(server dry run\)",
                          line) is None and line.strip():
                self.fail("unexpected kubectl output: %s\n%s" % (line, out[-3000:]))
        agent = os.path.join(os.path.abspath(cluster_fixture.ARGS.build_dir), "bin",
                             "spawnpoint-agent")
        results = []
        for i, path in enumerate(files):
            proc = subprocess.run([agent, "plan", "-f", path], cwd=self.dir,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  universal_newlines=True, timeout=60)
            decoder = None
            for line in proc.stderr.splitlines():
                if "error:" in line and DECODER_TORCHRUN.search(line):
                    decoder = line
            if decoder is not None:
                self.assertNotEqual(proc.returncode, 0, decoder)
            results.append((server.get(i), decoder))
        return results

    def test_contradictions_are_refused_by_the_server_and_the_decoder(self):
        for (fields, argv), (server, decoder) in zip(CONTRADICTIONS,
                                                     self.verdicts(CONTRADICTIONS)):
            with self.subTest(fields=fields, argv=argv):
                self.assertIsNotNone(server, "the server accepted it")
                self.assertIn(RULE_WORDS, server)
                self.assertIn("spec.template.spec.containers", server)
                self.assertIn("make them agree or drop the flag", server)
                self.assertIsNotNone(decoder, "the decoder accepted what the server refused")

    def test_agreeing_flags_and_the_scripts_own_are_accepted(self):
        for (fields, argv), (server, _) in zip(ACCEPTED, self.verdicts(ACCEPTED)):
            with self.subTest(fields=fields, argv=argv):
                self.assertIsNone(server)

    def test_the_rules_refuse_nothing_the_decoder_accepts(self):
        cases = corpus(400)
        refused = both = decoder_only = 0
        for (fields, argv), (server, decoder) in zip(cases, self.verdicts(cases)):
            if server is not None:
                refused += 1
                self.assertIn(RULE_WORDS, server, "refused for another reason: %s" % server)
                self.assertIsNotNone(decoder, "the server refused, the decoder accepted: "
                                     "spec %s, argv %s: %s" % (fields, argv, server))
                both += 1
            elif decoder is not None:
                decoder_only += 1
        print("corpus: %d cases, %d refused by the server (all by the decoder too), %d more "
              "by the decoder only" % (len(cases), refused, decoder_only))
        # The corpus exercises the rules: a generator change that made them never fire fails.
        self.assertGreater(both, 40)


def setUpModule():
    CLUSTER["cluster"] = cluster_fixture.Cluster(cluster_fixture.ARGS.source_dir,
                                                 cluster_fixture.ARGS.tools_bin)
    CLUSTER["cluster"].apply_crd()


def tearDownModule():
    if "cluster" in CLUSTER:
        CLUSTER["cluster"].stop()


if __name__ == "__main__":
    cluster_fixture.main(build_dir=True)
