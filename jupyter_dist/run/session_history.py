"""A warm session's history, and the job it makes: the cells that worked, in the order they
ran, as one script beside the session's own spec.

    record_cell(record, CellRun(...))          # Session.run_cell, after each cell
    runs = read_cells(record)                  # what the session ran, oldest first
    exported = session_job(record, "1,3-5")    # a SessionJob: its spec, what was left out

Each cell a session runs is one JSON line of the session job's folder, `cells.jsonl`
(private, as every store file): {"cell", "code", "time", "ranks", "pushed", "ok",
"interrupted", "failed"}. `session_job` keeps the cells that ended well on every rank they
ran on and were not interrupted (and, with `picked`, only those numbered there), and names
each one left out in the script's header, with why. A kept cell that was given values from
the notebook (`-i`) is refused in one line: the job cannot have them. A cell run on some
ranks only (`--ranks`) runs on those alone in the job too. The spec is the session's own
(its nodes, ranks, type, environment, code folder), with the script in place of the
session's worker: one planner and one set of exporters run it (`jupyter distrun run`,
export/).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from jupyter_dist.errors import DistrunError, SpecError
from jupyter_dist.events import ranges
from jupyter_dist.spec import JobSpec, load_yaml, spec_from_dict
from jupyter_dist.store import JobRecord, JobStore, append_private, read_regular

CELLS_FILE = "cells.jsonl"
SESSION_WORKER = "session_worker.py"  # what a session's spec runs (run/session.py's WORKER)


@dataclass
class CellRun:
    """One cell a session ran."""

    cell: int  # its number, as the live view shows it
    code: str
    time: float  # when it started (epoch seconds)
    ranks: list[int] | None = None  # those it ran on (--ranks), None: every rank
    pushed: bool = False  # it was given values from the notebook (-i)
    ok: bool = False  # it ended well on every rank it ran on
    interrupted: bool = False
    failed: str | None = None  # the first line of its failure: `rank 1: ValueError: bad`
    session: str = ""  # the session's name (%distrun session start --name)


@dataclass
class SessionJob:
    """A session's history as a job: `spec` (a script job), and each cell left out with why."""

    spec: JobSpec
    kept: list[int]
    left_out: dict[int, str] = field(default_factory=dict)


def record_cell(record: JobRecord, run: CellRun) -> None:
    """Add `run` to the session's history in its job folder. Raises OSError (a full disk)."""
    append_private(record.path / CELLS_FILE, json.dumps(asdict(run)) + "\n")


def read_cells(record: JobRecord) -> list[CellRun]:
    """The cells the session ran, oldest first ([] before its first cell); a damaged line
    is skipped."""
    try:
        text = read_regular(record.path / CELLS_FILE).decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    runs = []
    for line in text.splitlines():
        try:
            data = json.loads(line)
            runs.append(CellRun(**{k: data[k] for k in CellRun.__dataclass_fields__ if k in data}))
        except (ValueError, TypeError, KeyError):
            continue
    return runs


def find_session(store: JobStore, which: str) -> JobRecord:
    """The session job `which` names: its job id (or a unique prefix), else its name (the
    latest of that name). SpecError in one line where none is, or it is no session."""
    try:
        record = store.get(which)
    except DistrunError:
        named = [r for r in store.jobs() if _is_session(r) and which in _names(r)]
        if not named:
            raise SpecError(
                f"no session named {which!r} or with job id {which!r} in {store.root}"
            ) from None
        return max(named, key=lambda r: r.job_id)  # ids start with their time
    if not _is_session(record):
        raise SpecError(f"job {record.job_id} is not a session (its spec runs no cells)")
    return record


def _names(record: JobRecord) -> set[str]:
    """What a session job is called: its session's name, and its job's."""
    runs = read_cells(record)
    return {str(record.status().get("name")), *(r.session for r in runs[:1] if r.session)}


def _is_session(record: JobRecord) -> bool:
    try:
        return SESSION_WORKER in record.spec_yaml()
    except (OSError, DistrunError):
        return False


def picked_cells(text: str, known: list[int]) -> set[int]:
    """`1,3-5` as cell numbers; SpecError in one line for what is not, or a cell the
    session did not run."""
    picked: set[int] = set()
    for word in (w.strip() for w in text.split(",")):
        first, dash, last = word.partition("-")
        try:
            low, high = int(first), int(last if dash else first)
        except ValueError:
            raise SpecError(f"--cells: {word!r} is no cell number or range (e.g. 1,3-5)") from None
        if low > high:
            raise SpecError(f"--cells: {word!r} runs backwards (e.g. 3-5)")
        picked.update(range(low, high + 1))
    unknown = sorted(picked - set(known))
    if unknown:
        said = f"cells 1-{max(known)}" if known else "no cell yet"
        raise SpecError(f"--cells: the session ran no cell {unknown[0]} (it ran {said})")
    return picked


def session_job(record: JobRecord, picked: str | None = None) -> SessionJob:
    """The job of the session in `record`: its kept cells as the script of its own spec.
    SpecError in one line where no cell is left, or a kept cell used -i values."""
    runs = read_cells(record)
    status = record.status()
    name = next((r.session for r in runs if r.session), "") or str(status.get("name") or "")
    chosen = picked_cells(picked, [r.cell for r in runs]) if picked else None
    kept, left_out = [], {}
    for run in runs:
        if chosen is not None and run.cell not in chosen:
            left_out[run.cell] = "not in --cells"
        elif run.interrupted:
            left_out[run.cell] = "interrupted"
        elif not run.ok:
            left_out[run.cell] = f"failed: {run.failed or 'on some rank'}"
        elif run.pushed:
            keep = ",".join(str(r.cell) for r in runs if r.ok and not r.pushed)
            raise SpecError(
                f"cell {run.cell} was given values from the notebook (-i), which a job cannot "
                f"have; leave it out with --cells (e.g. --cells {keep or '1'})"
            )
        else:
            kept.append(run)
    if not kept:
        raise SpecError(f"session {name}: no cell to export (none ended well on every rank)")
    script = _script(name, record.job_id, runs, kept, left_out)
    data = load_yaml(record.spec_yaml())
    data.pop("command", None)  # the session's worker
    data["script"] = script
    data["name"] = f"{name}-export"
    spec = spec_from_dict(data, base_dir=Path("."), source=f"session {name}")
    return SessionJob(spec, [r.cell for r in kept], left_out)


def _script(
    name: str, job_id: str, runs: list[CellRun], kept: list[CellRun], left_out: dict[int, str]
) -> str:
    """The kept cells in the order they ran, under a header naming where each came from."""
    lines = [
        f"# From session {name} (job {job_id}), exported {_when(time.time())} by jupyter-dist:",
        "# the cells that ended well on every rank, in the order they ran.",
    ]
    for run in runs:
        said = "kept" if run.cell not in left_out else f"left out: {left_out[run.cell]}"
        lines.append(f"#   cell {run.cell}, run {_when(run.time)}: {said}")
    if any(run.ranks is not None for run in kept):
        lines += ["", "import os as _distrun_os"]
    for run in kept:
        lines += ["", f"# -- cell {run.cell}, run {_when(run.time)}"]
        if run.ranks is None:
            lines.append(run.code.rstrip("\n"))
        else:  # as the session ran it: on these ranks only, in the script's globals
            lines += [
                f"# (on {ranges([f'rank {r}' for r in run.ranks])} only)",
                f"if int(_distrun_os.environ['RANK']) in {set(run.ranks)!r}:",
                f"    exec(compile({run.code!r}, 'cell {run.cell}', 'exec'))",
            ]
    return "\n".join(lines) + "\n"


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))
