"""A DDP script that exits right after its last collective, as scripts do that never call
destroy_process_group(): 200 all_reduces of tensors the script drops at once, then the end of
the script. Without the shim's exit handler (spawnpoint_rank/_exit.py) about 1 rank exit in 20
dies with SIGABRT on torch 2.6 ("terminate called without an active exception").
"""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
for step in range(200):
    dist.all_reduce(torch.tensor(float(step)))
print("SPAWNPOINT-GLOO-EXIT rank %d done" % dist.get_rank(), flush=True)
