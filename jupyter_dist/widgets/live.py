"""The live view of a running job (anywidget): the job's state and elapsed time, a chip per
rank (its state; pick one to see its output), the output, the root cause, and the inspector
folded under a one-line summary. Styled by live.css with JupyterLab's own variables.
live.js and live.css reach a page once per kernel, in one LiveCode widget that every
view names (`_code`); a view's own module is live_loader.js, which loads them from there.

Lines reach the browser as deltas in custom messages, one message per tick at most (the
cell's thread ticks about ten times a second), never re-sending history. The browser keeps
`max_lines` lines per tab; the full log stays in the store. The view's plain-text form
(what nbconvert, papermill and terminals keep) is its status and the last lines.

A detached job's view (`follow_in_view`) takes the same events from the store, read by a
thread of its own while the kernel is free for other cells (run/follow.py).

A page loaded again (a reload, a second browser) draws what it missed: its view sees
`lines_total` ahead of what it holds and asks once; the answer is the last `max_lines` of
every tab, read from the store.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from pathlib import Path

import anywidget
from traitlets import Any, Bool, Dict, Float, Int, List, Unicode

from jupyter_dist.describe import attempt_caption, plan_rows
from jupyter_dist.diagnose.debug import paused_text
from jupyter_dist.diagnose.stall import describe_stall
from jupyter_dist.events import Attempt, JobListener, JobResult, OutputLine, ProcessState
from jupyter_dist.plan.parity import describe, parity_notes
from jupyter_dist.run.metrics import MetricsReader, read_metrics, thinned
from jupyter_dist.run.outputs import output_notes
from jupyter_dist.spec import JobSpec
from jupyter_dist.store import JobRecord, JobStore

MAX_LINES_PER_MESSAGE = 5000
MIN_INTERVAL_S = 0.1
ELAPSED_INTERVAL_S = 1.0  # the browser counts on between updates
METERS_INTERVAL_S = 1.0  # each rank's CPU and memory, as often as the agents report them
TEXT_LINES = 200
CHART_POINTS = 2000  # about the most points a chart draws per series (the browser thins)


_HERE = Path(__file__).parent


class LiveCode(anywidget.AnyWidget):
    """The live views' front-end code (live.js, live.css), sent once per kernel: each view
    names it (`LiveView._code`) and its page loads the code from it once
    (live_loader.js). Never shown itself. `live_code()` gives the kernel's one."""

    _esm = Unicode("export default {};").tag(sync=True)
    _anywidget_id = Unicode(f"{__name__}.LiveCode").tag(sync=True)
    layout = Any(None, allow_none=True).tag(sync=True)
    code = Unicode((_HERE / "live.js").read_text()).tag(sync=True)
    style = Unicode((_HERE / "live.css").read_text()).tag(sync=True)


_live_code: LiveCode | None = None
_live_code_lock = threading.Lock()


def live_code() -> LiveCode:
    """The kernel's LiveCode, made at the first view (and again if it was closed)."""
    global _live_code
    with _live_code_lock:
        if _live_code is None or _live_code.comm is None:
            _live_code = LiveCode()
        return _live_code


