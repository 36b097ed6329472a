"""What a running job tells its listeners, and what it leaves as its result."""

from __future__ import annotations

import signal
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

# Job states: pending -> running -> succeeded | failed | cancelled | timed_out
FINAL_STATES = ("succeeded", "failed", "cancelled", "timed_out")


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def describe_exit(code: int) -> tuple[int | None, str | None]:
    """(exit code, signal name). A negative code from wait() is a signal; so, in practice,
    is 128+N from the shell every rank runs under."""
    if code < 0:
        return None, _signal_name(-code)
    if 128 < code < 128 + 65:
        return code, _signal_name(code - 128)
    return code, None


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

    @property
    def how(self) -> str:
        if self.note:
            return self.note
        return (
            f"was killed by {self.signal}" if self.signal else f"exited with code {self.exit_code}"
        )

    def summary(self) -> str:
        """One line: who failed, where, how, and the last stderr line."""
        last = next((line.strip() for line in reversed(self.stderr_tail) if line.strip()), "")
        tail = f": {last}" if last else ""
        return f"{self.label} on {self.node} ({self.host}) {self.how}{tail}"

    def format(self) -> str:
        """The full report: summary, stderr tail with the traceback, who was stopped."""
        lines = [f"Root cause: {self.summary()}"]
        if self.stderr_tail:
            lines.append(f"Last stderr lines of {self.label}:")
            lines += [f"  {line}" for line in self.stderr_tail]
        if self.stopped:
            lines.append("Stopped by jupyter-dist after this failure: " + ", ".join(self.stopped))
        if self.log_path:
            lines.append(f"Full log: {self.log_path}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class JobResult:
    job_id: str
    state: str
    processes: list[ProcessState]
    root_cause: RootCause | None = None
    store_path: str | None = None
    message: str | None = None  # for cancelled / timed out jobs

    @property
    def ok(self) -> bool:
        return self.state == "succeeded"

    def describe(self) -> str:
        if self.ok:
            return f"Job {self.job_id} succeeded ({len(self.processes)} processes)."
        if self.root_cause:
            return f"Job {self.job_id} failed.\n{self.root_cause.format()}"
        return f"Job {self.job_id} {self.state.replace('_', ' ')}: {self.message or ''}".rstrip(
            ": "
        )


class JobListener:
    """Receives a job's events. Calls are serialised by the job; keep them quick."""

    def on_lines(self, lines: list[OutputLine]) -> None:
        """Lines already written to the store, in order per process and stream."""

    def on_process(self, state: ProcessState) -> None:
        """A process started or ended."""

    def on_finish(self, result: JobResult) -> None:
        """The job ended; every process is gone."""
