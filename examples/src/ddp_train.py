"""A tiny DistributedDataParallel training run: every rank reports what it saw.

Uses the environment jupyter-dist (or torchrun, or Azure ML) gives each rank: RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT. gloo on CPU, nccl when every rank has a GPU.
"""

import argparse
import gc
import json
import os
import socket

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    # A GPU per rank where the node has enough of them (NCCL); the CPU otherwise (gloo): a
    # 1-GPU workstation running 2 ranks per node would otherwise give two ranks one GPU.
    use_cuda = torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)

    # all_reduce: the sum of (rank + 1) over every rank.
    value = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(value)

    torch.manual_seed(rank)  # different data per rank; DDP keeps the weights equal
    model = DistributedDataParallel(
        torch.nn.Linear(8, 1).to(device), device_ids=[local_rank] if use_cuda else None
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        x = torch.randn(32, 8, device=device)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}")

    weights = [round(float(w), 6) for w in model.module.weight.detach().cpu().flatten()]
    report = {
        "rank": rank,
        "world_size": world,
        "local_rank": local_rank,
        "node_rank": int(os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", -1))),
        "host": socket.gethostname(),
        "allreduce": value.item(),
        "weights": weights,
        "env": {
            name: os.environ.get(name)
            for name in (
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
                "LOCAL_WORLD_SIZE",
                "NODE_RANK",
                "GROUP_RANK",
                "MASTER_ADDR",
                "MASTER_PORT",
                "DISTRUN_JOB_ID",
            )
        },
    }
    print("RESULT " + json.dumps(report), flush=True)
    # Drop DDP (its reducer holds gloo work objects) while Python is fully alive: gloo
    # objects freed during interpreter shutdown can abort the process (pytorch#179291).
    del model, optimizer, loss
    gc.collect()
    dist.barrier()  # nobody tears down while others may still talk to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
