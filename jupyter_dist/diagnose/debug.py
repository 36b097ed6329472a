"""The paused ranks of a running job, and one pdb command to one of them.

A rank that calls `breakpoint()` (or `pdb.set_trace()`) pauses in a pdb served on a Unix
socket in its node's private job folder (node_side/debugger.py). From here, through the
backend's `run_on_node` (the link the job already has: nothing listens on a port):

- `paused_ranks` runs `debugger.py list` once per node folder and returns a `PausedRank`
  per paused process;
- `send` runs `debugger.py do` on the rank's node: one command, and pdb's answer, with
  whether the rank is still paused after it (`c` lets it run on).

On a local node (this machine) the helper's code runs in this process instead: no Python
to start for each command (about 40 ms of a round trip).

Only the job's owner holds the backend (run/job.py); other processes ask it through the
store (run/requests.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from jupyter_dist import node_side
from jupyter_dist.errors import DistrunError
from jupyter_dist.node_side import debugger as node_helper
from jupyter_dist.node_side.debugger import MARK as DEBUG_MARK
from jupyter_dist.nodes import Node

DEBUGGER_SOURCE = node_side.source("debugger.py")  # run as it is on the nodes
NOT_PAUSED_EXIT = 3  # debugger.py do: the process is not paused

# Runs argv on a node: (exit code, stdout, stderr) (Backend.run_on_node).
RunOnNode = Callable[[Node, list[str], float], tuple[int, str, str]]


class NotPaused(DistrunError):
    """The process asked is not paused (any more)."""


@dataclass
class PausedRank:
    """A process of the job waiting in its pdb: where, and why."""

    rank: int | None  # None for a process with no rank (a launcher's own Python)
    node: str
    pid: int
    file: str
    line: int
    function: str
    reason: str  # "breakpoint", "post-mortem"
    since: float
    exception: str | None = None  # post-mortem: the error's one line

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PausedRank:
        return cls(**{name: data.get(name) for name in cls.__dataclass_fields__})

    @classmethod
    def from_record(cls, found: dict[str, Any], node: str) -> PausedRank:
        """A rank's pause record as node_side/debugger.py writes it (its file, its word to
        the launcher, the helper's answers), on node `node`. ValueError, KeyError or
        TypeError for a record without a pid, or with values of the wrong kind."""
        rank = found.get("rank")
        return cls(
            rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
            node=node, pid=int(found["pid"]), file=str(found.get("file", "?")),
            line=int(found.get("line", 0)), function=str(found.get("function", "?")),
            reason=str(found.get("reason", "breakpoint")), since=float(found.get("since", 0.0)),
            exception=str(found["exception"]) if found.get("exception") else None,
        )  # fmt: skip

    def line_text(self) -> str:
        """One line: `rank 1 (node-1): bp.py:3 in main (breakpoint)`, or `(post-mortem:
        ValueError: bad)`."""
        who = f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"
        why = f"{self.reason}: {self.exception}" if self.exception else self.reason
        return f"{who} ({self.node}): {self.file}:{self.line} in {self.function} ({why})"


def paused_text(paused: dict[str, Any]) -> str:
    """A paused rank (a PausedRank's dict) where the views say it: `paused at bp.py:7 in
    main (breakpoint)`, the file by its name alone."""
    where = f"{str(paused.get('file', '?')).rsplit('/', 1)[-1]}:{paused.get('line', '?')}"
    why = paused.get("reason", "?")
    if paused.get("exception"):
        why = f"{why}: {paused['exception']}"
    return f"paused at {where} in {paused.get('function', '?')} ({why})"


def rank_not_paused(job_id: str, rank: int, paused: list[PausedRank]) -> DistrunError:
    """The one line for rank `rank` of job `job_id` not being paused, naming those that
    are (`paused`)."""
    others = ", ".join(str(p.rank) for p in paused if p.rank is not None)
    return DistrunError(
        f"rank {rank} of job {job_id} is not paused"
        + (f" (paused: {others})" if others else " (no rank is)")
    )


def check_command(command: str) -> str:
    """The pdb command as sent (stripped); DistrunError for one that is empty or more than
    one line."""
    if not command.strip() or "\n" in command.strip():
        raise DistrunError("a pdb command is one line of text, such as 'p x', 'n' or 'c'")
    return command.strip()


def pause_event(message: str, node: str) -> PausedRank | int | None:
    """A line a rank's debugger told the launcher (node_side/debugger.py's MARK, on the
    rank's stdout, on node `node`): where it paused (a PausedRank), the pid of one that runs
    on, or None for a line that is neither (damaged: never raises)."""
    try:
        told = json.loads(message[len(DEBUG_MARK) :])
        if "running" in told:
            return int(told["running"])
        return PausedRank.from_record(told["paused"], node)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def paused_ranks(
    run_on_node: RunOnNode, nodes: list[Node], job_dirs: dict[str, str]
) -> tuple[list[PausedRank], list[str]]:
    """Every paused process of the job on `nodes` (each node's job folder in `job_dirs`, by
    node name), by rank; and one line per node that could not be asked."""
    asked: dict[tuple[str, str], Node] = {}  # (host, folder) -> a node there
    for node in nodes:
        if node.name in job_dirs:
            asked.setdefault((node.host, job_dirs[node.name]), node)

    def ask(where: tuple[tuple[str, str], Node]) -> tuple[Node, list[dict] | str]:
        (_, folder), node = where
        try:
            code, out, err = _helper(run_on_node, node, ["list", folder], 30)
        except Exception as exc:  # an unreachable node is reported, never raised
            return node, f"{node.name}: {exc}"
        if code != 0:
            return node, f"{node.name}: {(err.strip().splitlines() or [f'exit {code}'])[-1]}"
        try:
            return node, json.loads(out)
        except json.JSONDecodeError:
            return node, f"{node.name}: unreadable answer {out[:80]!r}"

    with ThreadPoolExecutor(max_workers=min(16, len(asked)) or 1) as pool:
        answers = list(pool.map(ask, asked.items()))
    paused, problems, seen = [], [], set()
    for node, answer in answers:
        if isinstance(answer, str):
            problems.append(answer)
            continue
        for found in answer:
            node_rank = found.get("node_rank")
            on = nodes[node_rank] if isinstance(node_rank, int) and node_rank < len(nodes) else node
            if (on.host, found.get("pid")) in seen:
                continue  # nodes that share a folder and a machine see it twice
            seen.add((on.host, found.get("pid")))
            paused.append(PausedRank.from_record(found, on.name))
    paused.sort(key=by_rank)
    return paused, problems


def by_rank(paused: PausedRank) -> tuple[bool, int]:
    """The order paused processes are listed in: by rank, those without one last (by pid)."""
    return paused.rank is None, paused.rank if paused.rank is not None else paused.pid


def send(
    run_on_node: RunOnNode, node: Node, job_dir: str, paused: PausedRank, command: str,
    timeout: float = 30.0,
) -> dict[str, Any]:  # fmt: skip
    """`command` to the paused process; {"answer": pdb's text, "paused": still paused}.
    DistrunError in one line where it is not paused or its node cannot be asked."""
    who = f"rank {paused.rank}" if paused.rank is not None else f"pid {paused.pid}"
    answer = _ask_helper(run_on_node, node, who, ["do", job_dir, str(paused.pid), command],
                         timeout, "the command could not be sent",
                         not_paused=f"{who} is not paused (any more)")  # fmt: skip
    return {"answer": str(answer.get("answer", "")), "paused": bool(answer.get("paused"))}


def interrupt(
    run_on_node: RunOnNode, node: Node, job_dir: str, job_id: str, rank: int, timeout: float = 5.0
) -> PausedRank | None:
    """Pause rank `rank` where it runs, on `node`: where it paused, or None where it was
    signalled but had not paused within `timeout` (its main thread in native code: it
    pauses once back in Python). NotPaused where no process of that rank on the node can
    be paused; DistrunError in one line where the node cannot be asked."""
    who = f"rank {rank}"
    answer = _ask_helper(run_on_node, node, who, ["interrupt", job_dir, job_id, str(rank)],
                         timeout, f"could not be paused on {node.name}")  # fmt: skip
    if answer.get("paused") is None:
        return None
    try:
        return PausedRank.from_record(answer["paused"], node.name)
    except (ValueError, KeyError, TypeError, AttributeError):
        raise DistrunError(f"{who}: unreadable pause record {answer['paused']!r:.80}") from None


def _ask_helper(
    run_on_node: RunOnNode, node: Node, who: str, words: list[str], timeout: float,
    failed: str, not_paused: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Run the node helper (node_side/debugger.py) with `words` and `timeout`: its JSON
    answer. NotPaused where it says the process is not paused (`not_paused`, else its own
    line); else DistrunError in one line, `who` first (`failed`: what went wrong)."""
    try:
        code, out, err = _helper(run_on_node, node, [*words, str(timeout)], timeout + 10)
    except Exception as exc:
        raise DistrunError(f"{who}: cannot reach {node.name}: {exc}") from None
    said = (err.strip().splitlines() or [f"exit code {code}"])[-1]
    if code == NOT_PAUSED_EXIT:
        raise NotPaused(not_paused or said)
    if code != 0:
        raise DistrunError(f"{who}: {failed}: {said}")
    try:
        answer = json.loads(out)
    except json.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        raise DistrunError(f"{who}: unreadable answer {out[:80]!r}")
    return answer


def _helper(
    run_on_node: RunOnNode, node: Node, words: list[str], timeout: float
) -> tuple[int, str, str]:
    """The node helper's (exit code, stdout, stderr) for `words`: run on the node, or in
    this process where the node is this machine."""
    if node.backend == "local":
        return node_helper.answer(words)
    return run_on_node(node, [*_python(node), DEBUGGER_SOURCE, *words], timeout)


def _python(node: Node) -> list[str]:
    """The node's Python for a helper of the standard library alone: isolated, without
    site's start (a user's site-packages can take longer to import than the command)."""
    return [node.python, "-I", "-S", "-c"]
