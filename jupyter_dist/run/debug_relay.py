"""The owner's side of the debugger (node_side/debugger.py is the rank's, diagnose/debug.py
the node helpers and the words): one `DebugRelay` a job, which `Job` holds for its whole
life, restarts included.

Contract:

- It reads what it needs of the job through `RelayedJob` (the job's id, state, current
  plan, nodes and process states, which a restart replaces), and tells it of a changed
  process state through `process_changed`; the job never reaches inside it.
- `on_pause_line(proc, message)`: the output pipeline's handler of the line a rank's
  debugger prints as it pauses or runs on (MARK): that process's `paused` list, then the
  job's listeners and status. Never raises.
- `paused()`, `interrupt`, `send`, `cast`: what a front asks (diagnose/debug.py asks the
  nodes), each a DistrunError of one line where it cannot be done (the job not running,
  no such rank, not paused, several paused processes and no pid). Thread-safe: fronts'
  requests come on threads of their own.
- `answer_request(request)`: a front's request from the store (run/requests.request_debug),
  answered into the store, never raising; `wait_idle(seconds)` blocks until no answer is
  on its way (the job's end waits, so that a `c` that lets the job end is answered).
- `any_paused()`: whether a rank waits in its debugger (the stall watch leaves it alone).
- `close()`: the node helpers kept for its requests end (before the job's sweep).
  Idempotent.
"""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from jupyter_dist.backends.base import Backend
from jupyter_dist.diagnose.debug import (
    DEBUG_MARK,
    NodeHelpers,
    NotPaused,
    PausedRank,
    check_command,
    interrupt,
    pause_event,
    paused_ranks,
    rank_not_paused,
    send,
)
from jupyter_dist.errors import DistrunError
from jupyter_dist.events import FINAL_STATES, ProcessState, exit_text, state_words
from jupyter_dist.nodes import Node
from jupyter_dist.plan.model import LaunchPlan, ProcessPlan
from jupyter_dist.run.requests import answer_debug
from jupyter_dist.store import JobRecord

MARK = DEBUG_MARK  # what starts a rank debugger's line to the owner, on the rank's stdout


class RelayedJob(Protocol):
    """What the relay reads of its job (run/job.py's Job has each)."""

    job_id: str
    record: JobRecord
    plan: LaunchPlan  # the current attempt's
    state: str
    processes: dict[str, ProcessState]  # by process name, the current attempt's

    @property
    def node_map(self) -> dict[str, Node]: ...  # by node name, the current attempt's

    @property
    def state_lock(self) -> threading.RLock: ...  # held while `processes` change

    @property
    def stopping_as(self) -> str | None: ...  # the state it ends in, while it is stopped

    def process_changed(self, state: ProcessState) -> None: ...  # listeners, status.json


