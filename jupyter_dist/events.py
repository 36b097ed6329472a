"""What a running job tells its listeners, and what it leaves as its result."""

from __future__ import annotations

import contextlib
import re
import signal
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

# Job states: pending -> running -> succeeded | failed | cancelled | timed_out
FINAL_STATES = ("succeeded", "failed", "cancelled", "timed_out")
# A state after "job X ...", as a sentence says it: "job X has succeeded", "was cancelled".
_STATE_WORDS = {
    "pending": "has not started yet",
    "running": "is running",
    "succeeded": "has succeeded",
    "failed": "has failed",
    "cancelled": "was cancelled",
    "timed_out": "timed out",
}


def state_words(state: str) -> str:
    """`state` as the rest of a sentence that starts "job X": "has succeeded"."""
    return _STATE_WORDS.get(state, f"is {state}")


class OutputLine(NamedTuple):
    """One line a process printed, attributed to a log key (a rank where known).
    A tuple: a million of them a minute must be cheap to make."""

    key: str  # "rank-3", "worker-1", "torchrun-0"
    label: str  # "rank 3", "worker 1", "node 0"
    stream: str  # stdout | stderr
    text: str
    time: float


@dataclass
class ProcessState:
    name: str
    label: str
    node: str
    host: str
    role: str
    rank: int | None
    state: str = "pending"  # pending, running, succeeded, failed, stopped
    exit_code: int | None = None
    signal: str | None = None
    started: float | None = None
    ended: float | None = None
    stopped_by_us: bool = False
    note: str | None = None  # e.g. "lost its SSH connection"
    oom: dict[str, Any] | None = None  # its agent's evidence of an OOM kill (agent.py)
    # Where it waits in its debugger (diagnose/debug.PausedRank's dicts: one per paused
    # Python of the process, several under torchrun or mpirun); [] while none is.
    paused: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# What a shell's own exit codes mean (every per-process command runs under /bin/sh -c).
SHELL_EXIT_MEANING = {126: "command found but not executable", 127: "command not found"}


def describe_exit(code: int) -> tuple[int | None, str | None]:
    """(exit code, signal name). A negative code from wait() is a signal; so, in practice,
    is 128+N from the shell every rank runs under."""
    if code < 0:
        return None, _signal_name(-code)
    if 128 < code < 128 + 65:
        return code, _signal_name(code - 128)
    return code, None


def exit_text(exit_code: int | None, signal_name: str | None, verb: bool = False) -> str:
    """How a process ended, in words: "exit code 127 (command not found)", "signal SIGKILL";
    with `verb`, as a root cause says it: "exited with code 1", "was killed by SIGKILL"."""
    if signal_name:
        return f"was killed by {signal_name}" if verb else f"signal {signal_name}"
    meaning = SHELL_EXIT_MEANING.get(exit_code) if exit_code is not None else None
    said = f"exited with code {exit_code}" if verb else f"exit code {exit_code}"
    return said + (f" ({meaning})" if meaning else "")


def ranges(labels: list[str]) -> str:
    """Labels with numbers, in short: ["rank 0", "rank 1", "rank 2", "rank 5", "ps 0"] is
    "ranks 0-2, 5, ps 0" (64 ranks stay one short line)."""
    groups: dict[str, list[int]] = {}
    others: list[str] = []
    for label in labels:
        word, _, number = label.rpartition(" ")
        if word and number.isdigit():
            groups.setdefault(word, []).append(int(number))
        else:
            others.append(label)
    parts = []
    for word, numbers in groups.items():
        if len(numbers) == 1:
            parts.append(f"{word} {numbers[0]}")
            continue
        spans: list[list[int]] = []
        for n in sorted(set(numbers)):
            if spans and n == spans[-1][1] + 1:
                spans[-1][1] = n
            else:
                spans.append([n, n])
        text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
        parts.append(f"{word}s {text}")
    return ", ".join(parts + others)


# What a rank's debugger says on its stderr as it pauses (node_side/debugger._announce).
_PAUSE_SAID = re.compile(r"distrun: (rank|pid) \d+ paused ")


