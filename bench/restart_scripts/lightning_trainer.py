"""A Lightning trainer (Trainer(accelerator="cpu", devices=2, strategy="ddp")), for
bench/restart_vs_torchrun.py: under torchrun and under the agent Lightning finds the ranks
from the environment. Prints `bench first-step rank=R attempt=A wall=T` after each
attempt's first training batch, and `bench phase rank=R attempt=A name=N wall=T` for its
imports of torch and Lightning; in attempt 0 rank 1 SIGKILLs itself once KILL_FILE exists
(`bench death rank=1 wall=T` first); attempt 1 stops after 3 steps. Usage:
lightning_trainer.py KILL_FILE."""

import os
import signal
import sys
import time

from bench_events import phase, stamp

import torch

_IMPORTED_TORCH = time.time()
import lightning.pytorch as pl  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

_IMPORTED_LIGHTNING = time.time()



class Model(pl.LightningModule):
    def __init__(self, kill_file):
        super().__init__()
        self.layer = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                         torch.nn.Linear(64, 1))
        self.kill_file = kill_file
        self.attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.steps = 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.steps += 1
        rank = self.global_rank
        if self.steps == 1:
            stamp("bench first-step rank=%d attempt=%d wall=%.6f" % (rank, self.attempt,
                                                                     time.time()))
        if self.attempt == 0 and rank == 1 and os.path.exists(self.kill_file):
            stamp("bench death rank=%d wall=%.6f" % (rank, time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        if self.attempt == 0:
            time.sleep(0.05)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main():
    kill_file = sys.argv[1]
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    phase(os.environ.get("RANK", "0"), attempt, "import_torch", _IMPORTED_TORCH)
    phase(os.environ.get("RANK", "0"), attempt, "import_lightning", _IMPORTED_LIGHTNING)
    data = TensorDataset(torch.randn(40000, 32), torch.randn(40000, 1))
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1,
                         max_steps=3 if attempt > 0 else -1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(Model(kill_file), DataLoader(data, batch_size=8))


if __name__ == "__main__":
    main()
