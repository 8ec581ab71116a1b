"""A DDP rank as torchrun starts it: joins the gloo group from torchrun's variables, all-reduces
its rank + 1 once and prints one line: "rank R of W sum S flag F python P".

--fail-rank R: rank R exits with an error after the all-reduce.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--flag", default="")
    parser.add_argument("--fail-rank", type=int, default=-1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    print(
        f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} sum {total.item():g} "
        f"flag {args.flag} python {sys.executable}",
        flush=True,
    )
    if rank == args.fail_rank:
        raise RuntimeError(f"rank {rank} fails on purpose")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
