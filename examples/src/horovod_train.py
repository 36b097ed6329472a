"""Horovod with PyTorch: a few steps of data-parallel training on random data, the
gradients averaged by hvd.DistributedOptimizer, the weights broadcast from rank 0 first.

Each rank prints a `RESULT {json}` line: its rank, size and local rank as Horovod sees
them, a sum allreduce of rank + 1, and its final weights (equal on every rank when the
averaging worked). `FAIL_RANK=N` makes rank N raise after the first step."""

import json
import os
import socket

import horovod.torch as hvd
import torch

hvd.init()
torch.manual_seed(1234 + hvd.rank())  # different data on every rank
model = torch.nn.Linear(4, 1)
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
for step in range(5):
    data, target = torch.randn(16, 4), torch.randn(16, 1)
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(data), target)
    loss.backward()
    optimizer.step()
    if step == 0 and os.environ.get("FAIL_RANK") == str(hvd.rank()):
        raise RuntimeError(f"rank {hvd.rank()} fails on purpose")
total = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()
report = {
    "rank": hvd.rank(),
    "size": hvd.size(),
    "local_rank": hvd.local_rank(),
    "local_size": hvd.local_size(),
    "allreduce": total,
    "weights": [round(w, 6) for w in model.weight.flatten().tolist()],
    "host": socket.gethostname(),
    "job": os.environ.get("DISTRUN_JOB_ID"),
}
print("RESULT " + json.dumps(report), flush=True)