class LiveView(anywidget.AnyWidget):
    last: LiveView | None = None  # the latest view shown, for inspection from the kernel

    # The front end's code: a loader of the kernel's one LiveCode (`_code`), which holds
    # live.js and live.css. Each view carried them once, 68 KB a cell, parsed and compiled
    # again by the page for every cell. Traits of the class, read once: given as files,
    # anywidget made each view a class of its own (HasTraits.add_traits) and tied it to
    # the files' watcher for hot reloading.
    _esm = Unicode((_HERE / "live_loader.js").read_text()).tag(sync=True)
    _anywidget_id = Unicode(f"{__name__}.LiveView").tag(sync=True)
    _code = Unicode("").tag(sync=True)  # the model id of the kernel's LiveCode
    # No Layout widget of its own (a DOMWidget's default: a second model, comm and message
    # for every cell): live.css lays the view out; the front end takes none (null).
    layout = Any(None, allow_none=True).tag(sync=True)

    job_id = Unicode("").tag(sync=True)
    name = Unicode("").tag(sync=True)  # the job's name, if it has one
    summary = Unicode("").tag(sync=True)  # "4 ranks on 2 nodes"
    elapsed = Float(0.0).tag(sync=True)  # seconds since the job started, as the kernel saw
    state = Unicode("starting").tag(sync=True)
    processes = List(Dict()).tag(sync=True)
    root_cause = Unicode("").tag(sync=True)
    log_dir = Unicode("").tag(sync=True)
    max_lines = Int(2000).tag(sync=True)
    lines_total = Int(0).tag(sync=True)  # lines the job printed so far, sent or skipped
    cell = Int(0).tag(sync=True)  # the session cell this view shows; 0: the whole job
    session = Unicode("")  # the session's name, for a cell's view
    checks = List(Unicode()).tag(sync=True)  # what stands out in the plan (plan/parity.py)
    # The job looks stuck: [notice, grouped stacks one line per group...]; [] while it moves.
    stall = List(Unicode()).tag(sync=True)
    # A job that starts again after a failure: "attempt 2 of 4" ("" on its first), and each
    # earlier attempt's cause, one line each (events.Attempt.summary).
    attempt = Unicode("").tag(sync=True)
    attempts = List(Unicode()).tag(sync=True)
    # Metric records the job stored so far (run/metrics.py): a page holding fewer asks for
    # them again, as for lines.
    metrics_total = Int(0).tag(sync=True)
    # The cell's last display of the job, which changes no more (`settled()`, a session
    # cell's view made at its end): its root says so (`distrun-final`), for a page or a
    # test that must not read the live view the final one is about to replace.
    final = Bool(False).tag(sync=True)

    def __init__(
        self, job, names: list[str] | None = None, listener=None, opened: bool = True, **kwargs
    ) -> None:
        """The view of `job`, or of its processes in `names` only. `listener`: a Collector
        already listening to the job (what it holds is sent at the first tick), else one of
        its own from now on. `opened=False`: the page hears of the view only at
        `open_now()` (see there)."""
        self._opened, self._held = opened, []
        # Who is who (ranks, master, role, TF_CONFIG) is fixed by the plan (an attempt's:
        # a restart plans anew); states change.
        self._take_plan(job.plan)
        shown = [s for s in job.processes.values() if names is None or s.name in names]
        kwargs = {
            "name": job.name,
            "summary": job.summary,
            "checks": parity_notes(job.plan) + output_notes(job.plan, job.record.path),
            "processes": [self._row(state) for state in shown],
            "attempt": attempt_caption(job.attempt, job.attempts_allowed),
            "attempts": [attempt.summary() for attempt in job.attempts],
            **kwargs,
        }
        super().__init__(
            job_id=job.job_id,
            log_dir=str(job.record.logs_dir),
            _code=live_code().model_id,
            **kwargs,
        )
        self._job = job  # its start time, for the elapsed clock
        self._last_elapsed = 0.0
        if listener is None:
            listener = Collector()
            job.add_listener(listener)
        self.listener = listener
        self.messages_sent = 0
        self.lines_sent = 0
        self.lines_skipped = 0
        self._last_send = 0.0
        self._recent: deque[OutputLine] = deque(maxlen=TEXT_LINES)
        self._record = job.record
        self._labels: dict[str, str] = {}  # log key -> label, as the lines said
        self._last_meters = 0.0
        self.meters_sent: deque[dict] = deque(maxlen=600)  # the readings sent, for checks
        self._metrics = MetricsReader(job.record)
        self.metrics_sent = 0  # records sent, for checks
        self.on_msg(self._on_message)

    def open(self) -> None:
        """As Widget's (it opens the comm as the view is made), unless made with
        `opened=False`."""
        if self._opened:
            super().open()

    def open_now(self) -> None:
        """Open a view made with `opened=False`: the page gets its state as it is now, in
        the comm's one opening message, then the messages it held (its lines). A view
        settled before it is shown (a warm cell that took milliseconds) so costs one
        message, not one for its start and one for each change since."""
        self._opened = True
        self.open()
        held, self._held = self._held, []
        for content, buffers in held:
            self.send(content, buffers)

    def send(self, content, buffers=None) -> None:
        """As Widget's; held until `open_now()` in a view not opened yet (Widget drops them)."""
        if not self._opened:
            self._held.append((content, buffers))
        else:
            super().send(content, buffers)

    def add_traits(self, **traits) -> None:
        """As HasTraits's, for traits the class lacks: anywidget adds its own at each
        view's start, which the class already has (above), so no view gets a class of
        its own."""
        new = {name: trait for name, trait in traits.items() if not self.has_trait(name)}
        if new:
            super().add_traits(**new)

    def _take_plan(self, plan) -> None:
        self._plan = plan
        self._who = {row["process"]: row for row in plan_rows(plan)}
        self._keys = {p.name: p.log_keys for p in plan.processes}

    def tick(self, force: bool = False) -> None:
        """Send what came since the last tick (call from the cell's thread)."""
        now = time.monotonic()
        if not force and now - self._last_send < MIN_INTERVAL_S:
            return
        if self._job.plan is not self._plan:  # a new attempt's: its ports, perhaps nodes
            self._take_plan(self._job.plan)
        lines, states, result = self.listener.take()
        stall = self.listener.take_stall()
        if stall is not None:
            self.stall = stall
        restarted = self.listener.take_attempts()
        if restarted:
            number, of, _ = restarted[-1]
            self.attempt = attempt_caption(number, of)
            self.attempts = [*self.attempts, *(ended.summary() for _, _, ended in restarted)]
            self.state, self.stall = "restarting", []
        started, ended = self._clock()
        due = force or result is not None or now - self._last_elapsed >= ELAPSED_INTERVAL_S
        if started and due:
            self.elapsed = round((ended or time.time()) - started, 1)
            self._last_elapsed = now
        by_name = {row["name"]: row for row in self.processes} if states else {}
        states = [state for state in states if state.name in by_name]  # a cell's ranks only
        if states:
            for state in states:
                by_name[state.name] = self._row(state)
            self.processes = list(by_name.values())
            if self.state in ("starting", "restarting") and any(
                state.state == "running" for state in states
            ):
                self.state = "running"
        if lines:
            self._recent.extend(lines)
            self._labels.update((line.key, line.label) for line in lines)
            self.lines_total += len(lines)
            if len(lines) > MAX_LINES_PER_MESSAGE:  # the browser keeps few; the store has all
                self.lines_skipped += len(lines) - MAX_LINES_PER_MESSAGE
                lines = lines[-MAX_LINES_PER_MESSAGE:]
            # An OutputLine is a tuple: key, label, stream, text, time.
            self.send(
                {
                    "type": "lines",
                    "lines": [list(line[:4]) for line in lines],
                    "total": self.lines_total,
                }
            )
            self.messages_sent += 1
            self.lines_sent += len(lines)
            self._last_send = now
        if result is not None or now - self._last_meters >= METERS_INTERVAL_S:
            if result is None:
                self._send_meters()
            self._send_metrics()
            self._last_meters = now
        if result is not None:
            self.state = result.state.replace("_", " ")
            self.stall = []
            if result.root_cause:
                self.root_cause = result.root_cause.format()
            elif result.state == "failed" and result.message:  # stopped as stuck, say
                self.root_cause = result.describe()

    def _send_meters(self) -> None:
        """Each shown process's and rank's latest CPU share and memory (diagnose/meters.py); the
        browser keeps the last minute of them for its sparklines."""
        shown = {row["name"] for row in self.processes}
        keys = {key for name in shown for key in (name, *self._keys.get(name, ()))}
        readings = {
            key: [reading.cpu, reading.rss, *(reading.gpu or ())]
            for key, reading in self._job.meters.snapshot().items()
            if key in keys
        }
        if readings:
            self.send({"type": "meters", "readings": readings})
            self.meters_sent.append(readings)

    def _send_metrics(self) -> None:
        """The metric and progress records stored since the last send (not for a session
        cell's view: a session's metrics are the whole session's)."""
        if self.cell:
            return
        records = self._metrics.new()
        if records:
            self.metrics_total += len(records)
            self.send(
                {
                    "type": "metrics",
                    "records": [_compact(r) for r in records],
                    "total": self.metrics_total,
                }
            )
            self.metrics_sent += len(records)

    def settled(self) -> LiveView:
        """A new view of what this one shows now: the cell's final display. A fresh model,
        because a browser can lose every message of a live one: anywidget drops a model's
        messages for good when its module took over 2 s to load (a page starved of CPU
        while ranks start). The new one holds the final state and asks for the lines it
        lacks; where nothing was lost its page already holds them and asks nothing."""
        copy = LiveView(
            self._job,
            names=[row["name"] for row in self.processes],
            **{
                name: getattr(self, name)
                for name in (
                    "name",
                    "summary",
                    "elapsed",
                    "state",
                    "processes",
                    "root_cause",
                    "max_lines",
                    "lines_total",
                    "cell",
                    "session",
                    "checks",
                    "attempt",
                    "attempts",
                    "metrics_total",
                )
            },
            final=True,
        )
        self._job.remove_listener(copy.listener)  # it changes no more
        copy._recent.extend(self._recent)
        copy._labels.update(self._labels)
        return copy

    def _clock(self) -> tuple[float | None, float | None]:
        """When what this view shows started and ended (None: not yet)."""
        return self._job.started, self._job.ended

    def _on_message(self, _widget, content: dict, _buffers) -> None:
        """A page that missed lines asks for what the browser would hold (answered once
        the kernel is free: while a cell runs its messages wait)."""
        if content.get("type") == "history":
            self.send({"type": "history", "lines": self.stored_lines(), "total": self.lines_total})
            if self.metrics_total and not self.cell:
                records, _ = read_metrics(self._record)
                shown = [_compact(r) for r in thinned(records, CHART_POINTS)]
                self.send(
                    {
                        "type": "metrics",
                        "history": True,
                        "total": self.metrics_total,
                        "records": shown,
                    }
                )

    def stored_lines(self) -> list[list[str]]:
        """The last `max_lines` lines of every log key from the store, merged by time, as
        [key, label, stream, text] (the shape of a "lines" message)."""
        keys = self._record.log_keys()
        if self.cell:  # the ranks this view shows, that cell's lines only
            shown = {key for row in self.processes for key in row["keys"]}
            keys = [key for key in keys if key in shown]
        return [
            [key, self._labels.get(key, key), stream, text]
            for _ts, key, stream, text in self._record.read_logs(
                keys, tail=self.max_lines, cell=self.cell or None
            )
        ]

    def heading(self) -> str:
        """The plain-text form's first line."""
        if self.cell:
            return (
                f"session {self.session} cell {self.cell}: {self.state} (logs: "
                f"jupyter distrun logs {self.job_id} --cell {self.cell})"
            )
        return f"job {self.job_id}: {self.state} (full logs: {self.log_dir})"

    def text(self) -> str:
        """The view as plain text: status per process, the last lines, the root cause."""
        rows = [self.heading()]
        if self.attempt:
            rows.append(f"{self.attempt}; earlier: " + "; ".join(self.attempts))
        for row in self.processes:
            exit_ = "" if row["exit"] is None else f" ({row['exit']})"
            rows.append(f"  {row['label']} on {row['node']}: {row['state']}{exit_}")
        rows += [f"[{line.label}] {line.text}" for line in self._recent]
        if self.stall:
            rows.append(describe_stall(self.stall[0], self.stall[1:]).rstrip())
        if self.root_cause:
            rows.append(self.root_cause)
        if self.checks:
            rows.append(describe(self.checks))
        return "\n".join(rows)

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        if isinstance(bundle, tuple):
            data, metadata = bundle
            data["text/plain"] = self.text()
            return data, metadata
        bundle["text/plain"] = self.text()
        return bundle

    def _row(self, state: ProcessState) -> dict:
        """One inspector row: the plan's columns (see describe.plan_rows) and the state."""
        return {
            **self._who.get(state.name, {}),
            "name": state.name,
            "label": state.label,
            "node": state.node,
            "host": state.host,
            "state": state.state,
            "exit": state.signal or state.exit_code,
            "keys": self._keys.get(state.name, [state.name]),
            "paused": [paused_text(p) for p in state.paused],  # where its debugger waits
            "paused_ranks": [p.get("rank") for p in state.paused],  # a launcher's: several
        }