class DebugRelay:
    """The debugger's requests, for one job (see the module's contract)."""

    def __init__(self, job: RelayedJob, backend: Backend) -> None:
        self.job = job
        # The node helpers that answer on the nodes: kept one a node where the backend can
        # (SSH), run once a request elsewhere.
        self._helpers = NodeHelpers(backend.run_on_node, backend.keep_on_node)
        self._busy = 0  # requests being answered
        self._idle = threading.Condition()

    def any_paused(self) -> bool:
        """Whether a rank waits in its debugger (asked of the nodes); False where they
        cannot be asked."""
        with contextlib.suppress(Exception):
            return bool(self.paused()[0])
        return False

    def wait_idle(self, seconds: float) -> None:
        """Until no request is being answered, `seconds` at most."""
        with self._idle:
            self._idle.wait_for(lambda: self._busy == 0, seconds)

    def close(self) -> None:
        """The kept node helpers end (each with its input). Idempotent; never raises."""
        self._helpers.close()

    def _refuse_unless_running(self) -> None:
        """The debugger reaches a running job's ranks only: DistrunError in one line else."""
        job = self.job
        if job.state != "running":
            raise DistrunError(
                f"job {job.job_id} {state_words(job.state)}; only a running job's ranks pause"
            )

    def paused(self) -> tuple[list[PausedRank], list[str]]:
        """The ranks waiting in their debugger (diagnose/debug.py), and one line per node
        that could not be asked; DistrunError once the job ended."""
        self._refuse_unless_running()
        found, problems = paused_ranks(
            self._helpers, list(self.job.node_map.values()), self._job_dirs()
        )
        return found, problems

    def on_pause_line(self, proc: ProcessPlan, message: str) -> None:
        """A rank's debugger paused (at a breakpoint, a step, an error) or let it run on:
        its process's state says where it waits (status.json, the views); where a rank
        paused is where a command goes first."""
        event = pause_event(message, proc.node)
        if event is None:
            return
        with self.job.state_lock:
            state = self.job.processes.get(proc.name)
            if state is None:
                return
            pid = event if isinstance(event, int) else event.pid
            paused = [p for p in state.paused if p.get("pid") != pid]
            if isinstance(event, PausedRank):
                paused.append(event.to_dict())
            if paused == state.paused:
                return
            state.paused = paused
        self.job.process_changed(state)

    def interrupt(self, rank: int, timeout: float = 5.0) -> PausedRank | None:
        """Pause rank `rank` where it runs (diagnose/debug.interrupt): where it paused, or
        None where it was signalled but had not paused within `timeout`. DistrunError in
        one line where the job has no such rank running, or it cannot be paused."""
        self._refuse_unless_running()
        self._check_rank(rank)
        # The node of its own process, where it has one; else (torchrun's, mpirun's
        # workers) each node that runs some of the job's ranks.
        own = [p.node for p in self.job.plan.processes if p.rank == rank]
        names = own or list(dict.fromkeys(p.node for p in self.job.plan.processes))
        job_dirs, problems = self._job_dirs(), []
        for name in names:
            if name not in job_dirs:
                continue
            try:
                paused = interrupt(
                    self._helpers,
                    self.job.node_map[name],
                    job_dirs[name],
                    self.job.job_id,
                    rank,
                    timeout,
                )
            except NotPaused as exc:
                problems.append(f"{name}: {exc}")
                continue
            return paused
        raise DistrunError(
            f"rank {rank} of job {self.job.job_id} cannot be paused: "
            + ("; ".join(problems) or "no node runs it")
        )

    def _check_rank(self, rank: int) -> None:
        """DistrunError in one line where the job has no rank `rank`."""
        if not 0 <= rank < self.job.plan.world_size:
            raise DistrunError(
                f"job {self.job.job_id} has ranks 0 to {self.job.plan.world_size - 1}, not {rank}"
            )

    def send(self, rank: int, command: str, timeout: float = 30.0, pid: int | None = None) -> dict:
        """`command` to paused rank `rank`'s pdb (its process `pid`, where the rank has
        several paused: a forked child's, a launcher's): {"answer", "paused", "state"}
        (diagnose/debug.py). DistrunError in one line where the job has no such rank, it is
        not paused, it has several paused processes and no `pid` says which, or the command
        is empty."""
        command = check_command(command)
        self._check_rank(rank)
        # Where the rank's debugger said it paused is where it is asked first (one helper
        # on one node a command, no listing of them all); else every node is asked.
        for found in (self._told_paused(), None):
            if found is None:
                found, _ = self.paused()
            targets = [p for p in found if p.rank == rank and pid in (None, p.pid)]
            if len(targets) > 1:
                pids = " and ".join(str(p.pid) for p in sorted(targets, key=lambda p: p.pid))
                raise DistrunError(
                    f"rank {rank} of job {self.job.job_id} has {len(targets)} paused processes "
                    f"(pids {pids}): give --pid PID"
                )
            if targets:
                try:
                    return self._send(targets[0], command, timeout)
                except NotPaused:
                    continue  # it ran on since it said so: ask the nodes
        if pid is not None:
            raise DistrunError(f"rank {rank} of job {self.job.job_id} has no paused process {pid}")
        raise rank_not_paused(self.job.job_id, rank, found)

    def _told_paused(self) -> list[PausedRank]:
        """The paused processes their debuggers told of (a line each, on their stdout)."""
        with self.job.state_lock:
            return [PausedRank.from_dict(p) for s in self.job.processes.values() for p in s.paused]

    def cast(self, ranks: list[int] | None, command: str, timeout: float = 30.0) -> list[dict]:
        """`command` to each paused process of `ranks` (None: every paused one) at once:
        one {"rank", "pid", "answer", "paused", "state"} per process, by rank. DistrunError
        in one line, before anything is sent, where one of them is not paused or none is."""
        command = check_command(command)
        for rank in ranks or ():
            self._check_rank(rank)
        # Ranks named whose pauses their debuggers have told are asked at once; `all`, or
        # a rank not known paused, asks every node first.
        found = [p for p in self._told_paused() if p.rank is not None]
        if ranks is None or any(rank not in {p.rank for p in found} for rank in ranks):
            found = [p for p in self.paused()[0] if p.rank is not None]
        if ranks is None:
            ranks = sorted({p.rank for p in found})
            if not ranks:
                raise DistrunError(f"no rank of job {self.job.job_id} is paused")
        missing = [rank for rank in ranks if rank not in {p.rank for p in found}]
        if missing:
            raise rank_not_paused(self.job.job_id, missing[0], found)
        targets = sorted((p for p in found if p.rank in ranks), key=lambda p: (p.rank, p.pid))

        def one(target: PausedRank) -> dict:
            who = {"rank": target.rank, "pid": target.pid}
            try:
                return {**who, **self._send(target, command, timeout)}
            except DistrunError as exc:  # it ran on meanwhile: its line, the others' answers
                return {**who, "error": str(exc)}

        with ThreadPoolExecutor(max_workers=min(16, len(targets))) as pool:
            return list(pool.map(one, targets))

    def _send(self, target: PausedRank, command: str, timeout: float) -> dict:
        node = self.job.node_map[target.node]
        answer = send(self._helpers, node, self._job_dirs()[node.name], target, command, timeout)
        if answer["state"] == "ended":  # how: its exit as the job saw it, and the job's end
            answer |= self._how_it_ended(target.rank)
        return answer

    def _how_it_ended(self, rank: int | None, wait: float = 3.0) -> dict:
        """{"exit": "exited with code 3"} for the process of `rank` once the job saw it end
        (within `wait`), and {"job": state} where the job itself is over or stopping."""
        name = next((p.name for p in self.job.plan.processes if p.rank == rank), None)
        found: dict = {}
        deadline = time.monotonic() + wait
        while name is not None and time.monotonic() < deadline:
            state = self.job.processes[name]
            if state.ended is not None:
                found["exit"] = exit_text(state.exit_code, state.signal, verb=True)
                break
            time.sleep(0.05)
        if self.job.stopping_as or self.job.state in FINAL_STATES:
            found["job"] = self.job.stopping_as or self.job.state
        return found

    def _job_dirs(self) -> dict[str, str]:
        """Each node's folder of this job (DISTRUN_JOB_DIR there)."""
        return {
            p.node: p.env["DISTRUN_JOB_DIR"]
            for p in self.job.plan.processes
            if p.env.get("DISTRUN_JOB_DIR")
        }

    def answer_request(self, request: dict) -> None:
        """Answer another process's debugger request (run/requests.request_debug). The job
        does not end (nor its owner exit) with an answer on its way (ANSWER_GRACE_S)."""
        with self._idle:
            self._busy += 1
        try:
            self._answer(request)
        finally:
            with self._idle:
                self._busy -= 1
                self._idle.notify_all()

    def _answer(self, request: dict) -> None:
        try:
            if request.get("action") in ("send", "interrupt"):
                rank = request.get("rank")
                if not isinstance(rank, int) or isinstance(rank, bool):
                    raise DistrunError(f"a rank is a number, not {rank!r}")
            if request.get("action") == "cast":
                ranks = request.get("ranks")
                if ranks is not None and (
                    not isinstance(ranks, list)
                    or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks)
                ):
                    raise DistrunError(f"ranks are a list of numbers, not {ranks!r:.80}")
                answer = {
                    "answers": self.cast(
                        ranks,
                        str(request.get("command", "")),
                        float(request.get("timeout") or 30.0),
                    )
                }
            elif request.get("action") == "send":
                pid = request.get("pid")
                if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool)):
                    raise DistrunError(f"a pid is a number, not {pid!r:.40}")
                answer = self.send(
                    rank,
                    str(request.get("command", "")),
                    float(request.get("timeout") or 30.0),
                    pid,
                )
            elif request.get("action") == "interrupt":
                paused = self.interrupt(rank, float(request.get("timeout") or 5.0))
                answer = {"paused": paused.to_dict() if paused else None}
            else:
                found, problems = self.paused()
                answer = {"paused": [p.to_dict() for p in found], "problems": problems}
        except DistrunError as exc:
            answer = {"error": str(exc)}
        except Exception as exc:  # the asker gets the reason, not a silent timeout
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        answer_debug(self.job.record, request["id"], answer)
