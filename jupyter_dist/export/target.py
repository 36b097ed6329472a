"""Where an export goes and what every format shares: the target's folder and names, the
spec with a notebook cell turned into a command, and the mark that says a file is ours."""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from jupyter_dist.errors import ExportError
from jupyter_dist.spec import SCRIPT_RUNNER_NAME, JobSpec, spec_from_dict

# Every exported file says so in its first lines: a later export may replace such a file,
# and no other.
MARKER = "Written by jupyter-dist export"
DEFAULT_STEM = "distrun_job"
_STEM = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")


@dataclass(frozen=True)
class ExportTarget:
    """The folder and file stem of an export, with the options a format may use."""

    folder: Path
    stem: str = DEFAULT_STEM
    manifest_name: str | None = None  # as the user named it; else stem + the format's suffix
    image: str | None = None  # the container image (Kubernetes, Azure ML, SkyPilot)
    accelerator: str | None = None  # the GPU's name where a format needs it (SkyPilot)
    code_in_image: str | None = None  # where the image holds the code folder (Kubernetes)
    python: str = "python"  # the Python that per-node launchers (torchrun, dask) run with
    source: str = ""  # what was exported, for the manifest's header ("job.yml", "a cell")

    @classmethod
    def at(cls, path: str | Path | None, stem: str | None = None, **options) -> ExportTarget:
        """A target from `-o`: a folder (existing, or written with a trailing /) takes files
        named after `stem`; any other path is the manifest's own name. None: this folder."""
        stem = stem or DEFAULT_STEM
        if path is None:
            return cls(Path.cwd(), _checked(stem), **options)
        given = Path(path).expanduser()
        if given.is_dir() or str(path).endswith("/"):
            return cls(given.resolve(), _checked(stem), **options)
        return cls(given.resolve().parent, _checked(given.stem), given.name, **options)

    def name(self, suffix: str) -> str:
        return self.manifest_name or self.stem + suffix

    def job_name(self, spec: JobSpec, allowed: str = "a-z0-9-") -> str:
        """The job's name for a scheduler: the spec's name, else the manifest's stem, with
        only the `allowed` characters (others become '-')."""
        text = str(spec.name or spec.display_name or self.stem)
        if allowed == "a-z0-9-":
            text = text.lower()
        text = re.sub(f"[^{allowed}]+", "-", text).strip("-")[:40].rstrip("-")
        return text or "distrun-job"


def _checked(stem: str) -> str:
    if not _STEM.match(stem):
        raise ExportError(
            f"{stem!r} cannot name an exported file; use letters, digits, '_', '-' or '.'"
        )
    return stem


def script_file(script: str) -> str:
    """A notebook cell as the script an export runs, marked as ours."""
    return f"# {MARKER} from a notebook cell.\n{script.rstrip()}\n"


def command_spec(spec: JobSpec, script_path: str) -> JobSpec:
    """`spec` as a command: a notebook cell (`script`) runs as `python SCRIPT_PATH` (the
    file beside the manifest, from where the command runs); a spec with a command of its
    own is returned as it is."""
    if spec.script is None:
        return spec
    if spec.command and SCRIPT_RUNNER_NAME not in spec.command:
        raise ExportError(
            "this spec has both a script and a command of its own; an export runs one of "
            "them: remove the command (the script runs) or the script"
        )
    data = {**spec.to_dict(), "command": f"python {shlex.quote(script_path)}"}
    data.pop("script")
    return spec_from_dict(data, base_dir=spec._base_dir)


def path_from(folder: Path, path: Path) -> str:
    """`path` as the manifest in `folder` names it: relative where they share more than the
    root (the pair moves together), else absolute."""
    if os.path.commonpath([folder, path]) == os.sep:
        return str(path)
    return os.path.relpath(path, folder)


def ours(path: Path) -> bool:
    """Whether an export wrote the file at `path` (its mark is in the first lines)."""
    try:
        with path.open(errors="replace") as handle:
            head = [handle.readline() for _ in range(12)]
    except OSError:
        return False
    return any(MARKER in line for line in head)


def unsupported(fmt: str, setting: str, why: str) -> ExportError:
    """The one-line error for a setting a format has no way to express."""
    return ExportError(f"{fmt}: {setting} cannot be exported: {why}")
