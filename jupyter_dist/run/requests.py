"""Asking a job's owner from another process (the CLI, the lab server, another kernel) to
stop the job or to read its stacks.

Only the process that started a job (its owner: a kernel, or `jupyter distrun run`) holds the
connections to its ranks, so the others ask it: they write a request file into the job's
folder in the store, and the owner, which looks for them a few times a second, acts on it:
`cancel.json` cancels the job the usual way (SIGTERM to every rank, SIGKILL after the grace
period, a sweep); `stacks-request.json` reads every rank's stack and stores the dump, tagged
with the request's id, as `stacks.json` (diagnose/stacks.py); `debug-request-ID.json` lists the
paused ranks or sends one of them a pdb command (diagnose/debug.py), answered in
`debug-answer-ID.json`, which the asker takes away. A file works wherever the store is shared
and needs no port, socket or signal to the owner.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from jupyter_dist.diagnose.stacks import check_method
from jupyter_dist.errors import DamagedJob, DistrunError
from jupyter_dist.events import FINAL_STATES, state_words
from jupyter_dist.store import JobRecord, read_regular, write_atomic

CANCEL_FILE = "cancel.json"
STACKS_REQUEST_FILE = "stacks-request.json"
DEBUG_REQUEST_PREFIX, DEBUG_ANSWER_PREFIX = "debug-request-", "debug-answer-"
POLL_SECONDS = 0.2  # how often an owner looks for a request
ANSWER_GRACE_S = 5.0  # how long an answer the owner was writing as its job ended may take
T = TypeVar("T")


# The effective states after which nothing of a job changes any more: it ended, its owner
# is gone, or its status cannot be read (then nobody can be asked either).
SETTLED_STATES = (*FINAL_STATES, "lost", "damaged")


def owner_fields() -> dict[str, Any]:
    """What a job's status says about its owner, so others can tell if it is still alive."""
    return {"owner_pid": os.getpid(), "owner_host": socket.gethostname()}


def effective_state(status: dict[str, Any]) -> str:
    """The job's state, except "lost" for a job still marked running whose owner on this
    machine is gone (a killed kernel): nobody will ever finish it. Its ranks stopped when
    their agents lost the owner's pipe."""
    state = status.get("state", "unknown")
    if state in FINAL_STATES or state == "unknown":
        return state
    return "lost" if _owner_gone(status) else state


def _owner_gone(status: dict[str, Any]) -> bool:
    """Whether the job's owner, a process of this machine, is gone."""
    pid, host = status.get("owner_pid"), status.get("owner_host")
    return isinstance(pid, int) and host == socket.gethostname() and not pid_alive(pid)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` of this machine still runs: not gone, and not a zombie (an
    owner killed after its parent ended waits for a reaper that may never come)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc here: kill's answer stands


def cancel_requested(record: JobRecord) -> str | None:
    """The reason given in a pending request, or None."""
    try:
        request = json.loads(read_regular(record.path / CANCEL_FILE))
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError):
        return "cancelled"  # a half-written or odd file still means stop
    return str(request.get("reason") or "cancelled")


def _ask_owner(record: JobRecord, what: str) -> str:
    """The job's state, if someone is there to act on a request; raises for a lost job."""
    status = record.status()
    state = effective_state(status)
    if state == "damaged":
        raise DistrunError(
            f"job {record.job_id} is {status['message']}; whether it still runs cannot be "
            f"told, so nobody was asked to {what}"
        )
    if state == "lost":
        raise DistrunError(
            f"job {record.job_id} has no owner any more (the process that started it is gone); "
            f"nobody can {what}; its processes stopped with it"
        )
    return state


def request_cancel(record: JobRecord, reason: str = "cancelled") -> str:
    """Ask the owner of a job to cancel it; returns the job's state when asked.

    A job that already ended is left alone (its state is returned), unless its outputs are
    still being copied from the nodes: that copy stops. A lost job (owner gone) raises,
    since nobody is there to act on the request."""
    state = _ask_owner(record, "stop it")
    if state in FINAL_STATES and not copying_outputs(record):
        return state
    write_atomic(
        record.path / CANCEL_FILE, json.dumps({"reason": reason, "requested": time.time()})
    )
    return state


def copying_outputs(record: JobRecord) -> bool:
    """Whether the job, ended or not, is still copying its outputs from the nodes (its
    owner alive: one killed during the copy left its outcome, and copies nothing more)."""
    return _copying(record.status())


def _copying(status: dict[str, Any]) -> bool:
    return status.get("copying_outputs") is True and not _owner_gone(status)


def wait_until_ended(record: JobRecord, timeout: float) -> str:
    """The job's state once it has ended (its outputs copied too), or its current state
    when `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        status = record.status()
        state = effective_state(status)
        ended = state in FINAL_STATES and not _copying(status)
        if ended or state == "lost" or time.monotonic() >= deadline:
            return state
        time.sleep(0.1)


