"""A Lightning script as written for a laptop or a Lightning Studio, run as a DDP job by the
agent without a line changed:

    build/bin/spawnpoint-agent run examples/python/lightning.yaml   (python3 with lightning)

`Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn")` would spawn its own 2
processes; under the agent each rank is one of them (the shim maps the strategy to its
external-launch form and says so once), and the DataLoader's workers come from the agent's
loader pool. Each rank ends with `final rank=R loss=L params=H`.
"""

import hashlib

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self):
        return 512

    def __getitem__(self, index):
        x = torch.tensor([index / 512.0, (index % 7) / 7.0])
        return x, (x ** 2).sum(0, keepdim=True)


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.ReLU(),
                                       torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


def main():
    torch.manual_seed(0)
    model = Regressor()
    loader = DataLoader(Squares(), batch_size=32, shuffle=True, num_workers=2)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=3,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, loader)
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    print("final rank=%d loss=%.6f params=%s" % (
        trainer.global_rank, float(trainer.callback_metrics["loss"]),
        hashlib.sha256(params.numpy().tobytes()).hexdigest()[:16]), flush=True)


if __name__ == "__main__":
    main()
