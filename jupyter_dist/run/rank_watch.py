"""What a running job learns of its ranks while they run, beside their output: each
process's usage (its agent's samples, as `meters` and in the store), its Python stacks (read
on the nodes, on request), and whether the job stalled (no line and no CPU for the stall
timeout, diagnose/stall.py), with the notice and the stacks taken then. One `RankWatch` a
job, which `Job` holds for its whole life, restarts included (`job.watch`).

Contract:

- It reads what it needs of the job through `WatchedJob`, and acts on it through three
  calls only: `status_changed` (the notice goes into status.json), `fail(reason)` (a stall
  under `on_stall="kill"`), `store_failed(exc)` (a usage sample could not be stored); the
  job's listeners hear `on_stall(notice, summary)` through `tell`.
- `usage(name, sample)`, `output()`: what the job's agents and output pipeline report, on
  their threads; never raise.
- `stacks(...)`: every Python stack of the running job, stored with it; a DistrunError of
  one line once it ended. `answer_stacks_request(method, request_id)` answers another
  process's request (run/requests.request_stacks) into the store, never raising.
- `start()`, `stop()`: the stall watch's thread; `new_attempt()` forgets a stall notice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from jupyter_dist.backends.base import Backend
from jupyter_dist.diagnose.meters import STORE_EVERY_S, Meters
from jupyter_dist.diagnose.stacks import StackDump, take_stacks
from jupyter_dist.diagnose.stall import StallWatch
from jupyter_dist.errors import DistrunError
from jupyter_dist.events import FINAL_STATES, state_words
from jupyter_dist.nodes import Node
from jupyter_dist.store import JobRecord


class WatchedJob(Protocol):
    """What the watch reads of its job, and asks of it (run/job.py's Job has each)."""

    job_id: str
    record: JobRecord
    state: str

    @property
    def node_map(self) -> dict[str, Node]: ...  # by node name, the current attempt's

    @property
    def state_lock(self) -> threading.RLock: ...

    @property
    def stopping_as(self) -> str | None: ...  # the state it ends in, while it is stopped

    def status_changed(self) -> None: ...  # status.json written again

    def fail(self, reason: str) -> None: ...  # stopped, failed, saying `reason`

    def store_failed(self, exc: OSError) -> None: ...

    def tell(self, event: str, *args: object) -> None: ...  # to every listener


class RankWatch:
    """Usage, stacks and stalls, for one job (see the module's contract). `stall_timeout`
    0: no stall watch; `on_stall`: "warn" or "kill"; `paused()`: whether a rank waits in
    its debugger (the others then wait for it: no stall)."""

    def __init__(
        self,
        job: WatchedJob,
        backend: Backend,
        stall_timeout: float,
        on_stall: str,
        paused: Callable[[], bool],
    ) -> None:
        self._job = job
        self._backend = backend
        self._paused = paused
        self.on_stall = on_stall
        self.meters = Meters()  # each rank's CPU share and memory, as last reported
        self.last_usage: dict[str, dict] = {}  # process name -> its agent's last sample
        self._usage_stored: dict[str, float] = {}  # process name -> when last written
        self._usage_lock = threading.Lock()
        self.stall_notice: str | None = None
        # Whether quiet would be a stall now: a session says no between cells.
        self.stall_watching: Callable[[], bool] = lambda: True
        self._stall = (
            StallWatch(stall_timeout, self._stalled, self._resumed, lambda: self.stall_watching())
            if stall_timeout
            else None
        )

    def start(self) -> None:
        if self._stall is not None:
            self._stall.start(f"distrun-{self._job.job_id}-stall")

    def stop(self) -> None:
        if self._stall is not None:
            self._stall.stop()

    def new_attempt(self) -> None:
        self.stall_notice = None

    # -- what the ranks report -------------------------------------------------------------

    def usage(self, name: str, sample: dict) -> None:
        """Process `name`'s agent's usage sample: the meters, the store every STORE_EVERY_S
        per process, and the stall watch (CPU is activity)."""
        self.last_usage[name] = sample
        readings = self.meters.update(name, sample)
        now = time.monotonic()
        with self._usage_lock:
            if now - self._usage_stored.get(name, -STORE_EVERY_S) >= STORE_EVERY_S:
                self._usage_stored[name] = now
                try:
                    self._job.record.append_usage({"t": round(time.time(), 2), "p": name, **sample})
                except OSError as exc:
                    self._job.store_failed(exc)
        if self._stall is not None:
            self._stall.usage(name, readings)

    def output(self) -> None:
        """A rank printed: activity."""
        if self._stall is not None:
            self._stall.output()

    # -- stacks ----------------------------------------------------------------------------

    def stacks(
        self, method: str = "auto", reason: str = "asked", request: str | None = None
    ) -> StackDump:
        """Every Python stack of the running job, read on its nodes (diagnose/stacks.py) and
        stored with it (tagged with the `request` it answers); DistrunError once the job
        ended."""
        job = self._job
        if job.state != "running":
            raise DistrunError(
                f"job {job.job_id} {state_words(job.state)}; stacks are read from a running job"
            )
        nodes = list(job.node_map.values())
        dump = take_stacks(self._backend.run_on_node, nodes, job.job_id, method)
        dump.reason, dump.request = reason, request
        job.record.save_stacks(dump.to_dict())
        return dump

    def answer_stacks_request(self, method: str, request_id: str) -> None:
        """Answer another process's request (run/requests.request_stacks) in the store."""
        try:
            self.stacks(method, request=request_id)
        except Exception as exc:  # the asker gets the reason, not a silent timeout
            failed = StackDump(
                self._job.job_id, time.time(), [], problems=[str(exc)], request=request_id
            )
            self._job.record.save_stacks(failed.to_dict())

    # -- stalls ----------------------------------------------------------------------------

    def _stalled(self, quiet: float) -> None:
        """Quiet for too long: say so with the stacks taken now; stop it if asked to. Not
        while a rank waits in its debugger: the others then wait for it, as they should
        (the watch starts again once something runs)."""
        if self._paused():  # (the nodes could not be asked: a stall it is)
            return
        notice = f"looks stuck: no rank printed or used CPU for {quiet:.0f} s"
        try:
            summary = [group.summary() for group in self.stacks(reason="stalled").groups()]
        except Exception as exc:  # the notice matters more than its stacks
            summary = [f"stacks could not be read: {exc}"]
        job = self._job
        with job.state_lock:
            if job.state in FINAL_STATES or job.stopping_as is not None:
                return
            self.stall_notice = notice
        job.status_changed()
        job.tell("on_stall", notice, summary)
        if self.on_stall == "kill":
            job.fail(f"stopped because it {notice}" + (f"; {summary[0]}" if summary else ""))

    def _resumed(self) -> None:
        with self._job.state_lock:
            # Its last words as it is stopped are not news, and a stall never said (a
            # paused rank's) is not taken back.
            if self._job.stopping_as is not None or self.stall_notice is None:
                return
            self.stall_notice = None
        self._job.status_changed()
        self._job.tell("on_stall", None, [])