def run_with_view(spec: JobSpec, inventory, store: JobStore | None = None, extra_files=None):
    """Run a job with its live view displayed in the cell (the magic's and the form's way);
    returns (job, result, view). Blocks; an interrupt cancels the job."""
    from jupyter_dist.run.launch import run_in_view

    job, result, shown = run_in_view(
        spec, _DisplayedView, inventory=inventory, store=store, extra_files=extra_files
    )
    return job, result, shown.view


class _DisplayedView:
    """A job's live view displayed in the cell (run_in_view's view), replaced at the end by
    its settled copy: the final state, and the text form kept by notebooks saved without
    widgets."""

    def __init__(self, job) -> None:
        from IPython.display import display

        self.view = LiveView.last = LiveView(job)
        self._handle = display(self.view, display_id=True)

    def tick(self) -> None:
        self.view.tick()

    def ended(self) -> None:
        self.view.tick(force=True)
        self._handle.update(self.view.settled())


def follow_in_view(record: JobRecord, history: int = 0) -> LiveView:
    """A live view of a job another process runs (a detached job), displayed in the cell
    and kept up to date from the store by a thread of its own: the cell returns at once,
    and the kernel is free for other cells while the view follows the job to its end."""
    from IPython.display import display

    from jupyter_dist.run.follow import FollowedJob
    from jupyter_dist.run.requests import effective_state

    job = FollowedJob(record, history=history)
    state = effective_state(record.status())
    view = LiveView.last = LiveView(job, state="starting" if state == "pending" else state)
    handle = display(view, display_id=True)

    def follow() -> None:
        with contextlib.suppress(Exception):  # a store gone while it runs: the view stops
            job.follow(on_tick=view.tick)
            view.tick(force=True)
            handle.update(view.settled())

    threading.Thread(target=follow, daemon=True, name=f"distrun-view-{record.job_id}").start()
    return view


