"""Stopping a job's processes from outside the state machine: the escalation from SIGTERM to
SIGKILL, a kill that waits a bounded time, and the watch for the requests other processes
leave in the store (a cancel, a stacks dump, the debugger's)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from jupyter_dist.backends.base import ProcessHandle
from jupyter_dist.run.requests import (
    POLL_SECONDS,
    cancel_requested,
    debug_requests,
    stacks_requested,
)
from jupyter_dist.store import JobRecord

DEBUG_POLL_SECONDS = 0.02  # a glob of the job's folder: cheap, and a user waits on each


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


def kill_and_wait(handles: list[ProcessHandle], limit: float) -> None:
    """SIGKILL every handle, then wait for their ends, at most `limit` seconds in all: what
    never answered as an agent (a node's `python` that is not Python) cannot hear the
    kill, and is left to the sweep. Never raises."""
    waiters = []
    for handle in handles:
        with contextlib.suppress(Exception):
            handle.kill()
        waiter = threading.Thread(target=_quiet_wait, args=(handle,), daemon=True)
        waiter.start()
        waiters.append(waiter)
    deadline = time.monotonic() + limit
    for waiter in waiters:
        waiter.join(max(0.0, deadline - time.monotonic()))


def _quiet_wait(handle: ProcessHandle) -> None:
    with contextlib.suppress(Exception):
        handle.wait()


def watch_requests(
    record: JobRecord,
    done: threading.Event,
    cancel: Callable[[str], None],
    stacks: Callable[[str, str], None],
    debug: Callable[[dict], None] = lambda _request: None,
) -> None:
    """Until `done`, act on what other processes ask (run/requests.py): `cancel(reason)` once,
    `stacks(method, request_id)` for each stacks request and `debug(request)` for each
    debugger request (each in a thread of its own, so that a slow node does not hold up a
    cancel). A debugger request is looked for more often: a user waits on each command."""
    polls = 0
    while not done.wait(DEBUG_POLL_SECONDS):
        for request in debug_requests(record):
            threading.Thread(
                target=debug, args=(request,), daemon=True, name=f"distrun-{record.job_id}-debug"
            ).start()
        polls += 1
        if polls % round(POLL_SECONDS / DEBUG_POLL_SECONDS):
            continue
        request = stacks_requested(record)
        if request is not None:
            threading.Thread(
                target=stacks,
                args=(request["method"], request["id"]),
                daemon=True,
                name=f"distrun-{record.job_id}-stacks",
            ).start()
        reason = cancel_requested(record)
        if reason is not None:
            cancel(reason)
            return
