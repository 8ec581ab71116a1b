"""A library that builds its own DataLoader (as Ultralytics and Lightning do), for
pool_trainer.py's "library" case: the loader is created here, not in the trainer's script."""

import torch
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        import os
        return torch.tensor([i, i * i]), os.getpid()


def build_loader():
    return DataLoader(Squares(), batch_size=4, num_workers=2, persistent_workers=True)
