"""MPI ranks on a crowded machine: CPU and wall time of an MPI job whose ranks outnumber
this machine's cores, as jupyter-dist plans it (its ranks told to yield while they wait,
OMPI_MCA_mpi_yield_when_idle=1: plan/mpi.py) against the same job with Open MPI's own
default for a host it believes has a core per rank (the spec sets the variable to 0).

    .venv/bin/python bench/mpi_yield.py [--runs 3] [--ranks-per-node 2]

Each rank imports torch (what most ranks do first, at their own pace), meets the others in
a barrier, and leaves; 2 local nodes. The job runs through `jupyter distrun run`,
alternating the two settings; printed: the median CPU seconds of the job's whole process
tree and its wall time, each as a ratio of yielding to polling. Goal: CPU ratio < 0.9 on
a machine with fewer cores than ranks (on one with as many cores, both are the same).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
RANK = "from mpi4py import MPI\nimport torch, torch.distributed\nMPI.COMM_WORLD.Barrier()\n"


def _spec(folder: Path, per_node: int, polling: bool) -> Path:
    env = "environment_variables: {OMPI_MCA_mpi_yield_when_idle: '0'}\n" if polling else ""
    (folder / "rank.py").write_text(RANK)
    spec = folder / ("polling.yml" if polling else "yielding.yml")
    spec.write_text(
        f"code: {folder}\ncommand: python rank.py\n{env}resources: {{instance_count: 2}}\n"
        f"distribution: {{type: mpi, process_count_per_instance: {per_node}}}\n"
    )
    return spec


def _one(spec: Path, store: Path) -> tuple[float, float]:
    """(CPU seconds of the whole tree, wall seconds) of one `jupyter distrun run`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(
        [str(BIN / "jupyter"), "distrun", "run", str(spec), "--store", str(store)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"the job failed:\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ranks-per-node", type=int, default=2)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    ranks = 2 * args.ranks_per_node
    print(f"{ranks} MPI ranks (2 local nodes x {args.ranks_per_node}) on {cores} cores")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        specs = {kind: _spec(folder, args.ranks_per_node, kind == "polling")
                 for kind in ("polling", "yielding")}  # fmt: skip
        found: dict[str, list[tuple[float, float]]] = {"polling": [], "yielding": []}
        for run in range(args.runs):
            for kind, spec in specs.items():
                found[kind].append(_one(spec, folder / "store"))
                cpu, wall = found[kind][-1]
                print(f"  run {run + 1} {kind:9} {cpu:6.1f} CPU-s  {wall:6.1f} s")
    median = {k: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v))
              for k, v in found.items()}  # fmt: skip
    cpu_ratio = median["yielding"][0] / median["polling"][0]
    wall_ratio = median["yielding"][1] / median["polling"][1]
    print(f"median CPU: yielding {median['yielding'][0]:.1f} s, polling "
          f"{median['polling'][0]:.1f} s: ratio {cpu_ratio:.2f} (goal < 0.9 with more ranks "
          f"than cores)")  # fmt: skip
    print(f"median wall: yielding {median['yielding'][1]:.1f} s, polling "
          f"{median['polling'][1]:.1f} s: ratio {wall_ratio:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
