"""Plans and jobs as rows of plain values: what every view (CLI, magic, inspector) shows."""

from __future__ import annotations

import json
import re
import time
from typing import Any

from jupyter_dist.events import RootCause
from jupyter_dist.masking import Masker, secret_values
from jupyter_dist.plan.model import LaunchPlan
from jupyter_dist.plan.summary import counted
from jupyter_dist.rank_sets import is_rank
from jupyter_dist.run.follow import attempts_of
from jupyter_dist.run.requests import effective_state

PLAN_COLUMNS = (
    "process",
    "role",
    "node",
    "host",
    "node_rank",
    "local_rank",
    "rank",
    "world_size",
    "master",
    "tf_config",
)


def plan_rows(plan: LaunchPlan) -> list[dict[str, Any]]:
    """One row per process: who is who in the job."""
    master = f"{plan.master_addr}:{plan.master_port}" if plan.master_port else ""
    rows = []
    for proc in plan.processes:
        if proc.rank is not None:
            rank = str(proc.rank)
        elif len(proc.ranks) > 1:
            rank = f"{proc.ranks[0]}-{proc.ranks[-1]}"
        else:
            rank = ""
        rows.append(
            {
                "process": proc.name,
                "role": proc.role,
                "node": proc.node,
                "host": proc.host,
                "node_rank": proc.node_rank,
                "local_rank": "" if proc.local_rank is None else proc.local_rank,
                "rank": rank,
                "world_size": proc.world_size,
                "master": master,
                "tf_config": json.dumps(proc.tf_config) if proc.tf_config else "",
            }
        )
    return rows


INSPECT_COLUMNS = (
    "process",
    "role",
    "host",
    "node_rank",
    "local_rank",
    "rank",
    "world_size",
    "master",
    "status",
    "exit",
)


def inspect_rows(plan: LaunchPlan, status: dict[str, Any]) -> list[dict[str, Any]]:
    """Who is who in a job, with how each process is doing (from the store's status)."""
    states = status.get("processes", {})
    rows = []
    for row in plan_rows(plan):
        state = states.get(row["process"], {})
        how = state.get("signal") or state.get("exit_code")
        rows.append({**row, "status": state.get("state", ""), "exit": "" if how is None else how})
    return rows


def job_summary(status: dict[str, Any]) -> dict[str, Any]:
    """A job as the job lists show it (CLI, lab sidebar), from its status.json."""
    state = effective_state(status)
    cause = status.get("root_cause") if state == "failed" else None
    earlier = attempts_of(status)
    allowed = status.get("attempts_allowed")
    caption = attempt_caption(len(earlier) + 1, allowed) if isinstance(allowed, int) else ""
    return {
        "job_id": status.get("job_id"),
        "name": status.get("name", ""),
        "type": status.get("type", ""),
        "state": state,
        "nodes": status.get("nodes", []),
        "processes": len(status.get("processes", {})),
        "world_size": status.get("world_size"),
        "started": status.get("started"),
        "ended": status.get("ended"),
        "root_cause": RootCause(**cause).summary() if cause else None,
        "message": status.get("message"),
        # "looks stuck: ..." while a running job is quiet (diagnose/stall.py), else None
        "stalled": status.get("stalled") if state == "running" else None,
        # A job that started again after a failure: "attempt 2 of 4", else None; and the
        # earlier attempts' causes, one line each.
        "attempt": caption or None,
        "attempts": [attempt.summary() for attempt in earlier],
        # The ranks waiting in their debugger now (breakpoint, post-mortem, interrupt).
        "paused": paused_ranks_of(status) if state == "running" else [],
    }


def paused_records(status: dict[str, Any]) -> list[dict[str, Any]]:
    """Where a job's status.json says its processes wait in their debugger: each process's
    `paused` records (diagnose/debug.PausedRank's dicts); what is not one is left out."""
    processes = status.get("processes")
    return [
        paused
        for state in (processes.values() if isinstance(processes, dict) else ())
        if isinstance(state, dict)
        for paused in state.get("paused") or ()
        if isinstance(paused, dict)
    ]


