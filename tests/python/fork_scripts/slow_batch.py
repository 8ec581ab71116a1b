# A trainer whose dataset hangs once: the first time sample 9 is read (a filesystem that
# stopped answering), it sleeps for argv[2] seconds, past the job's loader.timeoutSeconds.
# With the agent's pool the hung worker is replaced and its batch rebuilt; on torch's own
# workers the batch comes late, and nothing of the job's makes that fatal. Either way the
# rank must finish with every batch, in order. Writes <out>/result.json.
import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

out_dir = sys.argv[1]
HANG_S = float(sys.argv[2])


class HangsOnce(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, index):
        if index == 9:
            try:  # the first reader of sample 9 in this job hangs; a rebuild does not
                os.close(os.open(os.path.join(out_dir, "hung"),
                                 os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                time.sleep(HANG_S)
            except FileExistsError:
                pass
        return torch.tensor([float(index)])


if __name__ == "__main__":  # torch's own spawned workers import this script
    loader = DataLoader(HangsOnce(), batch_size=2, num_workers=2)
    iterator = iter(loader)
    batches = [batch.flatten().tolist() for batch in iterator]
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump({"batches": batches, "iterator": type(iterator).__name__}, f)
