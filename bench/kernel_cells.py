"""Warm cells as the user feels them: through a real kernel, against nbdistributed, in one run.

    .venv/bin/python -m pip install "jupyter-dist[bench]"   # nbdistributed, the baseline
    .venv/bin/python bench/kernel_cells.py [--rounds 40] [--ranks 4]

Each tool gets a kernel of its own (jupyter_client, as a notebook front end talks to it)
with `--ranks` ranks on this machine, and the same two cells, each run `--rounds` times
after a warm-up; the figure is the median time from the execute request to the kernel's
reply, as a front end sees it:

1. `x = 1` on every rank (a quick cell that says nothing: jupyter-dist shows nothing for
   it, in either view).
2. `print(x)` on every rank: one line a rank, so a view (the live view's widget, or the
   text view's lines).
3. One DDP forward/backward step on a model built in an earlier cell (gloo, CPU).

- jupyter-dist: `%distrun session start --nodes 2 --procs-per-node R/2`, then `%%distrun`
  cells, in the view a front end without widgets gets (`text`) and in the live view
  (`widget`, the default in JupyterLab: its messages are sent whether or not a page draws
  them).
- nbdistributed: `%dist_init -n R`, then `%%distributed` cells; and again with its own
  100 ms poll cut to 1 ms (`nbdistributed (fast)`: what its fast runs show, the baseline).
- The floor: `x = 1` in the kernel itself, no rank involved.

Prints each median, and the ratio jupyter-dist / nbdistributed (fast) per cell. Goal: <= 1.0.
Beside each, the CPU a cell took, per cell: the kernel's own, and the rest of its process
tree's (ranks, agents, workers: both tools start theirs under the kernel): on 2 cores, what
the kernel spends is taken from the ranks.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import signal
import statistics
import sys
import time
from contextlib import contextmanager, suppress

from jupyter_client.manager import start_new_kernel
from session import BUILD, STEP  # bench/session.py's cells: the engine's figure of the same

HZ = os.sysconf("SC_CLK_TCK")


@contextmanager
def kernel():
    # This Python's folder first on PATH: nbdistributed starts its workers as `python`.
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    km, kc = start_new_kernel(kernel_name="python3", env={**os.environ, "PATH": path})
    kc.pid = km.provisioner.process.pid
    try:
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def run(kc, code: str, timeout: float = 300, said: list[str] | None = None) -> float:
    """Seconds from the request to the reply; RuntimeError where the cell failed. What it
    printed goes in `said`."""
    said = [] if said is None else said

    def keep(msg):
        content = msg["content"]
        if msg["msg_type"] in ("stream", "error"):
            said.append(content.get("text") or content.get("evalue", ""))
        elif msg["msg_type"] in ("display_data", "update_display_data"):
            said.append(content.get("data", {}).get("text/plain", ""))

    started = time.perf_counter()
    reply = kc.execute_interactive(code, timeout=timeout, output_hook=keep)
    took = time.perf_counter() - started
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"{code.splitlines()[0]!r} failed: {''.join(said)[-2000:]}")
    return took


def build(kc, prefix: str, ranks: int) -> None:
    """The model, on every rank, checked: each rank must say it is one of `ranks` (a tool
    that prints its failure and returns would otherwise be timed doing nothing)."""
    run(kc, prefix + BUILD)
    said: list[str] = []
    run(kc, prefix + "print(f'world {dist.get_world_size()} rank {dist.get_rank()}')", said=said)
    text = "".join(said)
    if sorted(int(r) for r in re.findall(rf"world {ranks} rank (\d+)", text)) != list(range(ranks)):
        raise RuntimeError(f"not every rank of {ranks} built the model: {text[-2000:]}")


def tree_cpu(root: int) -> tuple[float, float]:
    """CPU seconds so far of process `root` (the kernel) and of its descendants alive now
    (the ranks, agents, workers it started)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent = int(_stat(int(entry))[1])
            except OSError:
                continue
            children.setdefault(parent, []).append(int(entry))
    own, rest, todo = 0.0, 0.0, [root]
    while todo:
        pid = todo.pop()
        try:
            fields = _stat(pid)
        except OSError:
            continue
        used = (int(fields[11]) + int(fields[12])) / HZ
        own, rest = (own + used, rest) if pid == root else (own, rest + used)
        todo += children.get(pid, [])
    return own, rest


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()


def timed(kc, code: str, rounds: int, kernel_pid: int, cpu: dict[str, float]) -> float:
    """The median of `rounds` runs of `code`, after two that warm it up, in ms; the CPU
    they took per cell (ms) goes in `cpu`: the kernel's, and the rest of its tree's."""
    for _ in range(2):
        run(kc, code)
    before = tree_cpu(kernel_pid)
    took = statistics.median(run(kc, code) for _ in range(rounds)) * 1000
    after = tree_cpu(kernel_pid)
    cpu["kernel"] = (after[0] - before[0]) / rounds * 1000
    cpu["ranks and the rest"] = (after[1] - before[1]) / rounds * 1000
    return took


