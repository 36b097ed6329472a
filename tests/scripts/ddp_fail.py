"""Rank 2 fails after the process group is up; the others wait in an all_reduce."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"rank {rank} joined", flush=True)
if rank == 2:
    raise RuntimeError("rank 2 lost its data shard")
tensor = torch.ones(1)
dist.all_reduce(tensor)  # never completes: rank 2 is gone
print("unreachable", os.getpid())
