"""A running job's state machine: start all-or-nothing, watch every process, fail fast,
cancel, time out, start again after a failure when allowed, and leave nothing running. Its
helpers each do one job: run/output.py (lines to the store and listeners),
diagnose/root_cause.py (why it failed), run/starting.py (every process at once),
run/stopping.py (SIGTERM to SIGKILL, requests from elsewhere), run/debug_relay.py (the
debugger's owner side: `Job.debugger`), run/rank_watch.py (usage, stacks and stalls:
`Job.watch`).

States: pending -> running -> one of FINAL_STATES. A job with `Restarts` whose attempt
failed goes running -> restarting -> running again (the next attempt, planned anew: fresh
ports, DISTRUN_RESTART_COUNT), at most `Restarts.limit` times; its earlier attempts are kept
as `Job.attempts`, and its logs hold a marker line where each later attempt starts
(store.attempt_marker)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from jupyter_dist.backends.base import Backend, ProcessHandle
from jupyter_dist.diagnose.meters import Meters
from jupyter_dist.diagnose.root_cause import StderrEvidence
from jupyter_dist.diagnose.stall import DEFAULT_STALL_TIMEOUT_S
from jupyter_dist.errors import DistrunError
from jupyter_dist.events import (
    FINAL_STATES,
    Attempt,
    JobListener,
    JobResult,
    Listened,
    OutputLine,
    ProcessState,
    RootCause,
    describe_exit,
)
from jupyter_dist.nodes import Node
from jupyter_dist.plan.model import LaunchPlan, ProcessPlan
from jupyter_dist.plan.summary import header_summary
from jupyter_dist.run.debug_relay import MARK as DEBUG_MARK
from jupyter_dist.run.debug_relay import DebugRelay
from jupyter_dist.run.metrics import MetricsSink
from jupyter_dist.run.output import OutputPipeline
from jupyter_dist.run.outputs import collect_folder, collect_outputs
from jupyter_dist.run.rank_watch import RankWatch
from jupyter_dist.run.requests import ANSWER_GRACE_S, owner_fields
from jupyter_dist.run.starting import start_all
from jupyter_dist.run.stopping import escalate, kill_and_wait, watch_requests
from jupyter_dist.store import JobRecord, attempt_marker

GRACE_PERIOD_S = 5.0  # between SIGTERM and SIGKILL when a process is stopped
DRAIN_S = 2.0  # how long a process's output may still come after its agent is gone
RESTART_DELAY_S = 3.0  # between a failed attempt's end and the next one's start


@dataclass(frozen=True)
class Restarts:
    """How a failed job starts again: at most `limit` times, `delay` seconds after the
    failed attempt ended, with the plan and nodes `replan(nodes, restart_count)` gives for
    the job's current nodes (restart_count: 1 for the second attempt; a node may have been
    replaced by a spare); a replan that raises ends the job, failed, saying why."""

    limit: int
    delay: float
    replan: Callable[[list[Node], int], tuple[LaunchPlan, list[Node]]]


class Job(Listened):
    """One launched plan. Create it, `start()` it, then `wait()` or `cancel()`."""

    def __init__(
        self,
        plan: LaunchPlan,
        nodes: list[Node],
        backend: Backend,
        record: JobRecord,
        name: str = "",
        timeout: float | None = None,
        grace_period: float = GRACE_PERIOD_S,
        messages: tuple[str, Callable[[ProcessPlan, str], None]] | None = None,
        stall_timeout: float = DEFAULT_STALL_TIMEOUT_S,
        on_stall: str = "warn",
        restarts: Restarts | None = None,
        metrics_patterns: list[str] | None = None,
    ):
        """`messages`: (mark, handler) for messages the processes print among their output
        (run/output.py); a warm session reads its ranks' cell reports so. A job quiet for
        `stall_timeout` seconds (0: never) looks stuck (diagnose/stall.py): its stacks are
        taken and its listeners told; with `on_stall="kill"` it is also stopped. With
        `restarts`, a failed attempt (a rank failed, a node was lost, a stall killed it) is
        followed by another; a cancel or a timeout ends the job. `metrics_patterns`: the
        job's own lines to read metrics from (the spec's `metrics.pattern`, run/metrics.py)."""
        self.plan = plan
        self.job_id = plan.job_id
        self.name = name or plan.job_type
        self.record = record
        self.timeout = timeout
        self.grace_period = grace_period
        self._nodes = {n.name: n for n in nodes}
        self._backend = backend
        # The debugger's owner side (run/debug_relay.py), with its node helpers: kept one a
        # node where the backend can (SSH).
        self.debugger = DebugRelay(self, backend)
        self._listeners: list[JobListener] = []
        self._emit_lock = threading.Lock()
        self._status_lock = threading.Lock()
        self._status_final = False  # the finished job's status is written: no write after it
        self._state_lock = threading.RLock()
        self._handles: dict[str, ProcessHandle] = {}
        self._readers: dict[str, list[threading.Thread]] = {}
        self._evidence = StderrEvidence()
        # Why the store cannot be written (a full disk, a file made read-only), once it
        # failed: the job is stopped, failed, saying so, and not started again.
        self.store_problem: str | None = None
        self.metrics = MetricsSink(
            record, store_failed=self.store_failed, patterns=metrics_patterns or ()
        )
        told = [(DEBUG_MARK, self.debugger.on_pause_line), *([messages] if messages else [])]
        self._output = OutputPipeline(
            record,
            self._evidence,
            self._emit_lines,
            told,
            self.metrics,
            store_failed=self.store_failed,
        )
        self.processes = _process_states(plan)
        self._restarts = restarts
        self.attempt = 1  # counted from 1; DISTRUN_RESTART_COUNT is one less
        self.attempts: list[Attempt] = []  # the ended ones, oldest first
        self._attempt_started: float | None = None
        self._attempt_ran = False  # whether the current attempt started (not: cancelled first)
        self._restarting = False  # between a failed attempt's end and the next's start
        self._restart_wake = threading.Event()  # a stop cuts the restart delay short
        # The final state a stop asked for while processes started or the job restarted
        # (a process that has not reported its start cannot be stopped yet).
        self._pending_stop: str | None = None
        self.replaced: list[str] = []  # "node2 in place of node1", for each spare taken
        self.outputs_copied: list[str] = []  # run/outputs.py: what came from the nodes
        self._copy_stop = threading.Event()  # set: the copy of the outputs ends (a cancel)
        self._copying = False  # the outputs are being copied (a cancel still reaches it)
        self.state = "pending"
        self.created = time.time()
        self.started: float | None = None
        self.ended: float | None = None
        self._root_cause: RootCause | None = None
        self._message: str | None = None
        self._stopping = False
        self._stop_started: float | None = None  # when we began stopping (epoch seconds)
        self._starting = False
        # Set by the one thread that finishes the job: every rank's watcher may see the last
        # rank end, and only one may sweep, copy the outputs and tell the listeners.
        self._finishing = False
        self._done = threading.Event()
        self._result: JobResult | None = None
        # Called with an agent's line where the job's preload cannot be imported on its node
        # (set by whoever keeps the preload: run/launch.py forgets it then).
        self.on_preload_failed: Callable[[str], None] | None = None
        # Usage, stacks and stalls (run/rank_watch.py).
        self.watch = RankWatch(self, backend, stall_timeout, on_stall, self.debugger.any_paused)
        self._write_status()

    # -- public API ----------------------------------------------------------------------

    def start(self) -> Job:
        """Start every process, or none: a failure to start stops what had started."""
        with self._state_lock:
            if self.state != "pending":
                raise DistrunError(f"job {self.job_id} was already started")
            self.state = "running"
            self.started = time.time()
            self._starting = True  # a process that ends meanwhile must not end the job
        self._start_attempt()
        if self.timeout:
            timer = threading.Timer(self.timeout, self._on_timeout)
            timer.daemon = True
            timer.start()
        self.watch.start()
        threading.Thread(
            target=watch_requests,
            args=(
                self.record,
                self._done,
                self.cancel,
                self.watch.answer_stacks_request,
                self.debugger.answer_request,
            ),
            daemon=True,
            name=f"distrun-{self.job_id}-requests",
        ).start()
        return self

    def _start_attempt(self) -> None:
        """Start every process of the current plan, or none (see `start`); a stop asked for
        meanwhile is carried out once they all run."""
        self._attempt_started, self._attempt_ran = time.time(), True
        started: list[tuple[ProcessPlan, ProcessHandle]] = []
        try:
            self._backend.prepare(self.plan, list(self._nodes.values()))
            # On a failure, the handler below stops those that started.
            start_all(self._backend, self.plan.processes, self._nodes, self.grace_period, started)
            for _, handle in started:
                handle.confirm()  # every process reports it started before any is watched
            for proc, handle in started:
                self._attach(proc, handle)
        except KeyboardInterrupt:  # Ctrl-C, or a signal the front treats as one (SIGTERM)
            self._message = "interrupted while it started"
            self._abort_start(started, "cancelled")
            raise
        except BaseException as exc:
            which = f"attempt {self.attempt} " if self.attempt > 1 else ""
            self._message = f"{which}could not start: {exc or type(exc).__name__}"
            self._abort_start(started, "failed")
            raise
        finally:
            with self._state_lock:
                self._starting = False
            self._finish_when_all_gone()
        with self._state_lock:
            pending, self._pending_stop = self._pending_stop, None
        self._write_status()
        if pending:
            self._stop_all(pending)

    def _abort_start(self, started: list[tuple[ProcessPlan, ProcessHandle]], state: str) -> None:
        """Stop whatever started before the start failed elsewhere (or was interrupted);
        the job ends in `state`, with no attempt after (a start that fails is not the
        training failing, and would fail again)."""
        with self._state_lock:
            self._pending_stop = self._pending_stop or state
        self._stop_all(state)
        unattached = [(p, h) for p, h in started if p.name not in self._handles]
        for proc, _ in unattached:  # (an attached one's watcher sees it end)
            self.processes[proc.name].state = "stopped"
        kill_and_wait([handle for _, handle in unattached], self.grace_period + 5)

    def wait(self, timeout: float | None = None) -> JobResult | None:
        """The result once every process is gone; None if `timeout` seconds pass first.
        Blocking; safe from any thread."""
        if not self._done.wait(timeout):
            return None
        return self._result

    def cancel(self, reason: str = "cancelled by the user") -> None:
        """Stop every process (SIGTERM, then SIGKILL after the grace period). Idempotent and
        non-blocking (`wait` for the end); after the end, it stops a copy of the outputs."""
        self._request_stop("cancelled", reason)

    def end(self, reason: str) -> None:
        """Stop every process as the normal end of a job that serves until told to stop (an
        interactive Dask cluster): like `cancel`, but the job has succeeded."""
        self._request_stop("succeeded", reason)

    def fail(self, reason: str) -> None:
        """Stop every process: the job failed, for `reason` (a stall under on_stall=kill)."""
        self._request_stop("failed", reason)

    def store_failed(self, exc: OSError) -> None:
        """A write to the job's store failed: stop the job, failed, saying what could not
        be written and why (its ranks' lines still reach the listeners until they end;
        without this, a reader that stopped reading left its rank blocked on a full pipe,
        and a job whose status could not be written said it succeeded)."""
        with self._state_lock:
            if self.store_problem is not None:
                return
            where = exc.filename or str(self.record.path)
            self.store_problem = (
                f"the job store cannot be written ({where}: {exc.strerror or exc}); the job "
                "was stopped: free space there, or make it writable"
            )
        self._request_stop("failed", self.store_problem)

    def _copy_progress(self, text: str) -> None:
        """How far the copy of the outputs is, in the job's message (`jobs`, `inspect`)."""
        with self._state_lock:
            self._message = text
        self._write_status()

    def _request_stop(self, final_state: str, reason: str) -> None:
        """End the job in `final_state`: stop its processes now; or once those being
        started have all reported their start; or, between attempts, instead of the next.
        Once the processes ended, a cancel stops the copy of the outputs."""
        if self.state in FINAL_STATES:
            self._copy_stop.set()
        with self._state_lock:
            if (
                self.state in FINAL_STATES
                or self._pending_stop
                or (self._stopping and not self._restarting)
            ):
                return
            self._message = reason
            if self._starting or self._restarting:
                self._pending_stop = final_state
                self._restart_wake.set()
                return
        self._stop_all(final_state)

    def feed(self, name: str, data: bytes) -> None:
        """Bytes for the stdin of process `name` (planned with stdin); DistrunError if it
        does not run."""
        handle = self._handles.get(name)
        if handle is None or self.processes[name].state != "running":
            raise DistrunError(f"{self.processes[name].label} of job {self.job_id} is not running")
        handle.feed(data)

    def note(self, names: list[str], text: str) -> None:
        """A line of ours in the stored stdout of the named processes, while they print
        nothing (a session marks where each cell's output starts)."""
        by_name = {p.name: p for p in self.plan.processes}
        for name in names:
            self._output.note(by_name[name], text)

    def interrupt(self, names: list[str] | None = None) -> None:
        """SIGINT to the named processes (all by default) that still run."""
        for name, handle in list(self._handles.items()):
            if (names is None or name in names) and self.processes[name].state == "running":
                handle.interrupt()

    def collect(self, folder: str) -> dict[str, bytes]:
        """The files in `folder` of the job's directory on every node (name -> content)."""
        return collect_folder(self._backend, self._nodes.values(), self.job_id, folder)

    # -- what the debugger's relay reads (run/debug_relay.RelayedJob) --------------------

    @property
    def node_map(self) -> dict[str, Node]:
        return self._nodes

    @property
    def state_lock(self) -> threading.RLock:
        return self._state_lock

    @property
    def stopping_as(self) -> str | None:
        """The state the job ends in, while it is being stopped; else None."""
        return self._final_state if self._stopping else None

    def process_changed(self, state: ProcessState) -> None:
        self.tell("on_process", state)
        self._write_status()

    @property
    def summary(self) -> str:
        """Its header line (plan/summary.header_summary)."""
        return header_summary(self.plan, self._backend.name)

    @property
    def meters(self) -> Meters:
        """Each rank's CPU share and memory, as last reported: what the views read of a job
        they show, this one's or one they follow (run/follow.FollowedJob)."""
        return self.watch.meters

    @property
    def done(self) -> bool:
        return self._done.is_set()

    # -- processes -----------------------------------------------------------------------

    def _attach(self, proc: ProcessPlan, handle: ProcessHandle) -> None:
        self._handles[proc.name] = handle
        handle.on_usage = lambda sample, name=proc.name: self.watch.usage(name, sample)
        handle.on_preload_failed = self.on_preload_failed
        state = self.processes[proc.name]
        state.state, state.started = "running", time.time()
        self.tell("on_process", state)
        readers = [
            threading.Thread(
                target=self._output.read,
                args=(proc, handle, stream),
                daemon=True,
                name=f"distrun-{proc.name}-{stream}",
            )
            for stream in ("stdout", "stderr")
        ]
        self._readers[proc.name] = readers
        for thread in readers:
            thread.start()
        threading.Thread(
            target=self._watch, args=(proc, handle), daemon=True, name=f"distrun-{proc.name}"
        ).start()

    def _watch(self, proc: ProcessPlan, handle: ProcessHandle) -> None:
        code = handle.wait()
        # The whole stderr is read before the exit is judged (the agent's exit report is
        # its last line). But what a dead agent left running holds its pipes, perhaps for
        # ever: then the exit is judged after DRAIN_S (the agent died: a node lost), the
        # readers go on until the sweep ends what holds them.
        deadline = time.monotonic() + DRAIN_S
        for thread in self._readers.get(proc.name, []):
            thread.join(max(0.0, deadline - time.monotonic()))
        exit_code, sig = describe_exit(code)
        with self._state_lock:
            state = self.processes[proc.name]
            state.exit_code, state.signal, state.ended = exit_code, sig, time.time()
            state.paused = []  # killed while paused: no word came that it ran on
            state.note = handle.exit_note
            state.oom = handle.oom
            failed = code != 0
            if self._stopping:
                state.stopped_by_us = failed
                state.state = "stopped" if failed else "succeeded"
            elif failed:
                state.state = "failed"
                self._root_cause = self._evidence.root_cause(proc, state, self.record)
                self._stop_all("failed")  # under the lock: a second failure is not the cause
            else:
                # A service that ends cleanly on its own (a Dask scheduler told to shut
                # down) is fine; the job goes on while anything else runs.
                state.state = "succeeded"
                if self._only_services_left():
                    self._stop_all("succeeded")  # the client or chief is done: stop the rest
        self.tell("on_process", state)
        self._write_status()
        self._finish_when_all_gone()

    def _unclean_nodes(self) -> set[str]:
        """Nodes where a process ended without its agent reporting an exit code (never
        started, agent killed: it has a note saying so, whatever code its launcher, an srun,
        gave) or with 255 (connection lost): something may be left there."""
        return {s.node for s in self.processes.values() if s.exit_code in (None, 255) or s.note}

    def _only_services_left(self) -> bool:
        running = [
            p for p in self.plan.processes if self.processes[p.name].state in ("pending", "running")
        ]
        ran_something = any(not p.service for p in self.plan.processes)
        return ran_something and bool(running) and all(p.service for p in running)

    # -- stopping ------------------------------------------------------------------------

    def _on_timeout(self) -> None:
        self._request_stop("timed_out", f"timed out after {self.timeout:g} s")

    def _stop_all(self, final_state: str) -> None:
        """Move to `final_state`, then stop what still runs: SIGTERM, grace, SIGKILL."""
        with self._state_lock:
            if self._stopping:
                return
            self._stopping = True
            self._stop_started = time.time()
            self._final_state = final_state
            never_started = self.state == "pending"
            running = [
                (name, h)
                for name, h in self._handles.items()
                if self.processes[name].state == "running"
            ]
        if never_started:  # stopped before it started (an interrupt in between): it ends now
            self._finish_when_all_gone()
            return
        if running:
            names = [name for name, _ in running]

            def all_ended() -> bool:
                return all(self.processes[name].state != "running" for name in names)

            handles = [handle for _, handle in running]
            threading.Thread(
                target=escalate, args=(handles, self.grace_period, all_ended), daemon=True
            ).start()
            elsewhere = self.plan.mpi_daemon_nodes()
            if elsewhere:  # their ranks hear it from us, not a second before SIGKILL
                threading.Thread(
                    target=self._backend.terminate_ranks,
                    args=(self.job_id, elsewhere),
                    daemon=True,
                    name=f"distrun-{self.job_id}-term",
                ).start()

    def _finish_when_all_gone(self) -> None:
        with self._state_lock:
            if self._finishing or self._starting or self._restarting:
                return
            if any(p.state == "running" for p in self.processes.values()):
                return
            final = self._final_state if self._stopping else "succeeded"
            for state in self.processes.values():
                if state.state == "pending":
                    state.state = "stopped"  # never started: a start elsewhere failed
            if self._root_cause:
                final = "failed"
                ended = [(p, self.processes[p.name]) for p in self.plan.processes]
                self._root_cause = self._evidence.culprit(
                    ended, self._root_cause, self.record, self._stop_started, self.grace_period
                )
                culprit = self.processes[self._root_cause.process]
                if culprit.state == "stopped":  # it had failed before our stop reached it
                    culprit.state, culprit.stopped_by_us = "failed", False
            if final == "failed" and self._may_restart():
                previous = self._end_attempt()
            else:
                previous = None
                self.state = final
                self.ended = time.time()
                self._finishing = True
        if previous is not None:
            self._begin_restart(previous)
            return
        self.watch.stop()
        self.debugger.close()  # before the sweep: its helpers end with their input
        self._backend.sweep(self.job_id, self._unclean_nodes())  # nothing survives the job
        # Before the nodes are given back (a Ray actor, a Slurm allocation holds them). The
        # outcome is written first: an owner killed during a long copy leaves it, not "lost".
        message = self._message  # the job's own, while a long copy says how far it is
        self._copying = bool(self.plan.outputs)
        if self._copying:
            self._write_status()
        self.outputs_copied = collect_outputs(
            self.plan,
            self._nodes.values(),
            self._backend,
            self.record.path,
            stop=self._copy_stop,
            progress=self._copy_progress,
        )
        self._message, self._copying = message, False
        self._backend.release()
        self._result = JobResult(
            job_id=self.job_id,
            state=self.state,
            processes=list(self.processes.values()),
            root_cause=self._root_cause,
            store_path=str(self.record.path),
            message=self._message,
            started=self.started,
            ended=self.ended,
            attempts=list(self.attempts),
            replaced=list(self.replaced),
            last_attempt_ran=self._attempt_ran,
        )
        self._write_status(final=True)
        self.tell("on_finish", self._result)
        self.debugger.wait_idle(ANSWER_GRACE_S)  # an answer on its way (a `c` that let the
        # job end) goes first
        self._done.set()

    # -- restarts ------------------------------------------------------------------------

    def _may_restart(self) -> bool:
        """Whether a failed attempt is followed by another (under the state lock)."""
        return (
            self._restarts is not None
            and self.attempt <= self._restarts.limit
            and self._pending_stop is None
            and self.store_problem is None  # it would fail the same way
        )

    def _end_attempt(self) -> Attempt:
        """Keep the failed attempt's cause and move to "restarting" (under the state lock)."""
        ended = Attempt(
            self.attempt, self._attempt_started, time.time(), self._root_cause, self._message
        )
        self.attempts.append(ended)
        self.attempt += 1
        self._attempt_ran = False
        self._root_cause = None
        self._restarting = True
        self.state = "restarting"
        delay = self._restarts.delay if self._restarts else 0
        self._message = (
            f"attempt {ended.number} failed; attempt {self.attempt} of "
            f"{self.attempts_allowed} starts in {delay:g} s"
        )
        return ended

    @property
    def attempts_allowed(self) -> int:
        return 1 + (self._restarts.limit if self._restarts else 0)

    def _begin_restart(self, previous: Attempt) -> None:
        """The failed attempt is over: clear its nodes, tell the listeners, and start the
        next one after the delay, in a thread of its own."""
        self._backend.sweep(self.job_id, self._unclean_nodes())  # nothing of it survives
        self._write_status()
        self.tell("on_attempt", self.attempt, self.attempts_allowed, previous)
        threading.Thread(
            target=self._restart, daemon=True, name=f"distrun-{self.job_id}-restart"
        ).start()

    def _restart(self) -> None:
        assert self._restarts is not None
        self._restart_wake.wait(self._restarts.delay)
        next_plan, failure = None, None
        if not self._restart_wake.is_set():
            try:
                next_plan, nodes = self._restarts.replan(
                    [self._nodes[n["name"]] for n in self.plan.nodes], self.attempt - 1
                )
            except Exception as exc:  # an unreachable node, no free port: the job ends
                failure = f"attempt {self.attempt} could not start: {exc or type(exc).__name__}"
        with self._state_lock:
            if next_plan is None or self._pending_stop:
                self._restarting = False
                self._final_state = self._pending_stop or "failed"
                self._message = failure or self._message
                next_plan = None
            else:
                self._begin_attempt(next_plan, nodes)
        if next_plan is None:
            self._finish_when_all_gone()
            return
        with contextlib.suppress(OSError):
            self.record.write_plan(next_plan.to_dict())
        for proc in next_plan.processes:  # where this attempt's lines start in each log
            self._output.note(proc, attempt_marker(self.attempt))
        for state in self.processes.values():
            self.tell("on_process", state)
        self._write_status()
        with contextlib.suppress(Exception):  # it says why, and the job has ended
            self._start_attempt()

    def _begin_attempt(self, next_plan: LaunchPlan, nodes: list[Node]) -> None:
        """Forget the failed attempt's processes and take the next plan and its nodes
        (state lock held)."""
        self.replaced += [
            f"{new['name']} in place of {old['name']}"
            for old, new in zip(self.plan.nodes, next_plan.nodes, strict=True)
            if old["name"] != new["name"]
        ]
        self._nodes = {node.name: node for node in nodes}
        self.plan = next_plan
        self.processes = _process_states(next_plan)
        self._handles, self._readers = {}, {}
        self._evidence = self._output.evidence = StderrEvidence()
        self._message = None
        self._stopping, self._stop_started = False, None
        self.watch.new_attempt()
        self._restarting, self._starting = False, True
        self.state = "running"

    # -- reporting -----------------------------------------------------------------------

    def _emit_lines(self, batch: list[OutputLine]) -> None:
        self.watch.output()
        self.tell("on_lines", batch)

    def status_changed(self) -> None:
        self._write_status()

    def status(self) -> dict:
        with self._state_lock:
            return {
                "job_id": self.job_id,
                "name": self.name,
                "type": self.plan.job_type,
                "state": self.state,
                "created": self.created,
                "started": self.started,
                "ended": self.ended,
                "nodes": [n["name"] for n in self.plan.nodes],
                "world_size": self.plan.world_size,
                "attempt": self.attempt,
                "attempt_started": self._attempt_started,
                "attempt_ran": self._attempt_ran,
                "attempts_allowed": self.attempts_allowed,
                "attempts": [attempt.to_dict() for attempt in self.attempts],
                "replaced": self.replaced,
                **owner_fields(),
                "processes": {n: s.to_dict() for n, s in self.processes.items()},
                "root_cause": self._root_cause.to_dict() if self._root_cause else None,
                "message": self._message,
                "stalled": self.watch.stall_notice,
                "outputs_copied": self.outputs_copied,
                "copying_outputs": self._copying,
            }

    def _write_status(self, final: bool = False) -> None:
        # Snapshot and write under one lock: a stale snapshot must never be written last.
        # Nor any after the job's final one: a thread that saw a rank end may come to write
        # after the job finished and its owner went on (and rewrite what it found there).
        try:
            with self._status_lock:
                if self._status_final:
                    return
                self.record.write_status(self.status())
                self._status_final = final
        except OSError as exc:  # outside the lock: the stop it asks for writes the status
            self.store_failed(exc)


def _process_states(plan: LaunchPlan) -> dict[str, ProcessState]:
    """Every process of `plan`, pending."""
    return {
        p.name: ProcessState(
            name=p.name, label=p.label, node=p.node, host=p.host, role=p.role, rank=p.rank
        )
        for p in plan.processes
    }
