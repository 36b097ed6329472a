"""Stall detection: a job in which no rank printed and no rank used CPU for a while looks
stuck (one rank waiting for data, the others waiting for it in a collective), whereas a rank
computing, or a rank waiting while others compute, is work going on.

`StallWatch` is fed by the job: `output()` for every batch of lines, `usage(process,
readings)` with the CPU shares each usage report of a process's node agent gave
(diagnose/meters.py, from node_side/agent.py `--usage`; GPU utilisation counts as work too,
where nvidia-smi reads it). A thread of its own looks every few
seconds; once the job has been quiet for `timeout` seconds while `watching()` says quiet
would be a stall (a session between cells, a Dask cluster waiting for work are quiet by
design), it calls `on_stall(quiet_seconds)` once, and `on_resume()` when activity comes
back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from jupyter_dist.diagnose.meters import Reading

DEFAULT_STALL_TIMEOUT_S = 300
ACTIONS = ("warn", "kill")
# The share of one core a rank must use to count as working: above what an idle Python
# rank's housekeeping (gloo's keep-alives, a thread polling) costs.
BUSY_CPU_SHARE = 0.05
# The utilisation of its GPUs (where nvidia-smi reads it) that counts as working too: a rank
# that waits for its kernels without spinning a core (blocking sync) is computing.
BUSY_GPU_PERCENT = 5.0


class StallWatch:
    def __init__(
        self,
        timeout: float,
        on_stall: Callable[[float], None],
        on_resume: Callable[[], None],
        watching: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout = timeout
        self._on_stall = on_stall
        self._on_resume = on_resume
        self._watching = watching
        self._clock = clock
        self._lock = threading.Lock()
        self._active_at = clock()  # the last time anything printed or computed
        self.stalled = False
        self._stop = threading.Event()

    def start(self, name: str) -> None:
        """Watch from now (the time a job waited for its nodes is not quiet)."""
        with self._lock:
            self._active_at = self._clock()
        threading.Thread(target=self._run, daemon=True, name=name).start()

    def stop(self) -> None:
        self._stop.set()

    def output(self) -> None:
        """Something printed."""
        self._activity()

    def usage(self, process: str, readings: Mapping[str, Reading]) -> None:
        """The readings one usage report of `process`'s agent gave (Meters.update): its
        ranks' CPU shares decide (a launcher polling them is not work); a report without
        ranks, the share of the process's whole tree."""
        ranks = [r for key, r in readings.items() if key != process]
        shares = ranks or [r for key, r in readings.items() if key == process]
        if any(r.cpu >= BUSY_CPU_SHARE * 100 or _gpu_busy(r) for r in shares):
            self._activity()

    def quiet_for(self) -> float:
        with self._lock:
            return self._clock() - self._active_at

    def _activity(self) -> None:
        with self._lock:
            self._active_at = self._clock()
            resumed, self.stalled = self.stalled, False
        if resumed:
            self._on_resume()

    def check(self) -> None:
        """Flag a stall if the job has been quiet long enough (the thread calls it)."""
        if not self._watching():
            self._activity()  # quiet by design: the watch starts again from now
            return
        quiet = self.quiet_for()
        with self._lock:
            flag = quiet >= self.timeout and not self.stalled
            if flag:
                self.stalled = True
        if flag:
            self._on_stall(quiet)

    def _run(self) -> None:
        interval = min(5.0, max(0.5, self.timeout / 10))
        while not self._stop.wait(interval):
            self.check()


def describe_stall(notice: str | None, summary: list[str]) -> str:
    """The news as text (the CLI, the text view): the notice and the grouped stacks taken
    with it, or that the job moves again."""
    if notice is None:
        return "The job moves again.\n"
    groups = "".join(f"  {line}\n" for line in summary)
    return f"The job {notice}. Every rank's stack, now:\n{groups}"


def _gpu_busy(reading: Reading) -> bool:
    percent = reading.gpu[0] if reading.gpu else None
    return percent is not None and percent >= BUSY_GPU_PERCENT
