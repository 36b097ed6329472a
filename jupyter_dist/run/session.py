"""Warm sessions: ranks started once that run cell after cell, each in a namespace that
lives as long as the session (variables, modules, models, a process group).

A session is a job like any other (same planner, backends, agents, store; the sidebar lists
it) whose processes are session workers (node_side/session_worker.py) reading cells on their
stdin. Each reports a cell with a marked line on stdout, which the job's output pipeline
hands here instead of showing it:

    session = Session.start(spec, inventory=inventory)   # returns once every rank is ready
    result = session.run_cell("x = 1")                    # blocks; a CellResult
    session.stop()                                         # every process gone

A rank's exception fails the cell, not the session. A rank that dies ends the session (the
job fails with its root cause, every other rank stopped): `SessionEnded` says why.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from jupyter_dist import node_side
from jupyter_dist.cell_syntax import syntax_problem
from jupyter_dist.diagnose.meters import mib
from jupyter_dist.errors import DistrunError, SpecError
from jupyter_dist.events import JobResult, ranges
from jupyter_dist.node_side.session_worker import MARK
from jupyter_dist.plan.model import ProcessPlan
from jupyter_dist.run.interrupts import interrupts_deferred
from jupyter_dist.run.job import Job
from jupyter_dist.run.session_history import SESSION_WORKER, CellRun, record_cell
from jupyter_dist.spec import JobSpec, spec_from_dict
from jupyter_dist.store import cell_marker

WORKER = SESSION_WORKER
CELL_RUNNER = "cell_runner.py"  # the worker saves --out values with its code
READY_TIMEOUT_S = 300.0  # importing torch on a busy node can take a while
INTERRUPT_GRACE_S = 10.0  # how long an interrupted rank has to come back from its cell


class SessionEnded(DistrunError):
    """The session's ranks are gone (one died, it was stopped or cancelled)."""

    def _render_traceback_(self) -> list[str]:  # IPython shows the reason, not our frames
        lines = str(self).splitlines()
        return [f"SessionEnded: {lines[0]}", *lines[1:]]


@dataclass
class CellResult:
    """What every rank that ran a cell reported: process name -> report (`ok`, and for a
    failure `type`, `message`, `traceback`)."""

    cell: int
    labels: dict[str, str]  # process name -> label ("rank 1")
    reports: dict[str, dict] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(report["ok"] for report in self.reports.values())

    def describe(self) -> str:
        """The failure, each distinct error once with the ranks that raised it:
        `ranks 0-3: ValueError: bad shape` and its traceback."""
        errors: dict[tuple[str, str], list[str]] = {}
        for name, report in self.reports.items():
            if not report["ok"]:
                key = (f"{report['type']}: {report['message']}".rstrip(": "), report["traceback"])
                errors.setdefault(key, []).append(self.labels[name])
        parts = []
        for (summary, traceback), labels in errors.items():
            parts.append(f"{ranges(labels)}: {summary}\n{traceback.rstrip()}")
        return "\n".join(parts)


