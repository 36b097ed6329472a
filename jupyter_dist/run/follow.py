"""Following a job from its store, from any process: what `attach` shows, as text
(`Follower`) or in a live view (`FollowedJob`, which a view takes as it takes a `Job`).

    follower = Follower(record, history=200)
    lines = follower.history()      # the last 200 lines of the job so far, in time order
    while True:
        lines = follower.new_lines()     # what was stored since, in time order
        if follower.ended() and not lines: break

Only the tails of the logs are read at first (`JobRecord.read_range(tail=...)`, from the end
of each file backwards), so the first lines show at once however long the job has run;
then each read starts at the cursor where the last one ended: no line twice, none lost.
A line still being written waits for its newline.
"""

from __future__ import annotations

import contextlib
import heapq
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from jupyter_dist.diagnose.meters import Meters
from jupyter_dist.errors import DistrunError
from jupyter_dist.events import (
    Attempt,
    JobListener,
    JobResult,
    Listened,
    OutputLine,
    ProcessState,
    RootCause,
)
from jupyter_dist.plan import LaunchPlan
from jupyter_dist.plan.summary import launch_summary
from jupyter_dist.run.requests import SETTLED_STATES, effective_state
from jupyter_dist.store import JobRecord, is_marker

PAGE = 5000  # lines of one log per read


class Follower:
    """One job's stored lines, read as they grow."""

    def __init__(self, record: JobRecord, history: int = 200):
        self.record, self.history_size = record, history
        plan = LaunchPlan.from_dict(record.plan())
        self._labels = {p.name: p.label for p in plan.processes}
        self._cursors: dict[str, str] = {}
        self._attempts_seen = len(attempts_of(record.status()))

    def new_attempts(self, status: dict[str, Any]) -> list[tuple[int, int, Attempt]]:
        """The restarts since the last call (or since this follower was made), as a
        listener's on_attempt gets them: (the new attempt's number, of how many, the
        attempt that failed)."""
        ended = attempts_of(status)
        fresh, self._attempts_seen = (
            ended[self._attempts_seen :],
            max(self._attempts_seen, len(ended)),
        )
        allowed = status.get("attempts_allowed")
        of = allowed if isinstance(allowed, int) else len(ended) + 1
        return [(attempt.number + 1, of, attempt) for attempt in fresh]

    def history(self) -> list[OutputLine]:
        """The last `history` lines stored so far, every log's, in time order."""
        per_key = []
        for key in self.record.log_keys():
            lines, self._cursors[key] = self.record.read_range(key, tail=self.history_size)
            per_key.append(self._lines(key, lines))
        merged = list(heapq.merge(*per_key, key=lambda line: line.time))
        return merged[-self.history_size :] if self.history_size else []

    def new_lines(self) -> list[OutputLine]:
        """Every line stored since the last read, in time order (logs that appeared since
        are read from their start)."""
        per_key = []
        for key in self.record.log_keys():
            lines, self._cursors[key] = self.record.read_range(
                key, self._cursors.get(key, "0.0"), limit=PAGE
            )
            per_key.append(self._lines(key, lines))
        return list(heapq.merge(*per_key, key=lambda line: line.time))

    def state(self, status: dict[str, Any] | None = None) -> str:
        """The job's effective state, from `status` where the caller has just read it."""
        return effective_state(self.record.status() if status is None else status)

    def ended(self, status: dict[str, Any] | None = None) -> bool:
        """Whether the job is over: a final state, or lost with its owner."""
        return self.state(status) in SETTLED_STATES

    def result(self) -> JobResult:
        """The outcome as the job stored it (a lost job's says who was lost)."""
        status = self.record.status()
        state = effective_state(status)
        cause = status.get("root_cause")
        message = status.get("message")
        if state == "lost":
            message = "its owner is gone (the process that ran it was killed)"
        return JobResult(
            job_id=self.record.job_id,
            state=state,
            processes=processes_of(status),
            root_cause=RootCause(**cause) if isinstance(cause, dict) else None,
            store_path=str(self.record.path),
            message=message,
            started=status.get("started"),
            ended=status.get("ended"),
            attempts=attempts_of(status),
            replaced=[str(text) for text in status.get("replaced") or []],
            last_attempt_ran=status.get("attempt_ran") is not False,
        )

    def _lines(self, key: str, lines: list[dict[str, str]]) -> list[OutputLine]:
        """Stored lines as a listener gets them; our markers are not (a job's own
        listeners never get them: the followers say a restart as on_attempt)."""
        label = self._labels.get(key, key)
        return [
            OutputLine(key, label, line["stream"], line["text"], _seconds(line["ts"]))
            for line in lines
            if not (line["stream"] == "stdout" and is_marker(line["text"]))
        ]


