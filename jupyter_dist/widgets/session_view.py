"""The live view of one cell run in a warm session: the live view of the session's job,
narrowed to the ranks the cell runs on and to the time it runs. Its lines are that cell's
(a page loaded again reads them from the store between the cell's markers); each rank's
chip ends succeeded, or failed where its cell raised; the errors, each once with the ranks
that raised it, are the root cause. The session's ranks live on either way.
"""

from __future__ import annotations

import time
from typing import Any

from jupyter_dist.events import ProcessState, ranges
from jupyter_dist.plan.model import ProcessPlan
from jupyter_dist.run.metrics import METRICS_FILE
from jupyter_dist.run.session import CellResult, Session
from jupyter_dist.widgets.live import Collector, LiveView

# A cell that ends sooner shows one view, made at its end and opened settled (one message);
# one that runs longer gets its live view then, and a settled copy at its end
# (LiveView.settled). A warm cell takes milliseconds, and each view is a widget the kernel
# makes (milliseconds of its CPU, taken from the ranks on a small machine) that nobody
# could watch live. A cell that ends sooner, succeeded on every rank and said nothing (no
# line, no metric: `x = 1`, `optimizer.step()`) shows nothing, as a Python cell that prints
# nothing does, and as the text view shows it: its view would say only that, and the page
# would draw a widget for it (19 ms of JupyterLab's time a cell: bench/lab_cells.py).
LIVE_AFTER_S = 0.5


class CellView(LiveView):
    def __init__(
        self,
        session: Session,
        chosen: list[ProcessPlan],
        cell: int,
        started: float,
        listener: Collector,
        opened: bool = True,
    ) -> None:
        """Cell `cell` on `chosen`, started at `started` (epoch seconds); `listener` has
        collected what the job said since then. `opened`: as LiveView's."""
        self._started, self._ended = started, None
        self._outcome: dict[str, str] = {}  # process name -> its state for this cell
        super().__init__(
            session.job,
            names=[p.name for p in chosen],
            listener=listener,
            cell=cell,
            session=session.name,
            name=f"{session.name} · cell {cell}",
            summary=f"cell {cell} of session {session.name} on {ranges([p.label for p in chosen])}",
            state="running",
            opened=opened,
        )

    def _clock(self) -> tuple[float | None, float | None]:
        return self._started, self._ended

    def _row(self, state: ProcessState) -> dict:
        row = super()._row(state)
        if state.state == "running" and state.name in self._outcome:
            row["state"] = self._outcome[state.name]
        return row

    def finish(self, result: CellResult | None, why: str = "") -> None:
        """The cell is over: `result` where every rank reported, else `why` it stopped
        (an interrupt, the session's end). The view stops listening to the job."""
        self._ended = time.time()
        self._job.remove_listener(self.listener)
        by_name = {state.name: state for state in self._job.processes.values()}
        if result is not None:
            self._outcome = {
                name: "succeeded" if report["ok"] else "failed"
                for name, report in result.reports.items()
            }
        else:
            self._outcome = {row["name"]: "stopped" for row in self.processes}
        self.tick(force=True)  # the last lines, and the rows of ranks that died
        with self.hold_sync():  # the cell's end in one message, not one a trait
            self.processes = [self._row(by_name[row["name"]]) for row in self.processes]
            if result is not None:
                self.state = "succeeded" if result.ok else "failed"
                self.root_cause = "" if result.ok else result.describe()
            elif not self.root_cause:  # a session that ended has the job's root cause
                self.state = "cancelled"
                self.root_cause = why


def run_cell_with_view(
    session: Session,
    code: str,
    chosen: list[ProcessPlan],
    push: str | None = None,
    out: list[str] | None = None,
) -> CellResult:
    """Run a cell in `session` with its live view displayed in the cell (the magic's way
    when it shows widgets); arguments and errors as for Session.run_cell."""
    from IPython.display import display, publish_display_data

    cell, started, since = session.next_cell, time.time(), time.monotonic()
    listener = Collector()  # from the start: the view, made later, sends what it holds
    session.job.add_listener(listener)
    metrics_before = _metrics_size(session)
    shown: dict[str, Any] = {}  # "view" and its display "handle", once the cell ran long

    def view(opened: bool = True) -> CellView:
        if "view" not in shown:
            made = CellView(session, chosen, cell, started, listener, opened=opened)
            shown["view"] = LiveView.last = made
        return shown["view"]

    def tick() -> None:
        if "handle" not in shown and time.monotonic() - since >= LIVE_AFTER_S:
            shown["handle"] = display(view(), display_id=True)
        if "handle" in shown:
            shown["view"].tick()

    result, why = None, "interrupted: every rank stopped this cell; the session is still open"
    try:
        result = session.run_cell(code, tick, [p.rank for p in chosen], push, out)
        return result
    except BaseException as exc:
        if not isinstance(exc, KeyboardInterrupt):
            why = str(exc).splitlines()[0]
        raise
    finally:
        if "handle" in shown:
            shown["view"].finish(result, why)
            shown["handle"].update(shown["view"].settled())  # see LiveView.settled
        elif (
            result is not None
            and result.ok
            and listener.heard_nothing()
            and _metrics_size(session) == metrics_before
        ):
            session.job.remove_listener(listener)  # nothing to show (see LIVE_AFTER_S)
        else:  # made at its end: the page hears of it once, as it ended
            ended = view(opened=False)
            ended.finish(result, why)
            ended.final = True
            ended.open_now()
            # Its bundle published as is: display() would ask each of IPython's formatters
            # first (a widget answers all in _repr_mimebundle_), 0.3 ms of a warm cell.
            publish_display_data(*_bundle(ended._repr_mimebundle_()))


def _metrics_size(session: Session) -> int:
    """The size of the session's metric records so far (0: none yet)."""
    try:
        return (session.job.record.path / METRICS_FILE).stat().st_size
    except OSError:
        return 0


def _bundle(bundle: dict | tuple[dict, dict]) -> tuple[dict, dict]:
    """A _repr_mimebundle_'s answer as (data, metadata)."""
    return bundle if isinstance(bundle, tuple) else (bundle, {})
