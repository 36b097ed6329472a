"""A warm session's history written as a job (run/session_history.py makes the job): our
spec (`yaml`, for `jupyter distrun run`) or any export format, through the same exporters
as a cell or a spec.

    written, said = export_session(record, "yaml", "out/", picked="1,3-5")
"""

from __future__ import annotations

from pathlib import Path

from jupyter_dist.errors import ExportError
from jupyter_dist.export import FORMATS, ExportTarget, export, write
from jupyter_dist.run.session_history import session_job
from jupyter_dist.store import JobRecord, write_atomic

SPEC_FORMAT = "yaml"  # our own job spec, with the cells as its script
_MARK = "# A job made from session"  # the first line of a spec this module wrote


def export_session(
    record: JobRecord,
    to: str = SPEC_FORMAT,
    output: str | Path | None = None,
    picked: str | None = None,
    **options: object,
) -> tuple[list[Path], list[str]]:
    """Write the session's job (`picked`: its cells `1,3-5`, else all that ended well) as
    `to` into `output` (a folder, or the manifest's name; None: this folder), named after
    the session. The files written, and what to tell: each cell left out with why, the
    export's notes, and how to run it. ExportError or SpecError in one line."""
    if to != SPEC_FORMAT and to not in FORMATS:
        valid = ", ".join([SPEC_FORMAT, *FORMATS])
        raise ExportError(f"unknown export format {to!r}; valid formats: {valid}")
    job = session_job(record, picked)
    said = [f"cell {cell} left out: {why}" for cell, why in job.left_out.items()]
    stem = job.spec.name or "session-export"
    if to != SPEC_FORMAT:
        exported = export(job.spec, to, ExportTarget.at(output, stem=stem, **options))
        written = write(exported)
        run = f"{exported.how_to_run()} (from {exported.folder})"
        return written, [*said, *exported.notes(), f"run it with: {run}"]
    if any(options.values()):
        given = next(name for name, value in options.items() if value)
        raise ExportError(f"--{given.replace('_', '-')} applies to an export format, not yaml")
    target = ExportTarget.at(output, stem=stem)
    path = target.folder / target.name(".yml")
    if path.exists() and not _ours(path):
        raise ExportError(
            f"{path} exists and was not written by a session export; give another name with -o"
        )
    cells = ", ".join(map(str, job.kept))
    text = (
        f"{_MARK} {stem.removesuffix('-export')} (job {record.job_id}): "
        f"cells {cells}, in the order they ran.\n"
        f"# Run it with: jupyter distrun run {path.name}\n{job.spec.to_yaml()}"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)
    return [path], [*said, f"run it with: jupyter distrun run {path}"]


def _ours(path: Path) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.readline().startswith(_MARK)
    except OSError:
        return False
