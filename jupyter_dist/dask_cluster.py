"""Interactive Dask clusters: the scheduler and workers run as a job (so they are in the
store, the sidebar and the process tables like any job), and the notebook gets a connected
`distributed.Client`. Stopping, a failed start and the kernel's exit end the job, which
stops every process on every node and waits until they are gone.

    cluster = DaskCluster(prepare_job(spec)).start()
    cluster.client.submit(...)
    cluster.stop()
"""

from __future__ import annotations

import atexit
import contextlib
import html
import threading
import time
from dataclasses import dataclass
from typing import Any

from jupyter_dist.describe import format_table
from jupyter_dist.errors import DistrunError
from jupyter_dist.events import JobResult
from jupyter_dist.node_side.dask_wait import missing_workers
from jupyter_dist.plan.dask import READY_TIMEOUT_S, worker_name
from jupyter_dist.plan.summary import counted
from jupyter_dist.run.interrupts import interrupts_deferred
from jupyter_dist.run.job import Job

STDERR_TAIL = 10  # lines of a missing worker's stderr shown in the error
CONNECT_ATTEMPT_S = 2.0  # also bounds how long the client tries to reconnect to a dead scheduler
_FAILED_START = "the Dask cluster did not start"

_running: dict[str, DaskCluster] = {}  # client name -> cluster, in this process
_running_lock = threading.Lock()


@dataclass(frozen=True)
class WorkerRow:
    node: str
    name: str
    address: str
    threads: int
    memory: str

    COLUMNS = ("node", "name", "address", "threads", "memory")


def _memory(limit: Any) -> str:
    if not limit:
        return "no limit"
    from dask.utils import format_bytes

    return format_bytes(int(limit))


