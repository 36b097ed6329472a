"""The paused ranks of a running job, and one pdb command to one of them.

A rank that calls `breakpoint()` (or `pdb.set_trace()`) pauses in a pdb served on a Unix
socket in its node's private job folder (node_side/debugger.py). From here, through the
node helper (debugger.py's own commands) over the link the job already has (nothing
listens on a port), as `NodeHelpers` runs it:

- `paused_ranks` runs `debugger.py list` once per node folder and returns a `PausedRank`
  per paused process;
- `send` runs `debugger.py do` on the rank's node: one command, and pdb's answer, with
  whether the rank is still paused after it (`c` lets it run on).

On a local node (this machine) the helper's code runs in this process: no Python to start
for each command (about 40 ms of a round trip). Where the backend keeps a helper running
(`Backend.keep_on_node`: one SSH session a node), one `debugger.py serve` a node answers
every request of the job: no session to open nor Python to start for each (about 100 of
the 115 ms a command took over SSH). Elsewhere (Slurm's `srun`, a Ray node's actor) each
request runs the helper once (`run_on_node`).

Only the job's owner holds the backend (run/job.py); other processes ask it through the
store (run/requests.py).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as NoAnswerYet  # the builtin's alias from 3.11
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
# Starts argv on a node and keeps it: a KeptCommand, or None (Backend.keep_on_node).
KeepOnNode = Callable[[Node, list[str]], Any]
KEPT_GRACE_S = 10.0  # beyond a request's own timeout, before a kept helper is given up


class _KeptHelper:
    """One `debugger.py serve` on a node: requests written as `[ID, WORDS]` lines, their
    answers read by one thread and handed to whoever waits for that ID."""

    def __init__(self, kept: Any, label: str):
        self._kept = kept
        self._ids = itertools.count()
        self._waiting: dict[int, Future] = {}
        self._lock = threading.Lock()
        self.alive = True
        threading.Thread(target=self._read, name=f"debug-helper-{label}", daemon=True).start()

    def ask(self, words: list[str], timeout: float) -> tuple[int, str, str]:
        """The helper's answer to `words`; OSError where it has gone or is silent."""
        answer: Future = Future()
        try:
            with self._lock:  # one request's line at a time: never two interleaved
                if not self.alive:
                    raise OSError("the kept helper has ended")
                ident = next(self._ids)
                self._waiting[ident] = answer
                self._kept.send(json.dumps([ident, words]).encode() + b"\n")
            return answer.result(timeout)
        except NoAnswerYet:
            self.close()  # silent past its deadline: not to be trusted again
            raise OSError(f"no answer within {timeout:g} s") from None
        except OSError:
            self.close()  # its session ended: the next request starts another
            raise

    def _read(self) -> None:
        for line in self._kept.lines():
            with contextlib.suppress(ValueError, TypeError):
                ident, code, out, err = json.loads(line)
                with self._lock:
                    waiting = self._waiting.pop(ident, None)
                if waiting is not None and not waiting.done():
                    waiting.set_result((int(code), str(out), str(err)))
        self.close()

    def close(self) -> None:
        with self._lock:
            self.alive = False
            waiting, self._waiting = list(self._waiting.values()), {}
        for answer in waiting:
            if not answer.done():
                answer.set_exception(OSError("the kept helper ended"))
        self._kept.close()


class NodeHelpers:
    """How a job's owner runs the debugger's node helper (node_side/debugger.py) on each
    node: in this process on a local node; through one helper kept running a node where
    the backend keeps one (`keep_on_node`), started at the first request; else one
    `run_on_node` a request (also where keeping one failed, or it ended). `close` ends the
    kept ones (the job's end)."""

    def __init__(self, run_on_node: RunOnNode, keep_on_node: KeepOnNode | None = None):
        self._run_on_node = run_on_node
        self._keep_on_node = keep_on_node
        self._kept: dict[str, _KeptHelper | None] = {}  # by node name; None: cannot keep
        self._lock = threading.Lock()
        self._closed = False

    def run(self, node: Node, words: list[str], timeout: float) -> tuple[int, str, str]:
        """The helper's (exit code, stdout, stderr) for `words` on `node`."""
        if node.backend == "local":
            return node_helper.answer(words)
        kept = self._kept_on(node)
        if kept is not None:
            try:
                return kept.ask(words, timeout + KEPT_GRACE_S)
            except OSError:
                pass  # it ended (its session, its node): asked once more, the plain way
        return self._run_on_node(node, [*_python(node), DEBUGGER_SOURCE, *words], timeout + 10)

    def _kept_on(self, node: Node) -> _KeptHelper | None:
        if self._keep_on_node is None:
            return None
        with self._lock:
            if self._closed:
                return None
            kept = self._kept.get(node.name)
            if kept is not None and kept.alive:
                return kept
            if node.name in self._kept and kept is None:
                return None
            try:
                found = self._keep_on_node(node, [*_python(node), DEBUGGER_SOURCE, "serve"])
            except Exception:  # unreachable now: asked the plain way, kept next time
                return None
            kept = _KeptHelper(found, node.name) if found is not None else None
            self._kept[node.name] = kept
            return kept

    def close(self) -> None:
        """End every kept helper (each ends with its input). Never raises."""
        with self._lock:
            self._closed = True
            kept, self._kept = [k for k in self._kept.values() if k is not None], {}
        for helper in kept:
            with contextlib.suppress(Exception):
                helper.close()


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
    cell: bool = False  # paused in a %%distrun cell (the job's script.py)
    source: str | None = None  # the text of the line it waits at
    already: bool = False  # an interrupt's answer: it was paused before it was asked

    @property
    def where(self) -> str:
        """`bp.py:7` (the file by its path), or `cell line 7` in a %%distrun cell."""
        return f"cell line {self.line}" if self.cell else f"{self.file}:{self.line}"

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
            node=node,
            pid=int(found["pid"]),
            file=str(found.get("file", "?")),
            line=int(found.get("line", 0)),
            function=str(found.get("function", "?")),
            reason=str(found.get("reason", "breakpoint")),
            since=float(found.get("since", 0.0)),
            exception=str(found["exception"]) if found.get("exception") else None,
            cell=found.get("cell") is True,
            source=str(found["source"]) if found.get("source") else None,
            already=found.get("already") is True,
        )

    def line_text(self, several: bool = False) -> str:
        """One line: `rank 1 (node-1): bp.py:3 in main (breakpoint)`, or `(post-mortem:
        ValueError: bad)`; in a cell `rank 1 (node-1): cell line 3 in <module> (breakpoint):
        x += 1`, the line's text after it. With `several` (its rank has other paused
        processes), `rank 1 pid 4242 (node-1): ...`."""
        who = f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"
        if several and self.rank is not None:
            who += f" pid {self.pid}"
        why = f"{self.reason}: {self.exception}" if self.exception else self.reason
        text = f": {self.source}" if self.cell and self.source else ""
        return f"{who} ({self.node}): {self.where} in {self.function} ({why}){text}"