class Session:
    """A started session; see the module's docstring."""

    def __init__(self, name: str = "session") -> None:
        self.name = name
        self.job: Job | None = None
        self.started = time.time()
        self._cells = 0
        self._ready: set[str] = set()
        self._reports: dict[int, dict[str, dict]] = {}
        self._flushed: dict[int, set[str]] = {}  # cell -> ranks whose stderr is all in
        self._changed = threading.Condition()
        # What the thread in _wait waits for: a rank's message wakes it only once that holds
        # (a cell's 2 reports per rank woke it each, and each wake takes the GIL from the
        # readers while the other ranks' reports arrive).
        self._awaited: Callable[[], bool] | None = None
        self._running_cell: int | None = None  # quiet ranks are a stall only while set
        self._running_names: list[str] = []  # the processes that run it
        self.failed_ranks: list[int] = []  # the ranks whose last cell raised (a post-mortem's)
        # process name -> {"rss": bytes, "gpu": bytes}, as each rank last reported
        self.memory: dict[str, dict[str, int]] = {}

    # -- starting and stopping -----------------------------------------------------------

    @classmethod
    def start(cls, spec: JobSpec, name: str = "session", **job_options) -> Session:
        """Start the session's ranks (keyword arguments as for run.launch.prepare_job) and
        return once every one is ready; SessionEnded if the job ended first."""
        from jupyter_dist.run.launch import prepare_job

        session = cls(name)
        files = {name: node_side.source(name) for name in (WORKER, CELL_RUNNER)}
        job = prepare_job(
            session_spec(spec),
            extra_files=files,
            messages=(MARK, session._on_message),
            **job_options,
        )
        session.job = job
        job.watch.stall_watching = lambda: session._running_cell is not None  # not between cells
        names = [p.name for p in job.plan.processes]
        try:
            with interrupts_deferred():  # one that came while it started: stopped below
                job.start()
            session._wait(lambda: all(n in session._ready for n in names), READY_TIMEOUT_S)
        except TimeoutError:
            late = [job.processes[n].label for n in names if n not in session._ready]
            session.stop("did not start")
            raise SessionEnded(
                f"session {name}: {ranges(late)} not ready within {READY_TIMEOUT_S:g} s"
            ) from None
        except BaseException:
            session.stop("did not start")
            raise
        return session

    def stop(self, reason: str = "stopped") -> JobResult:
        """Stop every rank; returns once every process is gone."""
        self.job.end(f"session {self.name} {reason}")
        return self.job.wait()

    @property
    def alive(self) -> bool:
        return self.job is not None and not self.job.done

    @property
    def ranks(self) -> list[ProcessPlan]:
        return list(self.job.plan.processes)

    # -- cells ---------------------------------------------------------------------------

    def run_cell(
        self,
        code: str,
        on_tick: Callable[[], None] | None = None,
        ranks: list[int] | None = None,
        push: str | None = None,
        out: list[str] | None = None,
    ) -> CellResult:
        """Run `code` on every rank (or those in `ranks`), with `push` (base64 pickled
        globals) set first and the `out` names saved after it (`out_folder(result)` on
        each node); blocks until each reported. A KeyboardInterrupt
        (the kernel's) interrupts every rank's cell; a rank that does not come back within
        INTERRUPT_GRACE_S breaks the session (SessionEnded). `on_tick` runs about ten
        times a second while it waits (a view's chance to draw)."""
        if not self.alive:
            raise SessionEnded(self.ended_message())
        problem = syntax_problem(code)
        if problem is not None:  # refused here: each rank would raise the same SyntaxError
            raise SpecError(f"session {self.name}: {problem}")
        cell = self._cells = self.next_cell
        chosen = self.chosen(ranks)
        self.failed_ranks = []  # until this cell says otherwise (an interrupt says nothing)
        names = [p.name for p in chosen]
        some = [p.rank for p in chosen] if len(chosen) < len(self.ranks) else None
        run = CellRun(cell, code, time.time(), some, pushed=push is not None, session=self.name)
        result = CellResult(cell, {p.name: p.label for p in self.job.plan.processes})
        message = {"cell": cell, "code": code, "push": push, "out": out or []}
        request = (json.dumps(message) + "\n").encode()

        def all_reported() -> bool:  # both streams: every line of the cell came first
            done = len(self._reports.get(cell, {})) == len(names)
            return done and len(self._flushed.get(cell, ())) == len(names)

        self._running_cell, self._running_names = cell, names
        try:
            # An interrupt while the cell is handed over is held until every rank has it
            # (raised inside the write to a rank's stdin, it left the ranks out of step),
            # then interrupts the cell as one that comes later does.
            with interrupts_deferred():
                self.job.note(names, cell_marker(cell))  # the stored logs: where it starts
                for name in names:
                    self.job.feed(name, request)
            self._wait(all_reported, None, on_tick)
        except KeyboardInterrupt:
            run.interrupted = True
            self._remember(run)
            self.interrupt_cell()
            try:
                self._wait(all_reported, INTERRUPT_GRACE_S, on_tick)
            except TimeoutError:
                stuck = [
                    self.job.processes[n].label
                    for n in names
                    if n not in self._reports.get(cell, {})
                ]
                self.job.cancel(
                    f"session {self.name} broken: {ranges(stuck)} did not come back from "
                    f"an interrupt within {INTERRUPT_GRACE_S:g} s"
                )
                self.job.wait()
                raise SessionEnded(self.ended_message()) from None
            raise
        finally:
            self._running_cell, self._running_names = None, []
        result.reports = dict(self._reports.pop(cell))
        self._flushed.pop(cell, None)
        ran = {p.name: p.rank for p in chosen}
        self.failed_ranks = sorted(ran[n] for n, r in result.reports.items() if not r["ok"])
        run.ok = result.ok
        run.failed = None if result.ok else result.describe().splitlines()[0]
        self._remember(run)
        return result

    def _remember(self, run: CellRun) -> None:
        """The cell in the session's history (run/session_history.py): what an export of
        the session keeps or leaves out. A store that cannot be written costs the history
        alone; the job says so where it matters (its own writes)."""
        with contextlib.suppress(OSError):
            record_cell(self.job.record, run)

    def interrupt_cell(self) -> None:
        """SIGINT to the ranks still running the current cell: a rank whose cell has
        ended (it reported) has nothing to stop. Nothing when no cell runs."""
        with self._changed:
            cell, names = self._running_cell, self._running_names
            running = [n for n in names if n not in self._reports.get(cell, {})]
        if running:
            self.job.interrupt(running)

    def post_mortem(self, rank: int, wait: float) -> bool:
        """Rank `rank`'s debugger on the exception its last cell raised, where it raised,
        with the cell's variables (node_side/session_worker.py): blocks until the user
        continues or quits it there (diagnose/debug.py reaches it), or nobody attached
        within `wait` seconds. False where that rank's last cell did not fail. The rank
        lives on, as after any cell; the session's history is not touched."""
        if not self.alive:
            raise SessionEnded(self.ended_message())
        (proc,) = self.chosen([rank])
        cell = self._cells  # the last cell's number: its report comes again, then goes
        request = (json.dumps({"cell": cell, "post_mortem": wait}) + "\n").encode()

        def reported() -> bool:
            return proc.name in self._reports.get(cell, {}) and proc.name in self._flushed.get(
                cell, ()
            )

        with interrupts_deferred():
            self.job.feed(proc.name, request)
        try:
            self._wait(reported, None)
            return bool(self._reports[cell][proc.name].get("debugged"))
        finally:
            with self._changed:
                self._reports.pop(cell, None)
                self._flushed.pop(cell, None)

    def chosen(self, ranks: list[int] | None) -> list[ProcessPlan]:
        """The session's rank processes, or those of `ranks` (SpecError naming a rank the
        session does not have)."""
        return chosen_ranks(self.name, self.ranks, ranks)

    @property
    def cells_run(self) -> int:
        return self._cells

    @property
    def next_cell(self) -> int:
        """The number run_cell gives the next cell (its marker in the logs, its out folder)."""
        return self._cells + 1

    def memory_text(self) -> str:
        """Each rank's memory as it last reported (ready, or after its last cell):
        `rank 0 212 MiB, rank 1 230 MiB`, or for many ranks the spread and the largest."""
        rows = [(p.label, self.memory.get(p.name, {})) for p in self.ranks]
        parts = []
        for kind, word in (("rss", ""), ("gpu", " on GPU")):
            known = [(label, m[kind]) for label, m in rows if kind in m]
            if not known:
                continue
            if len(known) <= 8:
                parts.append(", ".join(f"{label} {mib(n)}" for label, n in known) + word)
            else:
                sizes = sorted(n for _, n in known)
                top = max(known, key=lambda item: item[1])
                parts.append(f"{mib(sizes[0])} to {mib(sizes[-1])} per rank{word} (most: {top[0]})")
        return "; ".join(parts) or "not reported yet"

    @staticmethod
    def out_folder(result: CellResult) -> str:
        """Where the ranks saved a cell's `out` values, in the job's folder of each node."""
        return f"out/cell-{result.cell}"

    # -- the ranks' messages ---------------------------------------------------------------

    def _on_message(self, proc: ProcessPlan, text: str) -> None:
        word, _, rest = text[len(MARK) :].strip().partition(" ")
        with self._changed:
            if word == "ready":
                self._ready.add(proc.name)
                self.memory[proc.name] = json.loads(rest or "{}")
            elif word == "done":
                report = json.loads(rest)
                self._reports.setdefault(report["cell"], {})[proc.name] = report
                self.memory[proc.name] = {k: report[k] for k in ("rss", "gpu") if k in report}
            elif word == "flushed":
                self._flushed.setdefault(int(rest), set()).add(proc.name)
            if self._awaited is None or self._awaited():
                self._changed.notify_all()

    def _wait(
        self,
        condition: Callable[[], bool],
        timeout: float | None,
        on_tick: Callable[[], None] | None = None,
    ) -> None:
        """Until `condition` holds; SessionEnded if the job ends first, TimeoutError after
        `timeout` seconds. Short waits keep KeyboardInterrupt deliverable."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            self._awaited = condition
        try:
            while True:
                with self._changed:
                    if condition():
                        break
                    if self.job.done:
                        raise SessionEnded(self.ended_message())
                    self._changed.wait(0.1)
                if on_tick is not None:
                    on_tick()
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError
        finally:
            with self._changed:
                self._awaited = None
        if on_tick is not None:
            on_tick()

    def ended_message(self) -> str:
        """Why the session is over, with the job's root cause where one failed."""
        result = self.job.wait(0) if self.job else None
        if result is None:
            return f"session {self.name} has ended"
        return f"session {self.name} has ended: {result.describe()}"


