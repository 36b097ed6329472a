"""DeepSpeed ZeRO data-parallel training of a tiny model on random data.

Runs as a pytorch job (jupyter-dist gives every rank RANK, WORLD_SIZE, MASTER_ADDR, ...)
or as an mpi job (mpirun starts the ranks; DeepSpeed reads them from MPI). On CPU it uses
DeepSpeed's CPU accelerator (DS_ACCELERATOR=cpu) over gloo; with a GPU per rank, NCCL.
ZERO_STAGE picks the ZeRO stage (default 2: optimizer states and gradients sharded).

Each rank prints one `RESULT {json}` line: its rank, the world size, the ZeRO stage, its
last loss and the first weights, equal on every rank when the training was data-parallel.
"""

import gc
import json
import os
import socket

import torch

on_gpu = torch.cuda.is_available() and torch.cuda.device_count() >= int(
    os.environ.get("LOCAL_WORLD_SIZE", "1")
)
os.environ.setdefault("DS_ACCELERATOR", "cuda" if on_gpu else "cpu")

import deepspeed  # noqa: E402  (after DS_ACCELERATOR: it picks the accelerator on import)

STAGE = int(os.environ.get("ZERO_STAGE", "2"))


def main() -> None:
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}},
        "zero_optimization": {"stage": STAGE},
    }
    engine, optimizer, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    data = torch.Generator().manual_seed(1 + rank)  # each rank its own batches
    for _ in range(5):
        x = torch.randn(4, 8, generator=data).to(engine.device)
        loss = torch.nn.functional.mse_loss(engine(x), x.sum(dim=1, keepdim=True))
        engine.backward(loss)
        engine.step()
    weights = next(engine.module.parameters()).flatten()[:4].tolist()
    torch.distributed.barrier()
    report = {
        "rank": rank, "world": world, "stage": STAGE, "loss": round(loss.item(), 6),
        "weights": [round(w, 6) for w in weights], "host": socket.gethostname(),
    }  # fmt: skip
    print("RESULT " + json.dumps(report), flush=True)
    # Free DeepSpeed's and gloo's objects while Python is fully alive (see ddp_train.py).
    del engine, optimizer, model, loss
    gc.collect()
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