def stacks_requested(record: JobRecord) -> dict[str, Any] | None:
    """A pending stacks request ({"id", "method"}), taken off the folder; None if none."""
    path = record.path / STACKS_REQUEST_FILE
    try:
        request = json.loads(read_regular(path))
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError):
        request = {}
    path.unlink(missing_ok=True)
    return {"id": str(request.get("id", "")), "method": str(request.get("method", "auto"))}


def request_stacks(record: JobRecord, method: str, timeout: float) -> dict[str, Any]:
    """Ask the owner of a running job for every rank's stack and wait for the dump
    (StackDump.to_dict). DistrunError when the job is not running or no answer comes."""
    check_method(method)
    state = _ask_owner(record, "read its stacks")
    if state != "running":
        raise DistrunError(
            f"job {record.job_id} {state_words(state)}; stacks are read from a running job "
            f"(the last ones taken: jupyter distrun stacks {record.job_id} --last)"
        )
    request_id = uuid.uuid4().hex
    write_atomic(
        record.path / STACKS_REQUEST_FILE, json.dumps({"id": request_id, "method": method})
    )

    def answered() -> dict[str, Any] | None:
        with contextlib.suppress(DamagedJob):  # the answer replaces a damaged dump
            dump = record.last_stacks()
            if dump and dump.get("request") == request_id:
                return dump
        return None

    return _owners_answer(record, answered, timeout, 0.1, "its stacks were read")


def _owners_answer(
    record: JobRecord, answered: Callable[[], T | None], timeout: float, poll: float, what: str
) -> T:
    """What `answered` finds, looked for every `poll` seconds; DistrunError in one line
    where the job ends before (`what`: what did not happen) or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = answered()
        if found is not None:
            return found
        if effective_state(record.status()) != "running":
            # An answer can come just after the end: a `c` that let the last paused rank
            # finish the job is answered as the job ends (its owner writes it first).
            late = time.monotonic() + min(ANSWER_GRACE_S, max(0.0, deadline - time.monotonic()))
            while time.monotonic() < late:
                found = answered()
                if found is not None:
                    return found
                time.sleep(poll)
            raise DistrunError(f"job {record.job_id} ended before {what}")
        time.sleep(poll)
    raise DistrunError(
        f"job {record.job_id}'s owner did not answer within {timeout:g} s (it may be busy); "
        "try again, or give it longer with --timeout"
    )


def debug_requests(record: JobRecord) -> list[dict[str, Any]]:
    """The pending debugger requests ({"id", "action": "list" or "send", "rank", "command",
    "timeout"}), each taken off the folder."""
    found = []
    for path in sorted(record.path.glob(f"{DEBUG_REQUEST_PREFIX}*.json")):
        request_id = path.name[len(DEBUG_REQUEST_PREFIX) : -len(".json")]
        try:
            request = json.loads(read_regular(path))
        except FileNotFoundError:
            continue  # another watcher of the same job took it
        except (OSError, json.JSONDecodeError):
            request = {}
        path.unlink(missing_ok=True)
        if isinstance(request, dict) and request_id.isalnum():
            found.append({**request, "id": request_id})
    return found


def answer_debug(record: JobRecord, request_id: str, answer: dict[str, Any]) -> None:
    """The owner's answer to a debugger request (`error`: one line, where it failed)."""
    write_atomic(record.path / f"{DEBUG_ANSWER_PREFIX}{request_id}.json", json.dumps(answer))


def request_debug(record: JobRecord, request: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Ask the owner of a running job to list its paused ranks (`{"action": "list"}`), to
    send one a command (`{"action": "send", "rank": R, "command": C}`), to send several the
    same command at once (`{"action": "cast", "ranks": [R, ...] or None for every paused
    one, "command": C}`: `{"answers": [{"rank", "answer", "paused"} or {"rank", "error"}]}`)
    or to pause one where it runs (`{"action": "interrupt", "rank": R}`), and wait for the
    answer. DistrunError, in one line, when the job is not running, the owner says no, or
    no answer comes within `timeout`."""
    state = _ask_owner(record, "reach its ranks' debugger")
    if state != "running":
        raise DistrunError(
            f"job {record.job_id} {state_words(state)}; only a running job's ranks pause"
        )
    request_id = uuid.uuid4().hex
    answer_path = record.path / f"{DEBUG_ANSWER_PREFIX}{request_id}.json"
    request_path = record.path / f"{DEBUG_REQUEST_PREFIX}{request_id}.json"
    write_atomic(request_path, json.dumps(request))

    def answered() -> dict[str, Any] | None:
        try:
            answer = json.loads(read_regular(answer_path))
        except (OSError, json.JSONDecodeError):  # not yet; written atomically, so it comes
            return None
        answer_path.unlink(missing_ok=True)
        return answer

    try:
        answer = _owners_answer(record, answered, timeout, 0.01, "its owner answered")
    finally:
        request_path.unlink(missing_ok=True)  # taken by the owner, unless it never came
    if answer.get("error"):
        raise DistrunError(str(answer["error"]))
    return answer