def paused_text(paused: dict[str, Any]) -> str:
    """A paused rank (a PausedRank's dict) where the views say it: `paused at bp.py:7 in
    main (breakpoint)`, the file by its name alone."""
    where = f"{str(paused.get('file', '?')).rsplit('/', 1)[-1]}:{paused.get('line', '?')}"
    if paused.get("cell"):
        where = f"cell line {paused.get('line', '?')}"
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
    try:
        command.encode("utf-8")
    except UnicodeEncodeError:  # bytes a terminal sent that are no text (surrogateescape)
        raise DistrunError(
            "a pdb command is text: this one holds bytes that are not UTF-8"
        ) from None
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
    helpers: NodeHelpers, nodes: list[Node], job_dirs: dict[str, str]
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
            code, out, err = helpers.run(node, ["list", folder], 30)
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
    helpers: NodeHelpers,
    node: Node,
    job_dir: str,
    paused: PausedRank,
    command: str,
    timeout: float = 30.0,
) -> dict[str, Any]:
    """`command` to the paused process; {"answer": pdb's text, "paused": still paused,
    "state": paused, running, busy or ended} (node_side/debugger.py's `do`). DistrunError
    in one line where it is not paused or its node cannot be asked."""
    who = f"rank {paused.rank}" if paused.rank is not None else f"pid {paused.pid}"
    answer = _ask_helper(
        helpers,
        node,
        who,
        ["do", job_dir, str(paused.pid), command],
        timeout,
        "the command could not be sent",
        not_paused=f"{who} is not paused (any more)",
    )
    paused = bool(answer.get("paused"))
    state = str(answer.get("state") or ("paused" if paused else "running"))
    return {"answer": str(answer.get("answer", "")), "paused": paused, "state": state}


def interrupt(
    helpers: NodeHelpers, node: Node, job_dir: str, job_id: str, rank: int, timeout: float = 5.0
) -> PausedRank | None:
    """Pause rank `rank` where it runs, on `node`: where it paused, or None where it was
    signalled but had not paused within `timeout` (its main thread in native code: it
    pauses once back in Python). NotPaused where no process of that rank on the node can
    be paused; DistrunError in one line where the node cannot be asked."""
    who = f"rank {rank}"
    answer = _ask_helper(
        helpers,
        node,
        who,
        ["interrupt", job_dir, job_id, str(rank)],
        timeout,
        f"could not be paused on {node.name}",
    )
    if answer.get("paused") is None:
        return None
    try:
        return PausedRank.from_record(answer["paused"], node.name)
    except (ValueError, KeyError, TypeError, AttributeError):
        raise DistrunError(f"{who}: unreadable pause record {answer['paused']!r:.80}") from None


def _ask_helper(
    helpers: NodeHelpers,
    node: Node,
    who: str,
    words: list[str],
    timeout: float,
    failed: str,
    not_paused: str | None = None,
) -> dict[str, Any]:
    """Run the node helper (node_side/debugger.py) with `words` and `timeout`: its JSON
    answer. NotPaused where it says the process is not paused (`not_paused`, else its own
    line); else DistrunError in one line, `who` first (`failed`: what went wrong)."""
    try:
        code, out, err = helpers.run(node, [*words, str(timeout)], timeout)
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


def _python(node: Node) -> list[str]:
    """The node's Python for a helper of the standard library alone: isolated, without
    site's start (a user's site-packages can take longer to import than the command)."""
    return [node.python, "-I", "-S", "-c"]
