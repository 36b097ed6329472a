"""Stopping a job's processes from outside the state machine: the escalation from SIGTERM to
SIGKILL, and the watch for the requests other processes leave in the store (a cancel, a
stacks dump)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from jupyter_dist.backends.base import ProcessHandle
from jupyter_dist.run.requests import POLL_SECONDS, cancel_requested, stacks_requested
from jupyter_dist.store import JobRecord


def escalate(handles: list[ProcessHandle], grace: float, all_ended: Callable[[], bool]) -> None:
    """SIGTERM every handle, then SIGKILL the ones still running once `grace` seconds pass
    (`all_ended` says whether any still is). Never raises: a handle already gone is fine."""
    for handle in handles:
        with contextlib.suppress(Exception):
            handle.terminate()
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if all_ended():
            return
        time.sleep(0.05)
    for handle in handles:
        with contextlib.suppress(Exception):
            handle.kill()


def watch_requests(
    record: JobRecord,
    done: threading.Event,
    cancel: Callable[[str], None],
    stacks: Callable[[str, str], None],
) -> None:
    """Until `done`, act on what other processes ask (run/requests.py): `cancel(reason)` once,
    `stacks(method, request_id)` for each stacks request (in a thread of its own, so that a
    slow node does not hold up a cancel)."""
    while not done.wait(POLL_SECONDS):
        request = stacks_requested(record)
        if request is not None:
            threading.Thread(
                target=stacks, args=(request["method"], request["id"]), daemon=True,
                name=f"distrun-{record.job_id}-stacks",
            ).start()  # fmt: skip
        reason = cancel_requested(record)
        if reason is not None:
            cancel(reason)
            return
