"""What every test in a foreign trainer root shares (run inside the root, by its python3).

A foreign test is a script in this folder that run_foreign_test.sh runs inside a root made
by scripts/foreign-root.sh (CMakeLists.txt registers it, one line). There it sees:
  /opt/spawnpoint         the agent bundle, read-only (bin/spawnpoint-agent, the shim)
  /opt/spawnpoint-tests   this folder, read-only
  /opt/spawnpoint-src     the source's agent/python, tests/python and tests/support, read-only
  /tmp                    a fresh, writable tmpfs (HOME and the working directory)
  SPAWNPOINT_FOREIGN_SUITE the root's Debian suite (bullseye, trixie)
It exits 0 when it passed, 1 when it failed, 77 to skip. This module must load on every
root's Python (3.9 and up) and imports no torch.
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap

BUNDLE = "/opt/spawnpoint"
AGENT = os.path.join(BUNDLE, "bin", "spawnpoint-agent")
TESTS = os.path.dirname(os.path.abspath(__file__))
SOURCE = "/opt/spawnpoint-src"

# What each root is: Debian's packages of its release (major.minor).
EXPECTED = {
    "bullseye": {"debian": "11", "python": "3.9", "torch": "1.7", "glibc": "2.31"},
    "trixie": {"debian": "13", "python": "3.13", "torch": "2.6", "glibc": "2.41"},
}


def suite():
    """The suite of the root this runs in (from run_foreign_test.sh)."""
    name = os.environ.get("SPAWNPOINT_FOREIGN_SUITE", "")
    if name not in EXPECTED:
        raise SystemExit("FAIL: SPAWNPOINT_FOREIGN_SUITE=%r is none of %s; run this through "
                         "tests/foreign/run_foreign_test.sh" % (name, sorted(EXPECTED)))
    return name


def major_minor(version):
    """'2.6.0+dfsg' -> '2.6'; '3.9.2 (default, ...)' -> '3.9'."""
    return ".".join(version.split()[0].split("+")[0].split(".")[:2])


def job_yaml(name, command, procs=2, workers=2, extra="", python_pool=True):
    """A one-node CPU TrainingJob: `procs` gloo ranks running `command` (a list), the job's
    DataLoader workers per rank `workers`, the agent's loader pool for Python ranks unless
    python_pool is false, no restarts. `extra` is more YAML for spec (indented by two
    spaces)."""
    return textwrap.dedent("""\
        apiVersion: spawnpoint.dev/v1alpha1
        kind: TrainingJob
        metadata: {name: %s}
        spec:
          nodes: 1
          gpusPerNode: 0
          procsPerNode: %d
          backend: gloo
          template:
            spec:
              containers:
                - name: trainer
                  image: foreign-root
                  command: %s
          loader:
            workersPerRank: %d
            timeoutSeconds: 120
            pythonPool: %s
          restartPolicy: {maxRestarts: 0}
        """) % (name, procs, json.dumps(command), workers,
                "true" if python_pool else "false") + extra


def run_agent(job_text, args=(), timeout=600, env=None):
    """Runs `spawnpoint-agent run` of the bundle on job_text in a fresh directory under /tmp;
    returns the subprocess.CompletedProcess (stdout, stderr as text)."""
    workdir = tempfile.mkdtemp(prefix="foreign-job-")
    job = os.path.join(workdir, "job.yaml")
    with open(job, "w") as f:
        f.write(job_text)
    full_env = dict(os.environ)
    full_env.update(env or {})
    command = [AGENT, "run", "-f", job, "--gpu-backend", "none", "--master-port", "0",
               "--metrics-addr", "off", "--status-interval", "60"] + list(args)
    print("$ " + " ".join(command), flush=True)
    return subprocess.run(command, cwd=workdir, env=full_env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=timeout)


def rank_reports(stdout, tag):
    """{rank: document} of the lines '[rank N] <tag> {json}' the agent relayed."""
    reports = {}
    for line in stdout.splitlines():
        if not line.startswith("[rank ") or ("] %s " % tag) not in line:
            continue
        head, _, document = line.partition("] %s " % tag)
        reports[int(head[len("[rank "):])] = json.loads(document)
    return reports


def show(proc):
    """The agent's output, for a failure message."""
    return "--- stdout ---\n%s--- stderr ---\n%s" % (proc.stdout, proc.stderr)


class Checks(object):
    """Collects named checks; finish() prints the tally and returns the exit status."""

    def __init__(self, name):
        self.name = name
        self.passed = 0
        self.failed = 0

    def check(self, ok, what, detail=""):
        if ok:
            self.passed += 1
            print("ok: %s" % what)
        else:
            self.failed += 1
            print("FAIL: %s%s" % (what, ("\n" + detail) if detail else ""))
        sys.stdout.flush()
        return ok

    def equal(self, actual, expected, what, detail=""):
        return self.check(actual == expected, "%s: %r (expected %r)" % (what, actual, expected),
                          detail)

    def finish(self):
        print("%s: %d passed, %d failed" % (self.name, self.passed, self.failed))
        return 0 if self.failed == 0 and self.passed > 0 else 1
