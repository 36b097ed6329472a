"""Warm sessions whose ranks outlive the kernel (`%distrun session start --detach`): the
session (run/session.py) lives in a supervisor (run/supervisor.py), and a kernel, the one
that started it or any later one (`%distrun session attach`), sends it cells through the
job's folder and follows their lines from the store, as `attach` follows a job.

    kernel (RemoteSession)                         supervisor (serve)
    session/requests/<n>-<id>.json  ─────────────►  Session.run_cell(code, ranks, push)
        {"id", "code", "ranks", "push"}              one at a time, oldest first; the
    session/requests/<id>.interrupt ─────────────►  ranks' lines go to the store as any
    session/requests/stop           ─────────────►  job's (the cell's marker first)
    session/results/<id>.json       ◄─────────────  {"cell", "labels", "reports"} or
                                                      {"ended": why}
    session/requests/<n>-<id>.json  ─────────────►  Session.post_mortem(rank, wait): the
        {"id", "post_mortem": R, "wait": S}          last cell's error on rank R, until
    session/results/<id>.json       ◄─────────────  its pdb is left: {"debugged": bool}
    session/session.json            ◄─────────────  {"name", "cells_run", "memory",
                                                      "failed_ranks"}

Every file is written whole (store.write_atomic: 0600 in the job's 0700 folder). A stop
ends the session as `%distrun session stop` does (the job succeeds); a cancel of the job,
or its supervisor's death, ends it as it ends any detached job. `-o` is not offered: the
values stay on the ranks (save them to files there).
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from jupyter_dist.errors import DistrunError, SpecError
from jupyter_dist.events import JobResult
from jupyter_dist.plan.model import ProcessPlan
from jupyter_dist.rank_sets import is_rank
from jupyter_dist.run.follow import FOLLOW_POLL_S, FollowedJob, Follower
from jupyter_dist.run.requests import SETTLED_STATES, effective_state
from jupyter_dist.run.session import (
    INTERRUPT_GRACE_S,
    CellResult,
    Session,
    SessionEnded,
    chosen_ranks,
)
from jupyter_dist.store import JobRecord, JobStore, private_dir, read_regular, write_atomic

FOLDER = "session"
_REQUEST_ID = re.compile(r"[0-9a-f]{32}")
OUT_REFUSED = (
    "-o/--out: a detached session's values stay on its ranks (they outlive the kernel); "
    "save them to files there"
)
SERVE_POLL_S = 0.02  # how often the supervisor looks for a cell: a cell's latency


def _folders(record: JobRecord) -> tuple[Path, Path, Path]:
    """The session's folder in the job's, with its requests/ and results/."""
    root = record.path / FOLDER
    return root, root / "requests", root / "results"


def is_detached_session(record: JobRecord) -> bool:
    return (record.path / FOLDER / "session.json").is_file()


# -- the supervisor's side ---------------------------------------------------------------


def serve(session: Session, record: JobRecord, stop: threading.Event) -> None:
    """Run the cells kernels ask for, one at a time, until the session ends (a stop
    request, a cancel, a rank that died) or `stop` is set (the supervisor was told to
    stop: the job is cancelled)."""
    root, requests, results = open_folder(session, record)
    while session.alive:
        if stop.is_set():
            session.job.cancel("its supervisor was stopped")
            break
        if (requests / "stop").exists():
            session.stop("stopped")
            break
        pending = sorted(requests.glob("*.json"))
        if not pending:
            time.sleep(SERVE_POLL_S)
            continue
        request = _take(pending[0])
        if request is not None:
            answer = _run(session, request, requests, stop)
            write_atomic(results / f"{request['id']}.json", json.dumps(answer))
            _write_info(session, root)
    session.job.wait()


def open_folder(session: Session, record: JobRecord) -> tuple[Path, Path, Path]:
    """The session's folders, made, and session.json written: before its front is told
    it runs (a kernel reads its name there at once)."""
    folders = _folders(record)
    for folder in folders:
        private_dir(folder)
    _write_info(session, folders[0])
    return folders


def _take(path: Path) -> dict[str, Any] | None:
    """A request, taken off the folder; None if it is not one (it is dropped)."""
    try:
        request = json.loads(read_regular(path))
    except (OSError, ValueError):
        request = None
    path.unlink(missing_ok=True)
    if not isinstance(request, dict):
        return None
    if not isinstance(request.get("code"), str) and not is_rank(request.get("post_mortem")):
        return None
    if not _REQUEST_ID.fullmatch(str(request.get("id"))):
        return None  # it names the answer's file: ours are uuid4 hex
    return request


def _run(
    session: Session, request: dict[str, Any], requests: Path, stop: threading.Event
) -> dict[str, Any]:
    """One cell, as `Session.run_cell` runs it, in a thread of its own so that an
    interrupt request reaches its ranks (SIGINT) while it runs; a rank that does not come
    back within INTERRUPT_GRACE_S breaks the session, as in a kernel. A stopped supervisor
    cancels the job meanwhile."""
    found: dict[str, Any] = {}

    def run() -> None:
        try:
            if "code" not in request:  # a post-mortem on the last cell's error
                wait = request.get("wait")
                wait = float(wait) if isinstance(wait, (int, float)) and wait > 0 else 300.0
                found["debugged"] = session.post_mortem(request["post_mortem"], wait)
                return
            result = session.run_cell(
                request["code"], ranks=request.get("ranks"), push=request.get("push")
            )
            found.update(cell=result.cell, labels=result.labels, reports=result.reports)
        except SessionEnded as exc:
            found["ended"] = str(exc)
        except Exception as exc:  # the request was wrong (a rank it does not have)
            found["error"] = str(exc)

    thread = threading.Thread(target=run, daemon=True, name=f"distrun-cell-{request['id']}")
    thread.start()
    interrupt = requests / f"{request['id']}.interrupt"
    while thread.is_alive():
        thread.join(SERVE_POLL_S)
        if stop.is_set():
            session.job.cancel("its supervisor was stopped")
        if interrupt.exists():
            interrupt.unlink(missing_ok=True)
            session.interrupt_cell()
            thread.join(INTERRUPT_GRACE_S)
            if thread.is_alive():
                session.job.cancel(
                    f"session {session.name} broken: a rank did not come back from an "
                    f"interrupt within {INTERRUPT_GRACE_S:g} s"
                )
                thread.join()
            found["interrupted"] = True
    return found


def _write_info(session: Session, root: Path) -> None:
    info = {
        "name": session.name,
        "cells_run": session.cells_run,
        "memory": session.memory_text(),
        "failed_ranks": session.failed_ranks,
    }
    write_atomic(root / "session.json", json.dumps(info))


# -- the kernel's side ---------------------------------------------------------------------


class RemoteSession:
    """A detached session as the magics use a `Session`: its name, job (a `FollowedJob`,
    which views take as they take a job), ranks, cells, and `run_cell`/`stop`."""

    detached = True

    def __init__(self, record: JobRecord) -> None:
        self.record = record
        self.job = FollowedJob(record)
        info = self._info()
        self.name = str(info.get("name", record.job_id))
        self.started = self.job.started or time.time()

    @classmethod
    def find(cls, store: JobStore, which: str | None) -> RemoteSession:
        """The detached session named `which` (or whose job id starts with it; the latest
        open one without), still running; DistrunError saying what is open otherwise."""
        open_ones = [
            record
            for record in store.jobs()
            if is_detached_session(record)
            and effective_state(record.status()) not in SETTLED_STATES
        ]
        sessions = [cls(record) for record in open_ones]
        chosen = [s for s in sessions if which in (None, s.name)] or [
            s for s in sessions if which and s.record.job_id.startswith(which)
        ]
        if not chosen:
            named = ", ".join(f"{s.name} (job {s.record.job_id})" for s in sessions)
            wanted = f"named {which!r} " if which else ""
            raise DistrunError(
                f"no detached session {wanted}is open ("
                + (
                    f"open: {named})"
                    if named
                    else "none is; start one with %distrun session start --detach)"
                )
            )
        return chosen[0]  # the store lists the newest first

    def _info(self) -> dict[str, Any]:
        try:
            info = json.loads(read_regular(_folders(self.record)[0] / "session.json"))
        except (OSError, ValueError):
            return {}
        return info if isinstance(info, dict) else {}

    @property
    def alive(self) -> bool:
        return effective_state(self.record.status()) not in SETTLED_STATES

    @property
    def ranks(self) -> list[ProcessPlan]:
        return list(self.job.plan.processes)

    def chosen(self, ranks: list[int] | None) -> list[ProcessPlan]:
        return chosen_ranks(self.name, self.ranks, ranks)

    @property
    def cells_run(self) -> int:
        return int(self._info().get("cells_run", 0))

    @property
    def next_cell(self) -> int:
        return self.cells_run + 1

    def memory_text(self) -> str:
        return str(self._info().get("memory", "not reported yet"))

    @property
    def failed_ranks(self) -> list[int]:
        """The ranks whose last cell raised, as the supervisor last wrote them."""
        found = self._info().get("failed_ranks")
        return [r for r in found if is_rank(r)] if isinstance(found, list) else []

    def post_mortem(self, rank: int, wait: float) -> bool:
        """As Session.post_mortem, through the supervisor: blocks until rank `rank`'s pdb
        on its last cell's error is left (diagnose/debug.py reaches it meanwhile), or
        nobody attached within `wait`. False where that cell did not fail on `rank`."""
        if not self.alive:
            raise SessionEnded(self.ended_message())
        self.chosen([rank])  # a rank it does not have: one line, nothing asked
        _, answer_path = self._ask({"post_mortem": rank, "wait": wait})
        return bool(self._accepted(self._answer(answer_path, None)).get("debugged"))

    def run_cell(
        self,
        code: str,
        on_tick=None,
        ranks: list[int] | None = None,
        push: str | None = None,
        out: list[str] | None = None,
    ) -> CellResult:
        """As Session.run_cell, through the supervisor: the lines come from the store (the
        job's listeners get them), the reports from its answer. An interrupt asks the
        supervisor to interrupt the cell's ranks, waits for their reports, then
        propagates."""
        if out:
            raise SpecError(OUT_REFUSED)
        if not self.alive:
            raise SessionEnded(self.ended_message())
        self.job.step()  # what came before this cell is not its
        request_id, answer_path = self._ask({"code": code, "ranks": ranks, "push": push})
        interrupted = False
        while True:
            try:
                answer = self._answer(answer_path, on_tick)
                break
            except KeyboardInterrupt:
                if interrupted:
                    raise
                interrupted = True
                write_atomic(_folders(self.record)[1] / f"{request_id}.interrupt", "")
        self._accepted(answer)
        if interrupted or answer.get("interrupted"):
            raise KeyboardInterrupt
        result = CellResult(int(answer["cell"]), dict(answer["labels"]))
        result.reports = dict(answer["reports"])
        return result

    def _ask(self, asked: dict[str, Any]) -> tuple[str, Path]:
        """`asked` (a cell, a post-mortem) written for the supervisor under an id of its own:
        the id, and where its answer will be."""
        _, requests, results = _folders(self.record)
        request_id = uuid.uuid4().hex
        write_atomic(
            requests / f"{time.time_ns()}-{request_id}.json",
            json.dumps({"id": request_id, **asked}),
        )
        return request_id, results / f"{request_id}.json"

    def _accepted(self, answer: dict[str, Any]) -> dict[str, Any]:
        """`answer`, unless it says the session ended (SessionEnded) or the request was
        wrong (DistrunError)."""
        if "ended" in answer:
            raise SessionEnded(f"session {self.name} has ended: {answer['ended']}")
        if "error" in answer:
            raise DistrunError(answer["error"])
        return answer

    def _answer(self, path: Path, on_tick) -> dict[str, Any]:
        """The supervisor's answer once it is written (the cell's lines read meanwhile);
        SessionEnded if the session ends first."""
        while True:
            ended, read = self.job.step()
            if path.exists():
                self.job.step()  # its last lines were stored before the answer
                if on_tick is not None:
                    on_tick()
                answer = json.loads(read_regular(path))
                path.unlink(missing_ok=True)
                return answer
            if on_tick is not None:
                on_tick()
            if ended is not None:
                raise SessionEnded(self.ended_message())
            if not read:
                time.sleep(FOLLOW_POLL_S / 5)

    def stop(self, reason: str = "stopped") -> JobResult:
        """End the session (its job succeeds); returns once its supervisor has ended it."""
        write_atomic(_folders(self.record)[1] / "stop", reason)
        follower = Follower(self.record, history=0)
        while not follower.ended():
            time.sleep(0.05)
        return follower.result()

    def ended_message(self) -> str:
        result = Follower(self.record, history=0).result()
        if result.state not in SETTLED_STATES:
            return f"session {self.name} has ended"
        return f"session {self.name} has ended: {result.describe()}"
