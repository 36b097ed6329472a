"""The preload a user last asked for, kept for a day: the pools' default (docs/pool.md).

Contract:

- A job that names its modules (`--preload torch`, `preload: [torch]`) is remembered:
  its modules and idle time, its job id and when.
- A job that says nothing of preloading takes what was remembered, for REMEMBER_S after
  the job that asked, where a pool would fork its ranks: a Python command (`python ...`,
  `python3 ...`: a cell is one) that jupyter-dist starts once per rank (no torchrun, mpirun
  or horovodrun between). Anything else starts cold, as without a pool, and starts no pool.
- `--preload none` (`preload: none`) starts that job cold and forgets what was remembered.
- A job whose preload a node cannot import (its agent says so: `forget_if`) forgets it: the
  next job that says nothing starts cold, and asks for no pool that would fail again.

Kept in the store's root as `preload.json` (0600, store.write_atomic): the store is the
user's, so is the memory, and a second store (`--store`, DISTRUN_HOME) has its own.
"""

from __future__ import annotations

import json
import shlex
import time

from jupyter_dist.spec import JobSpec, PreloadSection
from jupyter_dist.store import JobStore, read_regular, write_atomic

REMEMBER_S = 24 * 3600  # "every later job of the day"
FILE = "preload.json"
PYTHONS = ("python", "python3")  # what a pool's `python` front stands in for


def taken(spec: JobSpec, store: JobStore) -> tuple[JobSpec, list[str]]:
    """`spec` with the preload it runs with, and the line saying it came from an earlier
    job ([] where it named its own, or takes none). Reads only."""
    if spec.preload is not None:
        return spec, []
    found = remembered(store)
    if found is None or not forks(spec):
        return spec, []
    section, job_id = found
    said = (
        f"ranks forked from each node's pool of {', '.join(section.modules)}, as job "
        f"{job_id} asked (--preload none starts them cold)"
    )
    return spec.model_copy(update={"preload": section}), [said]


def keep(spec: JobSpec, store: JobStore, job_id: str) -> None:
    """What job `job_id`'s own spec says of preloading, remembered: its modules, or none
    (forgotten); nothing where it says nothing."""
    if spec.preload is None:
        return
    if spec.preload.modules:
        remember(store, spec.preload, job_id)
    else:
        forget(store)


def forks(spec: JobSpec) -> bool:
    """Whether a pool would fork this job's ranks: a cell's script, or a command that runs
    `python` or `python3`, started once per rank by jupyter-dist."""
    if not spec.script:
        try:
            words = shlex.split(spec.command or "")
        except ValueError:
            return False
        if not words or words[0] not in PYTHONS:
            return False
    distribution = spec.distribution
    if distribution is None:
        return True
    kind = getattr(distribution, "type", None)
    if kind == "pytorch":
        return getattr(distribution, "launcher", "per_process") == "per_process"
    return kind == "tensorflow"


def remember(store: JobStore, section: PreloadSection, job_id: str) -> None:
    kept = {"modules": section.modules, "idle": section.idle, "job": job_id, "at": time.time()}
    write_atomic(store.root / FILE, json.dumps(kept))


def forget(store: JobStore) -> None:
    (store.root / FILE).unlink(missing_ok=True)


def forget_if(store: JobStore, modules: list[str]) -> None:
    """Forget what was remembered where it is `modules`: a node could not import them (a
    preload that fails is not taken by later jobs)."""
    kept = remembered(store)
    if kept is not None and list(kept[0].modules) == list(modules):
        forget(store)


def remembered(store: JobStore, now: float | None = None) -> tuple[PreloadSection, str] | None:
    """What was remembered, and the job that asked for it, where it is younger than
    REMEMBER_S and readable; else None (a damaged file is as none: the job starts cold)."""
    try:
        kept = json.loads(read_regular(store.root / FILE))
        section = PreloadSection(modules=kept["modules"], idle=kept.get("idle"))
        at = float(kept["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not 0 <= (time.time() if now is None else now) - at <= REMEMBER_S:
        return None
    return section, str(kept.get("job", "?"))
