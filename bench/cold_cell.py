"""A cold `%%distrun` cell that imports torch, through a real kernel: time to its first line.

    .venv/bin/python bench/cold_cell.py [--rounds 5]

A kernel with jupyter_dist loaded runs, alternating, the same 4-rank cell (1 local node x 4
ranks: import torch, print, join the group, one all_reduce) started cold and with
`--preload torch` from a warm pool (the pool is started once before measuring, as the
day's first job would). Measured where the user sees it: from the execute request to the
first rank's line in the cell's output, and to the cell's end. Prints the medians and the
ratio pool / cold. Goals: the first line within 1 s from a warm pool; ratio <= 0.2.
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import time

CELL = (
    "%%distrun --nodes 1 --procs-per-node 4 --env OMP_NUM_THREADS=1{preload}\n"
    "import torch, torch.distributed as dist\n"
    "print('first line', flush=True)\n"
    "dist.init_process_group('gloo')\n"
    "dist.all_reduce(torch.ones(1))\n"
)


def timed_cell(kc, code: str) -> tuple[float, float]:
    """(seconds to the first 'first line' output, seconds to the cell's end)."""
    start = time.perf_counter()
    msg_id = kc.execute(code)
    first = None
    while True:
        try:
            msg = kc.get_iopub_msg(timeout=120)
        except queue.Empty:
            raise SystemExit("the cell gave no output for 120 s") from None
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        content = msg["content"]
        if first is None and "first line" in str(content.get("text", content.get("data", ""))):
            first = time.perf_counter() - start
        if msg["msg_type"] == "error":
            raise SystemExit(f"the cell failed: {content.get('evalue')}")
        if msg["msg_type"] == "status" and content["execution_state"] == "idle":
            ended = time.perf_counter() - start
            if first is None:
                raise SystemExit("the cell ended without its first line")
            return first, ended


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from jupyter_client.manager import start_new_kernel

    with tempfile.TemporaryDirectory(prefix="dcell") as tmp:
        env = {**os.environ, "DISTRUN_HOME": tmp, "TMPDIR": tmp}  # the bench's own pools
        km, kc = start_new_kernel(kernel_name="python3", env=env)
        try:
            kc.execute_interactive("%load_ext jupyter_dist", timeout=60)
            kc.execute_interactive("%config DistrunMagics.view = 'text'", timeout=60)
            # Cold: a cell after a preloaded one takes its preload too (preload_memory).
            cold_cell = CELL.format(preload=" --preload none")
            pooled_cell = CELL.format(preload=" --preload torch")
            timed_cell(kc, cold_cell)  # the page cache, for both
            timed_cell(kc, pooled_cell)  # starts the pool
            cold, pooled = [], []
            for _ in range(args.rounds):
                cold.append(timed_cell(kc, cold_cell))
                pooled.append(timed_cell(kc, pooled_cell))
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
            subprocess.run([sys.executable, "-m", "jupyter_dist.cli", "pool", "stop"],
                           env=env, capture_output=True)  # fmt: skip
    median = statistics.median
    for name, times in (("cold", cold), ("--preload torch, warm pool", pooled)):
        print(f"{name}: first line {median(t[0] for t in times):.2f} s, cell "
              f"{median(t[1] for t in times):.2f} s (median of {args.rounds})")  # fmt: skip
    first_ratio = median(p[0] / c[0] for p, c in zip(pooled, cold, strict=True))
    cell_ratio = median(p[1] / c[1] for p, c in zip(pooled, cold, strict=True))
    print(f"first line, pool / cold: {first_ratio:.2f}; whole cell: {cell_ratio:.2f} "
          f"(goals: first line <= 1 s from a warm pool; ratio <= 0.2)")  # fmt: skip


if __name__ == "__main__":
    main()
