"""DDP training that survives a restart: it saves a checkpoint every few steps and, when
the job starts again after a failure (limits.max_restarts), resumes from the latest one.

    python ddp_checkpoint.py --steps 60 --every 10 --checkpoints ckpt/

A restarted job runs this script again from the top, in every rank, with
DISTRUN_RESTART_COUNT (and TORCHELASTIC_RESTART_COUNT) one higher: what was done before the
last checkpoint is not done again, and what came after it is done again from the same data,
so the weights end as an uninterrupted run's would. Rank 0 writes the checkpoint; every
rank reads it (the folder must be one every node sees: a shared file system, or local
nodes). A checkpoint is written to a temporary name and renamed, so a rank killed while
writing leaves the last good one in place.
"""

import argparse
import gc
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def batch(step: int, rank: int) -> torch.Tensor:
    """The data of one step on one rank: the same on every attempt."""
    return torch.randn(32, 8, generator=torch.Generator().manual_seed(step * 1000 + rank))


def latest(folder: Path) -> Path | None:
    found = sorted(folder.glob("step-*.pt"), key=lambda p: int(p.stem.split("-")[1]))
    return found[-1] if found else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    parser.add_argument("--checkpoints", default="checkpoints", help="the checkpoint folder")
    parser.add_argument("--step-time", type=float, default=0.0, help="seconds a step takes")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    restart = int(os.environ.get("DISTRUN_RESTART_COUNT", "0"))
    folder = Path(args.checkpoints)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"pid-rank{rank}-restart{restart}").write_text(str(os.getpid()))

    torch.manual_seed(0)  # the same initial weights on every rank and every attempt
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    first = 0
    checkpoint = latest(folder)
    if checkpoint is not None:
        state = torch.load(checkpoint)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first = state["step"]
    print(f"rank {rank}: restart {restart}, starting at step {first}", flush=True)

    for step in range(first, args.steps):
        x = batch(step, rank)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.step_time)
        done = step + 1
        if rank == 0 and done % args.every == 0:
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                     "step": done}  # fmt: skip
            partial = folder / f".step-{done}.pt.partial"
            torch.save(state, partial)
            partial.rename(folder / f"step-{done}.pt")
            print(f"step {done}: loss {loss.item():.4f}, checkpoint saved", flush=True)

    if rank == 0:
        torch.save(model.module.state_dict(), folder / "final.pt")
        print(f"trained {args.steps} steps", flush=True)
    del model, optimizer, loss  # before shutdown (see ddp_train.py)
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