class DaskCluster:
    """A Dask cluster started as a job, with a client in this process."""

    default_timeout = READY_TIMEOUT_S

    def __init__(self, job: Job, client_name: str = "client"):
        if job.plan.job_type != "dask":
            raise DistrunError(f"a Dask cluster needs a dask job, not {job.plan.job_type}")
        self.job = job
        self.client_name = client_name
        self.client = None
        scheduler = job.plan.process("scheduler")
        self.address = scheduler.env["DASK_SCHEDULER_ADDRESS"]
        # Registered worker name -> the process that runs it.
        self._workers = {
            worker_name(p.node, p.local_rank): p
            for p in job.plan.processes
            if p.role == "dask-worker"
        }

    # -- life cycle ----------------------------------------------------------------------

    def start(self, timeout: float = READY_TIMEOUT_S) -> DaskCluster:
        """Start the scheduler and workers, connect, and wait until every worker has
        registered. On any failure (or an interrupt) everything started is stopped first."""
        with _running_lock:
            if self.client_name in _running and _running[self.client_name].running:
                other = _running[self.client_name].job.job_id
                raise DistrunError(
                    f"a Dask cluster is already running as {self.client_name!r} (job {other}); "
                    f"stop it with `%distrun dask stop {self.client_name}` or choose another "
                    "--client-name"
                )
            _running[self.client_name] = self
        try:
            deadline = time.monotonic() + timeout
            self.job.watch.stall_watching = lambda: False  # a cluster waits for work: never a stall
            with interrupts_deferred():  # a half-started process would have nobody watching
                self.job.start()
            self.client = self._connect(deadline)
            missing = set()
            if self.client is not None:
                missing = missing_workers(
                    self.client,
                    self._workers,
                    max(0.0, deadline - time.monotonic()),
                    still_starting=lambda: not self.job.done,
                )
            self._raise_if_ended()
        except BaseException:
            self._stop(_FAILED_START)
            raise
        if self.client is None or missing:
            self._stop(_FAILED_START)  # first: the stderr tails below are then complete
            raise DistrunError(
                self._scheduler_message(timeout)
                if self.client is None
                else self._missing_message(missing, timeout)
            )
        return self

    def stop(self, reason: str = "Dask cluster stopped") -> JobResult:
        """Close the client, stop the scheduler and every worker, and wait until every
        process is gone on every node."""
        return self._stop(reason)

    @property
    def running(self) -> bool:
        return not self.job.done

    def _stop(self, reason: str) -> JobResult:
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.close(timeout=5)
        self.job.end(reason)
        result = self.job.wait()
        with _running_lock:
            if _running.get(self.client_name) is self:
                del _running[self.client_name]
        return result

    def _connect(self, deadline: float):
        """A client connected to the scheduler, retried until it listens; None if it did
        not by `deadline` (DistrunError if the job has ended meanwhile)."""
        from distributed import Client

        while True:
            self._raise_if_ended()
            try:
                return Client(self.address, timeout=CONNECT_ATTEMPT_S)
            except (OSError, TimeoutError):
                if time.monotonic() >= deadline:
                    return None

    def _raise_if_ended(self) -> None:
        if self.job.done:
            result = self.job.wait()
            raise DistrunError(f"the Dask cluster did not start: {result.describe()}")

    # -- errors --------------------------------------------------------------------------

    def _stderr_tail(self, process: str) -> list[str]:
        lines = list(self.job.record.iter_log(process, "stderr"))
        return [f"  {line.text}" for line in lines[-STDERR_TAIL:]] or ["  (nothing)"]

    def _missing_message(self, missing: set[str], timeout: float) -> str:
        first = sorted(missing)[0]
        proc = self._workers[first]
        others = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        return "\n".join(
            [
                f"Dask worker {first} on node {proc.node} ({proc.host}) did not register with "
                f"the scheduler within {timeout:g} s{others}; everything was stopped. "
                f"Its last stderr lines:",
                *self._stderr_tail(proc.name),
            ]
        )

    def _scheduler_message(self, timeout: float) -> str:
        proc = self.job.plan.process("scheduler")
        return "\n".join(
            [
                f"the Dask scheduler on node {proc.node} ({self.address}) did not answer within "
                f"{timeout:g} s; everything was stopped. Its last stderr lines:",
                *self._stderr_tail("scheduler"),
            ]
        )

    # -- what the notebook shows ---------------------------------------------------------

    @property
    def dashboard_link(self) -> str:
        return self.client.dashboard_link if self.client is not None else ""

    def workers(self) -> list[WorkerRow]:
        """The workers registered now, by node."""
        if self.client is None or not self.running:
            return []
        rows = []
        for address, info in self.client.scheduler_info()["workers"].items():
            name = str(info.get("name"))
            proc = self._workers.get(name)
            rows.append(
                WorkerRow(
                    node=proc.node if proc else "?",
                    name=name,
                    address=address,
                    threads=int(info.get("nthreads", 0)),
                    memory=_memory(info.get("memory_limit")),
                )
            )
        return sorted(rows, key=lambda r: (r.node, r.name))

    def _heading(self) -> str:
        nodes = len(self.job.plan.nodes)
        state = "running" if self.running else self.job.state
        return (
            f"Dask cluster {self.job.job_id} ({state}): {counted(len(self._workers), 'worker')} "
            f"on {counted(nodes, 'node')}, scheduler {self.address}"
        )

    def __repr__(self) -> str:
        lines = [self._heading()]
        if self.running:
            lines.append(f"client: {self.client_name}    dashboard: {self.dashboard_link}")
            rows = [vars(r) for r in self.workers()]
            lines.append(format_table(rows, WorkerRow.COLUMNS))
            lines.append(f"stop it with: %distrun dask stop {self.client_name}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        esc = html.escape
        parts = [f"<div class='jupyter-dist-dask'><b>{esc(self._heading())}</b>"]
        if self.running:
            link = esc(self.dashboard_link)
            parts.append(
                f"<div>client: <code>{esc(self.client_name)}</code> · dashboard: "
                f"<a href='{link}' target='_blank' rel='noopener'>{link}</a></div>"
            )
            head = "".join(f"<th>{c}</th>" for c in WorkerRow.COLUMNS)
            body = "".join(
                "<tr>"
                + "".join(f"<td>{esc(str(getattr(r, c)))}</td>" for c in WorkerRow.COLUMNS)
                + "</tr>"
                for r in self.workers()
            )
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            parts.append(
                f"<div>stop it with <code>%distrun dask stop {esc(self.client_name)}</code></div>"
            )
        parts.append("</div>")
        return "".join(parts)


def running_clusters() -> dict[str, DaskCluster]:
    """The clusters this process started that still run, by client name."""
    with _running_lock:
        return {name: c for name, c in _running.items() if c.running}


def stop_all(reason: str) -> list[JobResult]:
    """Stop every cluster this process started (the kernel is exiting)."""
    with _running_lock:
        clusters = list(_running.values())
    return [cluster.stop(reason) for cluster in clusters]


atexit.register(stop_all, "the kernel exited")
