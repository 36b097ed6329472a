"""Every rank's Python stack, taken on the job's nodes and grouped: "which rank is stuck, and
where?".

`take_stacks` runs node_side/stacks.py once per machine of the job (local nodes share one)
through the backend, at once on all of them, and returns a `StackDump`: one `ProcessStack` per
Python process of the job (ranks, and launchers such as torchrun), with its threads and
frames, or the one-line reason its stack could not be read. `StackDump.groups()` puts the
processes with identical stacks together, the odd ones first; `format()` is the text the CLI,
the magic and the live view show. A dump is stored with the job (JobRecord.save_stacks).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from jupyter_dist import node_side
from jupyter_dist.errors import DamagedJob, DistrunError
from jupyter_dist.events import ranges
from jupyter_dist.nodes import Node
from jupyter_dist.store import timestamp

STACKS_SOURCE = node_side.source("stacks.py")  # run as it is on the nodes
METHODS = ("auto", "py-spy", "faulthandler")
SUMMARY_FRAMES = 3  # frames of the main thread on a group's first line

# Runs argv on a node: (exit code, stdout, stderr) (Backend.run_on_node).
RunOnNode = Callable[[Node, list[str], float], tuple[int, str, str]]


@dataclass
class ProcessStack:
    """One Python process of the job as its stack was read."""

    label: str  # "rank 2", "worker 1", "torchrun"
    node: str
    pid: int
    rank: int | None
    command: str
    method: str | None  # "py-spy" or "faulthandler"; None when it could not be read
    threads: list[dict[str, Any]] = field(default_factory=list)  # main thread first
    error: str | None = None

    def signature(self) -> tuple:
        """What makes two processes' stacks the same: every thread's frames, or the error.
        Whichever node (its own folder) and method (py-spy names `Class.method`,
        faulthandler `method`) read them."""
        if self.error:
            return ("error", self.error)
        return tuple(
            tuple(
                (short_path(f["file"]), f["line"], f["function"].rsplit(".", 1)[-1])
                for f in thread["frames"]
            )
            for thread in self.threads
        )


@dataclass
class StackGroup:
    members: list[ProcessStack]

    @property
    def sample(self) -> ProcessStack:
        return self.members[0]

    def who(self) -> str:
        counts = Counter(m.label for m in self.members)  # a torchrun per node: one label
        labels = ranges([f"{n}× {label}" if n > 1 else label for label, n in counts.items()])
        nodes = list(dict.fromkeys(m.node for m in self.members))
        return f"{labels} ({', '.join(nodes)})"

    def summary(self) -> str:
        """`rank 2 (node1): script.py:5 in load_batch ← script.py:12 in <module>`."""
        sample = self.sample
        if sample.error:
            return f"{self.who()}: stack not read: {sample.error}"
        frames = sample.threads[0]["frames"] if sample.threads else []
        if not frames:
            return f"{self.who()}: no Python frame (in native code, or not started yet)"
        shown = " ← ".join(_where(f) for f in frames[:SUMMARY_FRAMES])
        return f"{self.who()}: {shown}" + (" ← …" if len(frames) > SUMMARY_FRAMES else "")


@dataclass
class StackDump:
    job_id: str
    taken: float
    processes: list[ProcessStack]
    others: list[str] = field(default_factory=list)  # "mpirun (node0, pid 12)": not Python
    problems: list[str] = field(default_factory=list)  # nodes that could not be asked
    reason: str = "asked"  # or "stalled"
    request: str | None = None  # the id of the request it answers (run/requests.py)

    def groups(self) -> list[StackGroup]:
        """Processes with identical stacks together; the smallest groups (the odd ones) first,
        then by their first rank."""
        by_signature: dict[tuple, list[ProcessStack]] = {}
        for proc in sorted(self.processes, key=_order):
            by_signature.setdefault(proc.signature(), []).append(proc)
        groups = [StackGroup(members) for members in by_signature.values()]
        return sorted(groups, key=lambda g: (len(g.members), _order(g.sample)))

    def methods(self) -> str:
        used = sorted({p.method for p in self.processes if p.method})
        return " and ".join(used) if used else "no method"

    def heading(self) -> str:
        count = len(self.processes)
        nodes = len({p.node for p in self.processes})
        when = time.strftime("%H:%M:%S", time.localtime(self.taken))
        return (
            f"Stacks of job {self.job_id}: {count} Python process{'es' * (count != 1)} on "
            f"{nodes} node{'s' * (nodes != 1)}, read with {self.methods()} at {when}"
        )

    def format(self, detail: bool = True) -> str:
        """The grouped stacks as text: one summary line per group, then (with `detail`) every
        thread's frames with their source lines."""
        lines = [self.heading()]
        lines += [f"could not ask {problem}" for problem in self.problems]
        if not self.processes and not self.problems:
            lines.append("no Python process of the job is running")
        for group in self.groups():
            lines.append("")
            lines.append(group.summary())
            if detail and not group.sample.error:
                lines += _thread_lines(group.sample.threads)
        if self.others:
            lines += ["", "not Python (no stack): " + ", ".join(self.others)]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"taken_at": timestamp(self.taken)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StackDump:
        """A stored dump (stacks.json); DamagedJob if it is not one."""
        try:
            dump = cls(
                job_id=str(data["job_id"]),
                taken=float(data["taken"]),
                processes=[ProcessStack(**p) for p in data.get("processes", [])],
                others=list(data.get("others", [])),
                problems=list(data.get("problems", [])),
                reason=str(data.get("reason", "asked")),
                request=data.get("request"),
            )
            dump.format(detail=True)  # every frame readable, as a view will read it
        except (KeyError, TypeError, ValueError, AttributeError):
            raise DamagedJob(f"job {data.get('job_id', '?')}: its stacks.json is damaged") from None
        return dump