def paused_ranks_of(status: dict[str, Any]) -> list[int]:
    """The ranks a job's status.json says wait in their debugger, ascending."""
    return sorted({p["rank"] for p in paused_records(status) if is_rank(p.get("rank"))})


def attempt_caption(number: int, of: int) -> str:
    """ "attempt 2 of 4" for a job that started again; "" for a first attempt."""
    return f"attempt {number} of {of}" if number > 1 else ""


def attempts_ran(status: dict[str, Any]) -> int:
    """How many attempts a job has begun (1 unless it started again after a failure)."""
    return len(attempts_of(status)) + 1


def attempt_rows(status: dict[str, Any], now: float | None = None) -> list[dict[str, Any]]:
    """One row per attempt of a job allowed to start again (none for one that is not):
    when it started, how long it ran, how it ended and why; the last row is the current."""
    allowed = status.get("attempts_allowed")
    if not isinstance(allowed, int) or allowed < 2:
        return []
    now = now or time.time()
    rows = []
    for attempt in attempts_of(status):
        why = attempt.root_cause.summary() if attempt.root_cause else attempt.message or ""
        rows.append(
            _attempt_row(
                attempt.number, allowed, attempt.started, attempt.ended, "failed", why, now
            )
        )
    state = effective_state(status)
    cause = status.get("root_cause")
    why = RootCause(**cause).summary() if isinstance(cause, dict) else status.get("message")
    started = status.get("attempt_started") or status.get("started")
    rows.append(
        _attempt_row(len(rows) + 1, allowed, started, status.get("ended"), state, why or "", now)
    )
    return rows


def _attempt_row(number, allowed, started, ended, state, why, now) -> dict[str, Any]:
    return {
        "attempt": f"{number} of {allowed}",
        "took": duration(started, ended, now),
        "state": state,
        "why": why,
    }


def job_size(summary: dict[str, Any]) -> str:
    """A job's size as the job lists say it: ranks for pytorch and MPI jobs (however many
    launcher processes carry them), processes for the others."""
    if summary["type"] in ("pytorch", "mpi") and summary.get("world_size"):
        return counted(summary["world_size"], "rank")
    return counted(summary["processes"], "process")


def format_commands(plan: LaunchPlan, commands: dict[str, str]) -> str:
    """Each process's exact start command (a dry run's), under its label and node; secret
    values masked (masking.py)."""
    mask = command_masker(plan)
    lines = ["Commands (what each process is started with, as its backend runs it):"]
    for proc in plan.processes:
        lines += [f"{proc.label} on {proc.node}:", f"  {mask(commands[proc.name])}"]
    return "\n".join(lines)


def command_masker(plan: LaunchPlan) -> Masker:
    """What masks the values of `plan`'s secret variables in its command lines (make it
    once per plan: it holds them all)."""
    return Masker(secret_values(p.env for p in plan.processes))


def tf_configs(plan: LaunchPlan) -> str:
    """Every process's TF_CONFIG, pretty-printed (empty for other job types)."""
    parts = [
        f"TF_CONFIG of {p.label}:\n{json.dumps(p.tf_config, indent=2)}"
        for p in plan.processes
        if p.tf_config
    ]
    return "\n\n".join(parts)


def duration(started: float | None, ended: float | None, now: float) -> str:
    if not started:
        return ""
    seconds = (ended or now) - started
    return f"{seconds:.1f}s" if seconds < 90 else f"{seconds / 60:.1f}m"


def format_table(rows: list[dict[str, Any]], columns: tuple[str, ...] | list[str]) -> str:
    """A plain-text table (for notebooks and logs); empty columns are left out."""
    shown = [c for c in columns if any(str(r.get(c, "")) for r in rows)]
    cells = [[c.replace("_", " ") for c in shown]] + [
        [str(r.get(c, "")) for c in shown] for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(shown))]
    lines = [
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# What a terminal would act on rather than show: C0 controls but the newline, DEL, C1.
_UNSHOWN = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """`text` with what a terminal would act on (an escape sequence's ESC, a bell, a
    carriage return) written out as `\\x1b`: a metric's name or a job's comes out as it is
    spelled, never as a colour, a retitled window or a moved cursor."""
    return _UNSHOWN.sub(lambda found: f"\\x{ord(found.group()):02x}", text)
