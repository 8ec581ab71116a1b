"""Every private name the rank side relies on (spawnpoint_rank/_private.py NAMES) holds in the
frameworks environment: Debian 13's torch 2.6, Python 3.13, and Lightning 2.6 both as
lightning.pytorch and as the standalone pytorch_lightning, with the package as the agent
bundle ships it. A rename in a new torch or Lightning fails here, not in a user's job.

    private_names_under_frameworks.py

tests/python/test_private_names.py checks the same list in Debian's torch 1.13, where
Lightning is absent: there Lightning's names are listed as unchecked, and this test is the
one that checks them (so Lightning must import here: its absence is a failure, not a pass).

Then the fallback of the Lightning hook, on the real Lightning: in an agent rank's
environment, a Lightning that lacks a name the hook needs (one more name listed, which no
Lightning has) gets Trainer(strategy="ddp_spawn").fit() refused where Lightning's launcher
would start its 2 processes: exit status 1, the feature said off once, one fatal line,
nothing started (without the refusal they would start as a second set of ranks and hang).
Exit status: 0 all of this holds; 1 otherwise.
"""

import os
import subprocess
import sys
import tempfile

sys.path.insert(0, "/opt/spawnpoint/share/spawnpoint/python")
from spawnpoint_rank import _private_audit  # noqa: E402


def main():
    import torch

    lines, failed = _private_audit.audit(require_lightning=True)
    for line in lines:
        print(line)
    packages = _private_audit.lightning_packages()
    for package in (None, "pytorch_lightning"):
        if package not in packages:
            print("FAIL: %s does not import here: its names are checked nowhere"
                  % (package or "lightning.pytorch"))
            failed = True
    print("%s: %d names in torch %s, Python %s, %s" % (
        "FAIL" if failed else "PASS", len(_private_audit._private.NAMES), torch.__version__,
        sys.version.split()[0], ", ".join(_private_audit._private.library(p or "lightning")
                                          for p in packages) or "no Lightning"))
    refused = lightning_refused_when_the_hook_is_off()
    return 1 if failed or not refused else 0


SHIM = "/opt/spawnpoint/share/spawnpoint/python"
MISSING = ("lightning.pytorch.trainer.connectors.accelerator_connector:"
           "_AcceleratorConnector._renamed_by_a_new_lightning")
TRAINER = """
import sys
sys.path.insert(0, %(shim)r)
from spawnpoint_rank import _lightning, _private
# A Lightning without a name the hook needs, as the hook sees it.
_private.NAMES += (_private.Name(%(missing)r, "lightning"),)
import torch
import lightning.pytorch as pl
from lightning.pytorch.trainer.connectors import accelerator_connector
_lightning.patch(accelerator_connector)  # as the shim's post-import hook does


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, index):
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    trainer = pl.Trainer(strategy="ddp_spawn", devices=2, accelerator="cpu", max_epochs=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(Model(), torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=4))
    print("NOT REFUSED")
"""


def lightning_refused_when_the_hook_is_off():
    env = dict(os.environ, SPAWNPOINT_SHIM="1", TORCHELASTIC_RUN_ID="private-names", RANK="0",
               LOCAL_RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", NNODES="1")
    with tempfile.TemporaryDirectory(prefix="spawnpoint-refusal-") as tmp:
        script = os.path.join(tmp, "trainer.py")
        with open(script, "w") as f:
            f.write(TRAINER % {"shim": SHIM, "missing": MISSING})
        try:
            proc = subprocess.run([sys.executable, script], cwd=tmp, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  universal_newlines=True, timeout=600)
        except subprocess.TimeoutExpired as expired:
            print("FAIL: Lightning's processes were not refused: the trainer ran 600 s\n%s"
                  % (expired.stderr or ""))
            return False
    said = [l for l in proc.stderr.splitlines() if l.startswith("spawnpoint-shim:")]
    off = [l for l in said if " is off: " in l and MISSING.replace(":", ".") in l]
    fatal = [l for l in said if l.startswith(
        "spawnpoint-shim: fatal: Lightning is about to start 2 processes of its own "
        "(start method 'spawn')")]
    started = "Initializing distributed" in proc.stdout + proc.stderr
    ok = (proc.returncode == 1 and len(off) == 1 and len(fatal) == 1 and not started
          and "NOT REFUSED" not in proc.stdout)
    print("%s: ddp_spawn with the Lightning hook off: exit %d, said off %d time(s), refused "
          "%d time(s), Lightning's processes %s" % (
              "PASS" if ok else "FAIL", proc.returncode, len(off), len(fatal),
              "started" if started else "not started"))
    if not ok:
        print("stdout:\n%s\nstderr:\n%s" % (proc.stdout, proc.stderr))
    return ok


if __name__ == "__main__":
    sys.exit(main())