def _order(proc: ProcessStack) -> tuple:
    return (proc.rank is None, proc.rank if proc.rank is not None else 0, proc.node, proc.pid)


def short_path(path: str) -> str:
    """A frame's file as a reader wants it: the package path below site-packages, the
    standard library's path below lib/pythonX.Y, else the file's name."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    parts = path.split("/")
    for index, part in enumerate(parts[:-1]):
        if part.startswith("python3") and index > 0 and parts[index - 1] == "lib":
            return "/".join(parts[index + 1 :])
    return os.path.basename(path) or path


def _where(frame: dict[str, Any]) -> str:
    return f"{short_path(frame['file'])}:{frame['line']} in {frame['function']}"


def _thread_lines(threads: list[dict[str, Any]]) -> list[str]:
    lines = []
    for thread in threads:
        lines.append(f"  {thread['name']}" + (" (main)" if thread.get("main") else ""))
        if not thread["frames"]:
            lines.append("    (no Python frame)")
        for frame in thread["frames"]:
            lines.append(f"    {_where(frame)}")
            if frame.get("code"):
                lines.append(f"        {frame['code']}")
    return lines


def _label(found: dict[str, Any]) -> str:
    if found.get("rank") is not None:
        return f"rank {found['rank']}"
    words = found.get("command", "").split()
    if any(w.endswith("torchrun") or w == "torch.distributed.run" for w in words):
        return "torchrun"
    script = next((w for w in words[1:] if not w.startswith("-")), words[0] if words else "?")
    return f"python {os.path.basename(script)}"


def check_method(method: str) -> None:
    """DistrunError naming the valid methods, for one that is not."""
    if method not in METHODS:
        raise DistrunError(f"unknown stack method {method!r}; use one of {', '.join(METHODS)}")


def take_stacks(
    run_on_node: RunOnNode, nodes: list[Node], job_id: str, method: str = "auto"
) -> StackDump:
    """Every Python stack of the job on its nodes (asked at once), read with `method`
    (`auto`: py-spy where the node has it, else faulthandler). A node that cannot be asked
    is named in `problems`; it never raises for one."""
    check_method(method)
    # Local nodes are one machine: ask it once. A node's rank is its place in `nodes`.
    machines: dict[str, dict[int, Node]] = {}
    for node_rank, node in enumerate(nodes):
        machines.setdefault(node.host, {})[node_rank] = node

    def ask(on_host: dict[int, Node]) -> tuple[dict[int, Node], dict[str, Any] | str]:
        node = next(iter(on_host.values()))
        argv = [node.python, "-c", STACKS_SOURCE, job_id, method]
        try:
            code, out, err = run_on_node(node, argv, 60)
        except Exception as exc:  # an unreachable node is reported, never raised
            return on_host, f"{node.name}: {exc}"
        if code != 0:
            reason = (err.strip().splitlines() or [f"exit code {code}"])[-1]
            return on_host, f"{node.name}: {reason}"
        try:
            return on_host, json.loads(out)
        except json.JSONDecodeError:
            return on_host, f"{node.name}: unreadable answer {out[:80]!r}"

    taken = time.time()
    with ThreadPoolExecutor(max_workers=min(16, len(machines)) or 1) as pool:
        answers = list(pool.map(ask, machines.values()))
    dump = StackDump(job_id=job_id, taken=taken, processes=[])
    # Nodes on different hosts may still share one process table (network namespaces of
    # one machine): each process once, on the node its node rank names.
    tables: dict[str, tuple[dict[int, Node], dict[str, Any]]] = {}
    for on_host, answer in answers:
        if isinstance(answer, str):
            dump.problems.append(answer)
            continue
        table = answer.get("machine") or str(id(answer))
        if table in tables:
            tables[table][0].update(on_host)
        else:
            tables[table] = (dict(on_host), answer)
    for on_machine, answer in tables.values():
        first = on_machine[min(on_machine)]
        for found in answer["processes"]:
            node = on_machine.get(found.get("node_rank"), first).name
            dump.processes.append(
                ProcessStack(
                    label=_label(found),
                    node=node,
                    pid=found["pid"],
                    rank=found.get("rank"),
                    command=found.get("command", ""),
                    method=found.get("method"),
                    threads=found.get("threads", []),
                    error=found.get("error"),
                )
            )
        for other in answer.get("others", []):
            name = os.path.basename(other["command"].split()[0]) if other["command"] else "?"
            dump.others.append(f"{name} ({first.name}, pid {other['pid']})")
    return dump