@dataclass
class RootCause:
    """Why a job failed: the first process (and rank, where known) that failed."""

    process: str
    label: str
    role: str
    node: str
    host: str
    rank: int | None
    exit_code: int | None
    signal: str | None
    stderr_tail: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)  # labels we stopped because of it
    log_path: str | None = None
    note: str | None = None
    collateral: list[str] = field(default_factory=list)  # failed after it, of comm errors
    oom: dict[str, Any] | None = None  # the OOM killer's doing, as its agent saw it
    hint: str | None = None  # one line of advice (diagnose/hints.py), set once it is final

    @property
    def how(self) -> str:
        return self.note or exit_text(self.exit_code, self.signal, verb=True)

    def summary(self) -> str:
        """One line: who failed, where, how, and the last stderr line (not its debugger's
        word that it paused: node_side/debugger.py)."""
        last = next(
            (
                line.strip()
                for line in reversed(self.stderr_tail)
                if line.strip() and not _PAUSE_SAID.match(line)
            ),
            "",
        )
        tail = f": {last}" if last else ""
        return f"{self.label} on {self.node} ({self.host}) {self.how}{tail}"

    def format(self) -> str:
        """The full report: summary, stderr tail with the traceback, who was stopped."""
        lines = [f"Root cause: {self.summary()}"]
        if self.stderr_tail:
            lines.append(f"Last stderr lines of {self.label}:")
            lines += [f"  {line}" for line in self.stderr_tail]
        if self.collateral:
            lines.append(
                "Failed after it, of communication errors (collateral): " + ranges(self.collateral)
            )
        if self.stopped:
            lines.append("Stopped by jupyter-dist after this failure: " + ranges(self.stopped))
        if self.log_path:
            lines.append(f"Full log: {self.log_path}")
        if self.hint:
            lines.append(self.hint)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Attempt:
    """One ended attempt of a job that starts again after a failure (limits.max_restarts):
    its number (the first is 1), when it ran, and why it ended."""

    number: int
    started: float | None
    ended: float | None
    root_cause: RootCause | None = None
    message: str | None = None

    def summary(self) -> str:
        """ "attempt 1 (12.3 s): rank 1 on local1 (127.0.0.1) was killed by SIGKILL"."""
        took = f" ({self.ended - self.started:.1f} s)" if self.started and self.ended else ""
        why = self.root_cause.summary() if self.root_cause else (self.message or "failed")
        return f"attempt {self.number}{took}: {why}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attempt:
        cause = data.get("root_cause")
        return cls(
            number=int(data["number"]),
            started=data.get("started"),
            ended=data.get("ended"),
            root_cause=RootCause(**cause) if isinstance(cause, dict) else None,
            message=data.get("message"),
        )


@dataclass
class JobResult:
    job_id: str
    state: str
    processes: list[ProcessState]
    root_cause: RootCause | None = None
    store_path: str | None = None
    message: str | None = None  # for cancelled / timed out jobs
    started: float | None = None  # epoch seconds
    ended: float | None = None
    attempts: list[Attempt] = field(default_factory=list)  # the earlier ones, oldest first
    replaced: list[str] = field(default_factory=list)  # "node2 in place of node1", per spare
    # False where the job ended before its last attempt started (cancelled in the delay
    # before it, or it could not start): that attempt did not run.
    last_attempt_ran: bool = True

    @property
    def ok(self) -> bool:
        return self.state == "succeeded"

    def describe(self) -> str:
        if self.ok:
            took = f" in {self.ended - self.started:.1f} s" if self.started and self.ended else ""
            text = f"Job {self.job_id} succeeded{took}."
        elif self.root_cause:
            text = f"Job {self.job_id} failed.\n{self.root_cause.format()}"
        else:
            text = f"Job {self.job_id} {self.state.replace('_', ' ')}: {self.message or ''}"
            text = text.rstrip(": ")
        return text + self.earlier_attempts()

    def earlier_attempts(self) -> str:
        """The earlier attempts' causes as lines to append ("" when it ran once)."""
        if not self.attempts:
            return ""
        lines = [f"  {attempt.summary()}" for attempt in self.attempts]
        if self.replaced:
            lines.append(
                f"  Spares taken for nodes that could not be reached: {', '.join(self.replaced)}"
            )
        if not self.last_attempt_ran:
            ran = len(self.attempts)
            times = "once" if ran == 1 else f"{ran} times"
            return f"\nIt ran {times} (attempt {ran + 1} did not start):\n" + "\n".join(lines)
        return f"\nIt ran {len(self.attempts) + 1} times; before this one:\n" + "\n".join(lines)


class JobListener:
    """Receives a job's events. Calls are serialised by the job; keep them quick."""

    def on_lines(self, lines: list[OutputLine]) -> None:
        """Lines already written to the store, in order per process and stream."""

    def on_process(self, state: ProcessState) -> None:
        """A process started or ended."""

    def on_finish(self, result: JobResult) -> None:
        """The job ended; every process is gone."""

    def on_attempt(self, number: int, of: int, previous: Attempt) -> None:
        """The job starts again, as attempt `number` of at most `of`, because the attempt
        before (`previous`) failed; its processes start after the restart delay."""

    def on_stall(self, notice: str | None, summary: list[str]) -> None:
        """The job looks stuck (`notice`, one line; `summary`: its grouped stacks, one line
        per group, the odd ones first, taken as it was flagged), or, with None, it moves
        again (diagnose/stall.py)."""


class Listened:
    """What a job's views subscribe through: `add_listener` and `remove_listener` over the
    `_listeners` list, under `_emit_lock` (the lock its events are sent under, so that a
    listener added meanwhile misses none and gets none twice)."""

    _listeners: list[JobListener]
    _emit_lock: threading.Lock

    def add_listener(self, listener: JobListener) -> None:
        with self._emit_lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: JobListener) -> None:
        with self._emit_lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def tell(self, event: str, *args: object) -> None:
        """Every listener's `event` (a JobListener method's name) with `args`, in the order
        they were added, under the emit lock. One that raises, or lacks the method (a
        listener of an older kind), is passed over: the job's threads never fail for it."""
        with self._emit_lock:
            for listener in self._listeners:
                with contextlib.suppress(Exception):
                    getattr(listener, event)(*args)
