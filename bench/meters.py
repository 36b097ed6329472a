"""What the meters cost: a node agent sampling its process tree once a second against the
same agent not sampling, measured in one run on this machine.

    .venv/bin/python bench/meters.py [--ranks 8] [--seconds 30]

Each agent runs a tree like a node's under torchrun: a launcher process with `--ranks`
sleeping children that carry RANK. The CPU time the agent itself uses over `--seconds` is
read from /proc, with `--usage 1` and without, with what its finished children used (on a
node with nvidia-smi, the GPU reads every 5 s: this machine has none). Prints both as a
share of one core, the sampling's own cost (the difference), and the ratio sampling /
baseline. Goal: the sampling's cost under 1% of a core.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

from jupyter_dist.node_side import path as node_side_path

TICKS = os.sysconf("SC_CLK_TCK")
TREE = (
    "import os, subprocess, sys, time\n"
    "ranks = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'],\n"
    "         env={**os.environ, 'RANK': str(r)}) for r in range(int(sys.argv[1]))]\n"
    "time.sleep(3600)\n"
)


def agent_cpu(ranks: int, seconds: float, usage: float) -> float:
    """CPU seconds the agent used over `seconds`, its tree started and settled first."""
    argv = [sys.executable, str(node_side_path("agent.py")), "--cwd", os.getcwd(),
            "--usage", str(usage), "--", sys.executable, "-c", TREE, str(ranks)]  # fmt: skip
    agent = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        time.sleep(3)  # the tree started, every rank seen
        before = _cpu(agent.pid)
        time.sleep(seconds)
        return (_cpu(agent.pid) - before) / TICKS
    finally:
        agent.stdin.write(b"kill\n")
        agent.stdin.flush()
        agent.wait(30)


def _cpu(pid: int) -> int:
    """Ticks used by `pid` and its children it has waited for (its nvidia-smi calls; the
    tree's processes still run, so they are not in it)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return sum(int(field) for field in fields[11:15])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    base = agent_cpu(args.ranks, args.seconds, 0)
    sampled = agent_cpu(args.ranks, args.seconds, 1)
    share = lambda cpu: cpu / args.seconds * 100  # noqa: E731
    print(f"agent without sampling: {share(base):.2f}% of a core ({args.ranks} ranks)")
    print(f"agent sampling each second: {share(sampled):.2f}% of a core")
    print(f"the sampling's own cost: {share(max(0.0, sampled - base)):.2f}% of a core "
          "(goal: under 1%)")  # fmt: skip
    print(f"ratio sampled / baseline: {sampled / base:.2f}" if base else "baseline: 0 ticks")
    print("GPUs read with nvidia-smi" if shutil.which("nvidia-smi") else "no nvidia-smi here")


if __name__ == "__main__":
    main()
