"""Run as __main__ by test_launch.py: what a notebook cell defines (a function, a Dataset
class, a lambda) lives in __main__, and spawnpoint.launch runs it on 2 CPU ranks.

    train_in_main.py GO_FILE PORT

The second launch keeps the agent's status document at GO_FILE.status.json.
The caller first runs a torch op on OpenMP threads (a kernel that did so before launching:
forked children of it would die with "Invalid thread pool!"). Rank 0 prints a line and waits
until the caller has seen it (the caller creates GO_FILE when that line reaches its
sys.stdout): output must arrive while the ranks run, not at the end. Prints one
"RESULT <json>" line with what came back.
"""

import json
import os
import sys
import time

import torch

import spawnpoint

GO_FILE, PORT = sys.argv[1], int(sys.argv[2])
SEEN = "[rank 0] waiting for the caller to see this line"

torch.set_num_threads(2)
product = torch.randn(256, 256) @ torch.randn(256, 256)  # OpenMP's pool is up in the caller
caller_threads = torch.get_num_threads()


class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor(float(i * i))


double = lambda batch: torch.stack(batch) * 2  # noqa: E731  (a lambda collate_fn)


def train(go_file, offset):
    import torch.distributed as dist

    dist.init_process_group(os.environ["SPAWNPOINT_BACKEND"])
    rank = dist.get_rank()
    if rank == 0:
        print(SEEN[len("[rank 0] "):])
        deadline = time.monotonic() + 120
        while not os.path.exists(go_file):
            if time.monotonic() > deadline:
                raise RuntimeError("the caller did not see rank 0's line while the ranks ran")
            time.sleep(0.05)
    loader = torch.utils.data.DataLoader(Squares(), batch_size=4, num_workers=2,
                                         collate_fn=double)
    iterator = iter(loader)
    total = torch.zeros(())
    for batch in iterator:
        total += batch.sum()
    dist.all_reduce(total)
    print("total", total.item())
    return {"rank": rank, "world": dist.get_world_size(), "total": total.item() + offset,
            "iterator": type(iterator).__name__, "dataset": Squares(),
            "backend": dist.get_backend()}


class Watch:
    """sys.stdout of the caller: creates GO_FILE once rank 0's line has come through."""

    def __init__(self, real):
        self.real = real
        self.lines = []

    def write(self, text):
        self.lines.append(text)
        if SEEN in text:
            open(GO_FILE, "w").close()
        return self.real.write(text)

    def flush(self):
        self.real.flush()


if __name__ == "__main__":
    real_stdout = sys.stdout
    sys.stdout = watch = Watch(real_stdout)
    try:
        rank0 = spawnpoint.launch(train, GO_FILE, 1000, nprocs=2, master_port=PORT)
        everyone = spawnpoint.launch(lambda: int(os.environ["RANK"]) * 10 + 1, nprocs=2,
                                     return_all=True, master_port=PORT,
                                     status_file=GO_FILE + ".status.json")
    finally:
        sys.stdout = real_stdout
    with open(GO_FILE + ".status.json") as f:
        status = json.load(f)
    print("RESULT " + json.dumps({
        "status": {k: status[k] for k in ("phase", "ranks", "restarts", "job")},
        "rank0": {k: v for k, v in rank0.items() if k != "dataset"},
        "dataset_is_the_callers_class": isinstance(rank0["dataset"], Squares),
        "return_all": everyone,
        "caller_threads": caller_threads,
        "streamed_rank_lines": sorted({line.split("]")[0] + "]" for line in watch.lines
                                       if line.startswith("[rank ")}),
    }))
