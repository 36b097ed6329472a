"""A detached job's owner: a process of its own that outlives the front that started it.

    detached = detach(spec, store=store, nodes_file=None, cwd=os.getcwd())
    detached.job_id      # returns once every rank runs (or raises, as `launch` would)

`detach` hands the launch to a supervisor (`python -m jupyter_dist.run.supervisor
REQUEST`), started in a session of its own with no terminal, so that a kernel restart, a
closed terminal or a stopped Jupyter server does not reach it. The supervisor is the job's
owner as a kernel is for an attached job: it plans and starts the job (`prepare_job`),
holds the nodes' connections, the Slurm allocation and the port claims, writes the store,
answers cancel and stacks requests (run/requests.py), and exits once the job has ended.
`status.json` names it (`owner_pid`, `owner_host`): if it dies, the job reads "lost", and
its ranks stop as they stop when a kernel dies (their agents lose its pipe).

The handshake, on the supervisor's stdout, one line each: `note TEXT` for what the backend
says meanwhile (a pending Slurm request's reason), `planned JOB_ID SUMMARY`, then
`running`; or `error MESSAGE` (nothing started) or `failed MESSAGE` (the start failed).
After it the supervisor's stdout is /dev/null and what it says goes to `supervisor.log`
in the job's folder. SIGTERM, SIGHUP and SIGINT to the supervisor cancel the job; before
it runs, they stop the start and give back what was asked for (an interrupted front sends
SIGTERM).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from jupyter_dist.errors import DistrunError
from jupyter_dist.store import PRIVATE_FILE, JobStore

SUPERVISOR_LOG = "supervisor.log"
START_TIMEOUT_S = 600.0  # a Slurm allocation may wait its turn


@dataclass(frozen=True)
class LaunchRequest:
    """What a supervisor needs to start the job as its front would have."""

    spec_yaml: str
    base_dir: str  # where the spec's relative paths (code) start
    store_root: str
    cwd: str
    nodes_file: str | None = None
    grace_period: float | None = None
    extra_files: dict[str, str] = field(default_factory=dict)
    session: str | None = None  # a warm session's name: its ranks serve cells (ready first)


@dataclass(frozen=True)
class Detached:
    """A job whose supervisor runs it."""

    job_id: str
    summary: str
    supervisor_pid: int


def detach(
    spec,
    *,
    store: JobStore,
    cwd: str,
    nodes_file: str | None = None,
    grace_period: float | None = None,
    extra_files: Mapping[str, str] | None = None,
    session: str | None = None,
    on_note: Callable[[str], None] = lambda text: print(text, file=sys.stderr, flush=True),
) -> Detached:
    """Start `spec` under a supervisor; returns once every rank runs (with `session`, a
    warm session of that name: once every rank is ready for cells,
    run/detached_session.py). DistrunError with the reason when it could not be planned
    or started (nothing is left running then). What the backend says meanwhile (a pending
    Slurm request) goes to `on_note`. An interrupt meanwhile stops the supervisor, which
    gives back what it asked for, and propagates."""
    request = LaunchRequest(
        spec_yaml=spec.to_yaml(),
        base_dir=str(spec._base_dir),
        store_root=str(store.root),
        cwd=cwd,
        nodes_file=nodes_file,
        grace_period=grace_period,
        extra_files=dict(extra_files or {}),
        session=session,
    )
    fd, path = tempfile.mkstemp(prefix="distrun-launch-", suffix=".json")
    with os.fdopen(fd, "w") as handle:  # mkstemp's file is its owner's alone (0600)
        json.dump(asdict(request), handle)
    try:
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "jupyter_dist.run.supervisor", path],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            text=True,
            cwd=cwd,
        )
    except OSError as exc:
        os.unlink(path)
        raise DistrunError(f"could not start the job's supervisor: {exc}") from None
    job_id, summary = "", ""
    assert supervisor.stdout is not None
    try:
        for line in supervisor.stdout:
            word, _, rest = line.rstrip("\n").partition(" ")
            if word == "note":
                on_note(rest)
            elif word == "planned":
                job_id, _, summary = rest.partition(" ")
            elif word == "running":
                return Detached(job_id, summary, supervisor.pid)
            elif word in ("error", "failed"):
                raise DistrunError(rest)
    except KeyboardInterrupt:  # the front was interrupted before its job runs: so is it
        supervisor.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            supervisor.wait(timeout=START_TIMEOUT_S)
        raise
    finally:
        supervisor.stdout.close()
    code = supervisor.wait()
    raise DistrunError(f"the job's supervisor ended before its job started (exit code {code})")


class _Notes:
    """The supervisor's stderr until the handshake ends: each line the front should show
    (a Slurm request's pending reason) goes to it as `note LINE`."""

    def __init__(self) -> None:
        self._held = ""

    def write(self, text: str) -> int:
        self._held += text
        *lines, self._held = self._held.split("\n")
        for line in lines:
            if line.strip():
                _say(f"note {line}")
        return len(text)

    def flush(self) -> None:
        pass


def _one_line(exc: Exception) -> str:
    return str(exc) if isinstance(exc, DistrunError) else f"{type(exc).__name__}: {exc}"


def _say(line: str) -> None:
    sys.stdout.write(line.replace("\n", " ") + "\n")
    sys.stdout.flush()


def _quiet_stdout(log: Path) -> None:
    """After the handshake: the front may be gone, so nothing more goes to its pipe; what
    the supervisor says goes to `log`."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    target = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_FILE)
    os.dup2(target, 2)
    os.close(target)


def supervise(request: LaunchRequest) -> int:
    """Run the job to its end as its owner; the exit code is 0 (its outcome is in the
    store)."""
    from jupyter_dist.nodes import load_inventory
    from jupyter_dist.run.launch import prepare_job
    from jupyter_dist.spec import parse_spec

    stop = threading.Event()  # asked to stop: once the job runs, it is cancelled

    def asked_to_stop(*_: object) -> None:
        if not stop.is_set() and not running.is_set():
            stop.set()
            raise KeyboardInterrupt  # before it runs: what was asked for is given back
        stop.set()

    running = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, asked_to_stop)
    sys.stderr = _Notes()  # what the backend says meanwhile (a pending Slurm request)
    if request.session is not None:
        return _supervise_session(request, stop, running)
    try:
        spec = parse_spec(request.spec_yaml, base_dir=request.base_dir)
        job = prepare_job(
            spec,
            store=JobStore(request.store_root),
            cwd=request.cwd,
            inventory=load_inventory(request.nodes_file),
            grace_period=request.grace_period,
            extra_files=request.extra_files,
        )
    except KeyboardInterrupt:
        _say("error interrupted before it started; nothing runs")
        return 0
    except Exception as exc:  # said in one line by the front, as `run` would say it
        _say(f"error {_one_line(exc)}")
        return 0
    _say(f"planned {job.job_id} {job.summary}")
    try:
        job.start()
    except KeyboardInterrupt:  # the job is marked cancelled, and nothing of it runs
        _say("error interrupted while it started; nothing runs")
        return 0
    except Exception as exc:  # the job is marked failed, and nothing of it runs
        _say(f"failed {_one_line(exc)}")
        return 0
    running.set()
    _say("running")
    sys.stderr = sys.__stderr__
    _quiet_stdout(job.record.path / SUPERVISOR_LOG)
    while job.wait(0.5) is None:
        if stop.is_set():
            job.cancel("its supervisor was stopped")
            job.wait()
            break
    return 0


def _supervise_session(
    request: LaunchRequest, stop: threading.Event, running: threading.Event
) -> int:
    """A warm session's supervisor: start it (planned and running are said together, once
    every rank is ready), then serve the kernels' cells until it ends."""
    from jupyter_dist.nodes import load_inventory
    from jupyter_dist.run.detached_session import open_folder, serve
    from jupyter_dist.run.session import Session
    from jupyter_dist.spec import parse_spec

    try:
        spec = parse_spec(request.spec_yaml, base_dir=request.base_dir)
        session = Session.start(
            spec,
            name=request.session,
            store=JobStore(request.store_root),
            cwd=request.cwd,
            inventory=load_inventory(request.nodes_file),
            grace_period=request.grace_period,
        )
    except KeyboardInterrupt:
        _say("error interrupted before it started; nothing runs")
        return 0
    except Exception as exc:  # nothing of it runs: Session.start stopped what had started
        _say(f"error {_one_line(exc)}")
        return 0
    open_folder(session, session.job.record)  # its name, before the front reads it
    running.set()
    _say(f"planned {session.job.job_id} {session.job.summary}")
    _say("running")
    sys.stderr = sys.__stderr__
    _quiet_stdout(session.job.record.path / SUPERVISOR_LOG)
    serve(session, session.job.record, stop)
    return 0


def main(argv: list[str]) -> int:
    (path,) = argv
    with open(path) as handle:
        data = json.load(handle)
    os.unlink(path)  # it may hold secrets (the spec's environment): read once, then gone
    return supervise(LaunchRequest(**data))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
