"""Following a job from its store, from any process: what `attach` shows.

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

import heapq
from datetime import datetime

from jupyter_dist.events import FINAL_STATES, JobResult, OutputLine, ProcessState, RootCause
from jupyter_dist.plan import LaunchPlan
from jupyter_dist.run.requests import effective_state
from jupyter_dist.store import JobRecord

PAGE = 5000  # lines of one log per read


class Follower:
    """One job's stored lines, read as they grow."""

    def __init__(self, record: JobRecord, history: int = 200):
        self.record, self.history_size = record, history
        plan = LaunchPlan.from_dict(record.plan())
        self._labels = {p.name: p.label for p in plan.processes}
        self._cursors: dict[str, str] = {}

    def history(self) -> list[OutputLine]:
        """The last `history` lines stored so far, every log's, in time order."""
        per_key = []
        for key in self.record.log_keys():
            lines, self._cursors[key] = self.record.read_range(key, tail=self.history_size)
            per_key.append([self._line(key, line) for line in lines])
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
            per_key.append([self._line(key, line) for line in lines])
        return list(heapq.merge(*per_key, key=lambda line: line.time))

    def state(self) -> str:
        return effective_state(self.record.status())

    def ended(self) -> bool:
        """Whether the job is over: a final state, or lost with its owner."""
        return self.state() in (*FINAL_STATES, "lost", "damaged")

    def result(self) -> JobResult:
        """The outcome as the job stored it (a lost job's says who was lost)."""
        status = self.record.status()
        state = effective_state(status)
        cause = status.get("root_cause")
        processes = [
            ProcessState(**entry)
            for entry in (status.get("processes") or {}).values()
            if isinstance(entry, dict) and set(entry) <= set(ProcessState.__dataclass_fields__)
        ]
        message = status.get("message")
        if state == "lost":
            message = "its owner is gone (the process that ran it was killed)"
        return JobResult(
            job_id=self.record.job_id, state=state, processes=processes,
            root_cause=RootCause(**cause) if isinstance(cause, dict) else None,
            store_path=str(self.record.path), message=message,
            started=status.get("started"), ended=status.get("ended"),
        )  # fmt: skip

    def _line(self, key: str, line: dict[str, str]) -> OutputLine:
        label = self._labels.get(key, key)
        return OutputLine(key, label, line["stream"], line["text"], _seconds(line["ts"]))


def _seconds(stamp: str) -> float:
    """A stored line's UTC time stamp (`store.timestamp`) as epoch seconds."""
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
