"""Warm sessions against their baselines, measured in one run on this machine.

    .venv/bin/python -m pip install "jupyter-dist[bench]"   # ipyparallel, the baseline of 1.
    .venv/bin/python bench/session.py [--rounds 50] [--steps 10] [--lines 50000]

1. Round trip of a trivial cell (`x = 1`) in a session of 2 local nodes x 2 ranks, median of
   `--rounds`, against ipyparallel's `view.execute("x = 1", block=True)` on 4 engines started
   in the same run. Prints the ratio session / ipyparallel. Goal: <= 1.0.
2. Iteration: one DDP forward/backward step on a model built in an earlier cell, run
   `--steps` times in the session, against as many cold jobs that each import torch, form
   the group and build the model first. Prints the ratio. Goal: <= 0.1.
3. Output: 8 ranks (2 nodes x 4) printing `--lines` lines each in one cell; every line is
   counted in the store. Prints lines lost. Goal: 0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from jupyter_dist.options import LaunchOptions
from jupyter_dist.run.launch import run
from jupyter_dist.run.session import Session
from jupyter_dist.store import JobStore

BUILD = (
    "import torch, torch.distributed as dist\n"
    "from torch.nn.parallel import DistributedDataParallel as DDP\n"
    "if not dist.is_initialized():\n"
    "    dist.init_process_group('gloo')\n"
    "torch.manual_seed(0)\n"
    "model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),\n"
    "                                torch.nn.Linear(64, 1)))\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\n"
)
STEP = (
    "optimizer.zero_grad()\n"
    "loss = model(torch.randn(32, 64)).pow(2).mean()\n"
    "loss.backward()\n"
    "optimizer.step()\n"
)


def session_of(nodes: int, per_node: int, store: JobStore) -> Session:
    spec = LaunchOptions(nodes=nodes, procs_per_node=per_node).to_spec("", base_dir=".")
    return Session.start(spec, store=store)


def must(result) -> None:
    if not result.ok:
        raise SystemExit(f"a cell failed:\n{result.describe()}")


def round_trip(rounds: int, store: JobStore) -> None:
    try:
        import ipyparallel
    except ImportError:
        print("1. round trip: ipyparallel is not installed (pip install 'jupyter-dist[bench]')")
        return
    session = session_of(2, 2, store)
    try:
        must(session.run_cell("x = 1"))
        ours = []
        for _ in range(rounds):
            start = time.perf_counter()
            must(session.run_cell("x = 1"))
            ours.append(time.perf_counter() - start)
    finally:
        session.stop()
    cluster = ipyparallel.Cluster(n=4, log_level=40)
    client = cluster.start_and_connect_sync()
    try:
        client.wait_for_engines(4, timeout=120)
        view = client[:]
        view.execute("x = 1", block=True)
        theirs = []
        for _ in range(rounds):
            start = time.perf_counter()
            view.execute("x = 1", block=True)
            theirs.append(time.perf_counter() - start)
    finally:
        client.close()
        cluster.stop_cluster_sync()
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"1. round trip of `x = 1` on 4 ranks, median of {rounds}: session {a * 1000:.1f} ms, "
          f"ipyparallel {b * 1000:.1f} ms: ratio {a / b:.2f} (goal <= 1.0)")  # fmt: skip


def iteration(steps: int, store: JobStore) -> None:
    session = session_of(2, 2, store)
    try:
        must(session.run_cell(BUILD))
        start = time.perf_counter()
        for _ in range(steps):
            must(session.run_cell(STEP))
        warm = time.perf_counter() - start
    finally:
        session.stop()
    spec = LaunchOptions(nodes=2, procs_per_node=2).to_spec(BUILD + STEP, base_dir=".")
    start = time.perf_counter()
    for _ in range(steps):
        result = run(spec, store=store)
        if not result.ok:
            raise SystemExit(result.describe())
    cold = time.perf_counter() - start
    print(f"2. {steps} DDP steps on 4 ranks: session {warm:.2f} s, {steps} cold jobs "
          f"{cold:.2f} s: ratio {warm / cold:.3f} (goal <= 0.1)")  # fmt: skip


def output(lines: int, store: JobStore) -> None:
    session = session_of(2, 4, store)
    try:
        must(session.run_cell(f"for i in range({lines}):\n    print('line', i)\n"))
    finally:
        session.stop()
    record = store.get(session.job.job_id)
    counted = {
        key: sum(1 for line in record.iter_log(key, "stdout") if line.text.startswith("line "))
        for key in record.log_keys()
    }
    lost = 8 * lines - sum(counted.values())
    print(f"3. 8 ranks x {lines} lines in one cell: {sum(counted.values())} stored, "
          f"{lost} lost (goal 0)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lines", type=int, default=50_000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        store = JobStore(Path(tmp) / "jobs")
        round_trip(args.rounds, store)
        iteration(args.steps, store)
        output(args.lines, store)
    return 0


if __name__ == "__main__":
    sys.exit(main())
