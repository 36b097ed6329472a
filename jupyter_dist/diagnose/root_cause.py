"""Why a job failed: the evidence stderr leaves as it streams (each key's last lines, when it
first wrote and whether a traceback, a launcher's own reports), and the RootCause made from
it when a process fails."""

from __future__ import annotations

from collections import deque

from jupyter_dist.diagnose.attribute import failed_rank, starts_traceback
from jupyter_dist.diagnose.culprit import suspects
from jupyter_dist.diagnose.hints import hint_for
from jupyter_dist.events import ProcessState, RootCause
from jupyter_dist.plan.model import ProcessPlan, rank_key
from jupyter_dist.store import JobRecord

TAIL_LINES = 40  # stderr lines kept per log key for the root-cause report
_LAUNCHER_LINES = 400  # a launcher's (torchrun's, mpirun's) own stderr, to find the failed rank


class StderrEvidence:
    """Kept while lines arrive (one reader thread per stream may call `note` at once: each
    key's deque is only appended to); read once a process failed."""

    def __init__(self) -> None:
        self._tails: dict[str, deque[str]] = {}
        self._first: dict[str, tuple[float, bool]] = {}  # key -> (when, traceback?)
        self._launcher: dict[str, deque[str]] = {}

    def note(self, proc: ProcessPlan, key: str, text: str, now: float) -> None:
        """One stderr line of log key `key`, which came through `proc`."""
        self._tails.setdefault(key, deque(maxlen=TAIL_LINES)).append(text)
        when, traceback = self._first.get(key, (now, False))
        self._first[key] = (when, traceback or starts_traceback(text))
        if key == proc.name and proc.line_tags != "plain":
            self._launcher.setdefault(key, deque(maxlen=_LAUNCHER_LINES)).append(text)

    def root_cause(
        self, proc: ProcessPlan, state: ProcessState, record: JobRecord, rank: int | None = None
    ) -> RootCause:
        """The failure of `proc` (ended as `state`), narrowed to `rank`, else to the rank
        that failed first where a launcher carried several, pointing at that rank's stderr
        log in `record`."""
        if rank is None:
            rank = failed_rank(proc, list(self._launcher.get(proc.name, ())), self._first)
        key, label = rank_key(rank) if rank is not None else (proc.name, proc.label)
        tail = list(self._tails.get(key) or self._tails.get(proc.name) or ())
        start = max((i for i, line in enumerate(tail) if starts_traceback(line)), default=0)
        return RootCause(
            process=proc.name,
            label=label,
            role=proc.role,
            node=proc.node,
            host=proc.host,
            rank=rank,
            exit_code=state.exit_code,
            signal=state.signal,
            note=state.note,
            stderr_tail=tail[start:],
            log_path=str(record.log_path(key, "stderr")),
            oom=state.oom,
        )

    def culprit(
        self,
        processes: list[tuple[ProcessPlan, ProcessState]],
        provisional: RootCause,
        record: JobRecord,
        stop_started: float | None,
        grace: float,
    ) -> RootCause:
        """The root cause once every process ended: the best suspect (diagnose/culprit.py) in
        place of the first failure seen, where they differ, with the ranks that failed of
        communication errors after it listed as collateral, those our stop ended as
        stopped, and its hint (diagnose/hints.py)."""
        found = suspects(
            processes,
            {k: list(v) for k, v in self._tails.items()},
            dict(self._first),
            stop_started,
            grace,
        )
        cause = provisional
        if found:
            best = found[0]
            if (best.proc.name, best.rank) != (provisional.process, provisional.rank):
                state = dict((p.name, s) for p, s in processes)[best.proc.name]
                cause = self.root_cause(best.proc, state, record, best.rank)
            cause.collateral = [s.label for s in found[1:] if s.standing == 2]
        blamed = {cause.label, *cause.collateral}
        cause.stopped = [s.label for _, s in processes if s.stopped_by_us and s.label not in blamed]
        cause.hint = hint_for(cause)
        return cause