def jupyter_dist(rounds: int, ranks: int, view: str, cpu: dict) -> dict[str, float]:
    with kernel() as kc:
        run(kc, "%load_ext jupyter_dist")
        run(kc, f"%config DistrunMagics.view = {view!r}")
        run(kc, f"%distrun session start --nodes 2 --procs-per-node {ranks // 2}")
        try:
            trivial = timed(kc, "%%distrun\nx = 1", rounds, kc.pid, cpu.setdefault("x = 1", {}))
            printed = timed(kc, "%%distrun\nprint(x)", rounds, kc.pid,
                            cpu.setdefault("print(x)", {}))  # fmt: skip
            build(kc, "%%distrun\n", ranks)
            step = timed(kc, "%%distrun\n" + STEP, rounds, kc.pid, cpu.setdefault("ddp step", {}))
        finally:
            run(kc, "%distrun session stop")
    return {"x = 1": trivial, "print(x)": printed, "ddp step": step}


# nbdistributed runs a cell in a thread and looks whether it ended every 100 ms
# (`time.sleep(0.1)` in its magic): a cell that has not ended at the first look takes
# 100 ms or more (its slow runs), one that has takes its own round trip (its fast runs).
# Its fast figure, on any machine: its own sleeps, and only those, cut to 1 ms.
FAST_NBDISTRIBUTED = """
import sys, time
_sleep = time.sleep
def _sleep_briefly(seconds):
    caller = sys._getframe(1).f_globals.get("__name__", "")
    _sleep(min(seconds, 0.001) if caller.startswith("nbdistributed") else seconds)
time.sleep = _sleep_briefly
"""


def nbdistributed(rounds: int, ranks: int, cpu: dict, fast: bool = False) -> dict[str, float]:
    with kernel() as kc:
        if fast:
            run(kc, FAST_NBDISTRIBUTED)
        run(kc, "%load_ext nbdistributed")
        run(kc, f"%dist_init -n {ranks}")
        try:
            trivial = timed(kc, "%%distributed\nx = 1", rounds, kc.pid,
                            cpu.setdefault("x = 1", {}))  # fmt: skip
            printed = timed(kc, "%%distributed\nprint(x)", rounds, kc.pid,
                            cpu.setdefault("print(x)", {}))  # fmt: skip
            build(kc, "%%distributed\n", ranks)
            step = timed(kc, "%%distributed\n" + STEP, rounds, kc.pid,
                         cpu.setdefault("ddp step", {}))  # fmt: skip
        finally:
            # Its workers by their pids, not `%dist_shutdown`: that path ends with
            # `pkill -9 -f "python.*worker"` (its `_nuclear_shutdown`), which would take
            # any such process of the machine's, not only its own.
            end_processes(descendants(kc.pid))
    return {"x = 1": trivial, "print(x)": printed, "ddp step": step}


def descendants(root: int) -> list[int]:
    """The pids of every live process below `root`, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                children.setdefault(int(_stat(int(entry))[1]), []).append(int(entry))
            except OSError:
                continue
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def end_processes(pids: list[int], grace: float = 5.0) -> None:
    """SIGTERM to each of `pids`, then SIGKILL to those alive after `grace` seconds."""
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.05)
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        return _stat(pid)[0] != "Z"
    except OSError:
        return False


def _rounded(value):
    if isinstance(value, float):
        return round(value, 2)
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--ranks", type=int, default=4, help="an even number")
    args = parser.parse_args()
    cpu: dict[str, dict] = {"kernel alone": {}}
    with kernel() as kc:
        floor = timed(kc, "x = 1", args.rounds, kc.pid, cpu["kernel alone"])
    figures = {
        name: tool(args.rounds, args.ranks, *extra, cpu.setdefault(name, {}))
        for name, tool, extra in (
            ("jupyter-dist (text)", jupyter_dist, ("text",)),
            ("jupyter-dist (widget)", jupyter_dist, ("widget",)),
            ("nbdistributed", nbdistributed, ()),
            ("nbdistributed (fast)", functools.partial(nbdistributed, fast=True), ()),
        )
    }
    found = {"rounds": args.rounds, "ranks": args.ranks, "kernel_floor_ms": floor, **figures,
             "cpu_ms_per_cell": cpu}  # fmt: skip
    print(json.dumps(_rounded(found)))
    print(f"the kernel alone, x = 1: {floor:.1f} ms")
    # Against its fast runs: its slow ones only measure its 100 ms poll.
    base = figures["nbdistributed (fast)"]
    for name, cells in figures.items():
        shown = ", ".join(
            f"{cell} {ms:.1f} ms"
            + ("" if name.startswith("nbdistributed") else f" ({ms / base[cell]:.2f}x)")
            for cell, ms in cells.items()
        )
        print(f"{name}: {shown}")
        for cell, used in cpu[name].items():
            spent = ", ".join(f"{who} {ms:.1f}" for who, ms in used.items())
            print(f"    CPU per {cell!r} cell (ms): {spent}")
    print(
        "goals: jupyter-dist / nbdistributed (fast) <= 1.0 for x = 1 and the ddp step; "
        "x = 1 within 2 ms of the kernel alone"
    )


if __name__ == "__main__":
    main()