def _compact(record: dict) -> list:
    """A metric record as the browser takes it: [key, step, time, {name: value}], or a
    progress record: [key, null, time, null, [n, total], rate]."""
    if "p" in record:
        return [record["k"], None, record.get("t"), None, record["p"], record.get("r")]
    return [record["k"], record.get("s"), record.get("t"), record.get("m")]


class Collector(JobListener):
    """What the job's threads report, held until the cell's thread takes it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lines: list[OutputLine] = []
        self._states: dict[str, ProcessState] = {}
        self._result: JobResult | None = None
        self._stall: list[str] | None = None  # the latest stall news, until taken
        self._attempts: list[tuple[int, int, Attempt]] = []  # restarts not yet taken

    def on_lines(self, lines: list[OutputLine]) -> None:
        with self._lock:
            self._lines.extend(lines)

    def on_process(self, state: ProcessState) -> None:
        with self._lock:
            self._states[state.name] = state

    def on_finish(self, result: JobResult) -> None:
        with self._lock:
            self._result = result
            for state in result.processes:
                self._states[state.name] = state

    def on_stall(self, notice: str | None, summary: list[str]) -> None:
        with self._lock:
            self._stall = [] if notice is None else [notice, *summary]

    def on_attempt(self, number: int, of: int, previous: Attempt) -> None:
        with self._lock:
            self._attempts.append((number, of, previous))

    def heard_nothing(self) -> bool:
        """Whether no line, stall news, restart or end of the job came since it listened."""
        with self._lock:
            return not (self._lines or self._attempts or self._result) and self._stall is None

    def take_attempts(self) -> list[tuple[int, int, Attempt]]:
        """The restarts since the last call: (number, of, the attempt that failed)."""
        with self._lock:
            taken, self._attempts = self._attempts, []
            return taken

    def take_stall(self) -> list[str] | None:
        """The stall news since the last call ([] once it moves again), or None."""
        with self._lock:
            stall, self._stall = self._stall, None
            return stall

    def take(self) -> tuple[list[OutputLine], list[ProcessState], JobResult | None]:
        with self._lock:
            lines, self._lines = self._lines, []
            states, self._states = list(self._states.values()), {}
            return lines, states, self._result
