"""docs/python.md's framework examples as a user runs them (ctest: frameworks_example_lightning):

    python examples_under_agent.py lightning

Runs `spawnpoint-agent run examples/python/lightning.yaml` from the repository's root (bound
at /opt/spawnpoint-repo) with the frameworks venv first on PATH, as an activated venv puts it,
so the manifest's `python3` is the one with Lightning. Checks: exit 0, both ranks report the
same final parameters, the DataLoader was served by the agent's pool (no fallback line), and
the shim said once that it mapped ddp_spawn.
"""

import os
import re
import subprocess
import sys

sys.path.insert(0, "/opt/spawnpoint-foreign")
from foreign_common import AGENT, Checks, show  # noqa: E402

REPO = "/opt/spawnpoint-repo"


def main():
    example = sys.argv[1]
    checks = Checks("frameworks_example_%s" % example)
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    proc = subprocess.run([AGENT, "run", "examples/python/%s.yaml" % example,
                           "--metrics-addr", "off", "--master-port", "0"],
                          cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=900)
    output = proc.stdout + proc.stderr
    checks.check(proc.returncode == 0, "the job succeeded", show(proc))
    finals = dict(re.findall(r"final rank=(\d) .*params=([0-9a-f]+)", output))
    checks.check(sorted(finals) == ["0", "1"], "both ranks finished", str(finals))
    checks.check(len(set(finals.values())) == 1, "the replicas ended in step", str(finals))
    checks.check("runs on torch's own workers" not in output,
                 "the DataLoader was served by the agent's pool", output[-3000:])
    checks.check(output.count("ddp_spawn") >= 1, "the shim mapped the strategy", output[-3000:])
    return checks.finish()


if __name__ == "__main__":
    sys.exit(main())
