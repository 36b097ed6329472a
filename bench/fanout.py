"""Fan-out over SSH: time to run a trivial job on 1, 2, 4 and 8 real sshd nodes.

    .venv/bin/python bench/fanout.py [--runs 3]      (as root: it makes network namespaces)

For each node count, a job of one process per node running `true` is started through
`jupyter_dist.run.launch.run` with an inventory of that many test nodes (tests/sshnodes.py),
launch to exit. "cold" closes every kept SSH connection first; "warm" reuses them (the
second launch from the same notebook). Prints medians and the ratios against 1 node.
Goals: 8 nodes <= 1.5x one node (warm); a warm launch faster than a cold one.

The test nodes share this machine's cores, while real nodes each have their own: so the
CPU time a warm launch keeps this machine busy for (all processes, from /proc/stat) is
printed too, with the wall time that alone needs here. Where that floor is near the
8-node time, the launch is bound by this machine's cores, not by the fan-out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import sshnodes

from jupyter_dist.backends.ssh import CONNECTIONS
from jupyter_dist.nodes import load_inventory
from jupyter_dist.run.launch import run
from jupyter_dist.spec import parse_spec
from jupyter_dist.store import JobStore


def busy_cpu_seconds() -> float:
    """CPU time this machine has spent busy (every process), from /proc/stat."""
    with open("/proc/stat") as stat:
        ticks = [int(v) for v in stat.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle, iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


def timed_run(spec, inventory, store, cpu: list[float] | None = None) -> float:
    start, busy = time.perf_counter(), busy_cpu_seconds()
    result = run(spec, inventory=inventory, store=store)
    took = time.perf_counter() - start
    if cpu is not None:
        cpu.append(busy_cpu_seconds() - busy)
    if not result.ok:
        raise SystemExit(result.describe())
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cluster = sshnodes.start(8, Path(tmp) / "nodes")
        try:
            store = JobStore(Path(tmp) / "jobs")
            inventory = load_inventory(cluster.inventory)
            cold: dict[int, list[float]] = {}
            warm: dict[int, list[float]] = {}
            busy: dict[int, list[float]] = {}
            for count in (1, 2, 4, 8):
                spec = parse_spec(f"command: 'true'\nresources: {{instance_count: {count}}}")
                for _ in range(args.runs):
                    CONNECTIONS.close_all()
                    cold.setdefault(count, []).append(timed_run(spec, inventory, store))
                    took = timed_run(spec, inventory, store, busy.setdefault(count, []))
                    warm.setdefault(count, []).append(took)
        finally:
            CONNECTIONS.close_all()
            sshnodes.stop(cluster)
    base_warm = statistics.median(warm[1])
    cores = os.cpu_count() or 1
    for count in (1, 2, 4, 8):
        c, w = statistics.median(cold[count]), statistics.median(warm[count])
        cpu = statistics.median(busy[count])
        print(
            f"{count} node(s): cold {c * 1000:6.0f} ms, warm {w * 1000:6.0f} ms, "
            f"warm vs 1 node {w / base_warm:.2f}x, warm/cold {w / c:.2f}; "
            f"warm uses {cpu * 1000:.0f} ms CPU, >= {cpu / cores * 1000:.0f} ms on {cores} cores"
        )
    ratio = statistics.median(warm[8]) / base_warm
    print(
        f"fan-out ratio 8 nodes / 1 node (warm, median of {args.runs}): {ratio:.2f} (goal <= 1.5)"
    )


if __name__ == "__main__":
    main()