def session_spec(spec: JobSpec) -> JobSpec:
    """The job that runs a session's ranks: the spec's ranks, each a session worker.
    SpecError for jobs whose processes are not one rank each."""
    dist = spec.distribution
    if spec.job_type != "pytorch" or dist.launcher != "per_process":
        raise SpecError(
            "a session runs pytorch ranks, one process each (launcher per_process); "
            f"this is {spec.job_type}"
            + (f" with launcher {dist.launcher}" if spec.job_type == "pytorch" else "")
        )
    data = {key: value for key, value in spec.to_dict().items() if key != "script"}
    data["command"] = f'exec python3 "$DISTRUN_JOB_DIR/{WORKER}"'  # exec: SIGINT reaches it
    return spec_from_dict(data, base_dir=".", source="session")


def chosen_ranks(
    name: str, processes: list[ProcessPlan], ranks: list[int] | None
) -> list[ProcessPlan]:
    """Session `name`'s rank `processes`, or those of `ranks` (SpecError naming a rank the
    session does not have)."""
    if ranks is None:
        return processes
    by_rank = {p.rank: p for p in processes}
    unknown = [r for r in ranks if r not in by_rank]
    if unknown:
        raise SpecError(
            f"--ranks: session {name} has no rank {unknown[0]} (its ranks: 0-{len(by_rank) - 1})"
        )
    return [by_rank[r] for r in sorted(set(ranks))]


def names_of(sessions: Iterable[Session]) -> str:
    return ", ".join(shlex.quote(s.name) for s in sessions) or "none is open"