def attempts_of(status: dict[str, Any]) -> list[Attempt]:
    """The ended attempts a job stored, oldest first (damaged entries left out)."""
    found = []
    for entry in status.get("attempts") or []:
        with contextlib.suppress(KeyError, TypeError, ValueError):
            found.append(Attempt.from_dict(entry))
    return found


def processes_of(status: dict[str, Any]) -> list[ProcessState]:
    """The processes' states a job stored (those it could not have written left out)."""
    fields = set(ProcessState.__dataclass_fields__)
    return [
        ProcessState(**entry)
        for entry in (status.get("processes") or {}).values()
        if isinstance(entry, dict) and set(entry) <= fields and {"name", "label"} <= set(entry)
    ]


class FollowedJob(Listened):
    """A job another process runs (a detached job's supervisor), as a view sees a `Job`:
    its id, name, summary, plan, record, processes' states, meters, start and end; and its
    listeners get its new lines, its processes' changes and its end, read from the store
    by `follow` until it ends. The view's Stacks reach the supervisor through the store,
    as any view's do."""

    def __init__(self, record: JobRecord, history: int = 0):
        self.record, self.job_id = record, record.job_id
        self.plan = LaunchPlan.from_dict(record.plan())
        status = record.status()
        self.name = str(status.get("name") or self.plan.job_type)
        self.summary = launch_summary(self.plan)
        self.processes = {state.name: state for state in processes_of(status)}
        self.started, self.ended = status.get("started"), status.get("ended")
        self.attempts = attempts_of(status)
        self.attempt = len(self.attempts) + 1
        self._attempt_started = status.get("attempt_started")
        allowed = status.get("attempts_allowed")
        self.attempts_allowed = allowed if isinstance(allowed, int) else self.attempt
        self.meters = Meters()
        self._listeners: list[JobListener] = []
        self._follower = Follower(record, history)
        self._history = history
        self._usage_since = time.time() - 60  # the last minute of meters, as a live view's
        self._emit_lock = threading.Lock()

    def follow(self, on_tick: Callable[[], None] | None = None) -> JobResult:
        """Read the store until the job has ended, telling the listeners (and calling
        `on_tick` after each read, a view's chance to draw); the job's result."""
        if self._history:
            self.tell("on_lines", self._follower.history())
        while True:
            result, read = self.step()
            if on_tick is not None:
                on_tick()
            if result is not None:
                return result
            if not read:
                time.sleep(FOLLOW_POLL_S)

    def step(self) -> tuple[JobResult | None, int]:
        """One read of the store: the new lines, states and meters to the listeners, and
        the job's end (the result, also told to them) once it has ended; with how many
        lines were read."""
        status = self.record.status()  # before the read: its last lines are then read
        ended = self._follower.ended(status)
        lines = self._follower.new_lines()
        if lines:
            self.tell("on_lines", lines)
        self._refresh(status)
        if not ended:
            return None, len(lines)
        result = self._follower.result()
        self.ended = result.ended
        self.tell("on_finish", result)
        return result, len(lines)

    def _refresh(self, status: dict[str, Any]) -> None:
        """New process states (from `status`) and meters from the store, to the listeners."""
        self.started = status.get("started") or self.started
        for number, of, previous in self._follower.new_attempts(status):
            self.attempts.append(previous)
            self.attempt, self.attempts_allowed = number, of
            self.tell("on_attempt", number, of, previous)
        if status.get("attempt_started") != self._attempt_started:  # a new attempt runs
            self._attempt_started = status.get("attempt_started")
            with contextlib.suppress(DistrunError):  # written before it started
                self.plan = LaunchPlan.from_dict(self.record.plan())
        for state in processes_of(status):
            if state != self.processes.get(state.name):
                self.processes[state.name] = state
                self.tell("on_process", state)
        for sample in self.record.usage(since=self._usage_since):
            self._usage_since = max(self._usage_since, float(sample["t"]) + 0.001)
            reading = {k: v for k, v in sample.items() if k not in ("t", "p")}
            self.meters.update(str(sample["p"]), reading, now=float(sample["t"]))


FOLLOW_POLL_S = 0.25  # how often a followed job's store is read when nothing came


def _seconds(stamp: str) -> float:
    """A stored line's UTC time stamp (`store.timestamp`) as epoch seconds."""
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
