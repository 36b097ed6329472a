"""Export: a job written as a file that another scheduler runs, a view over the spec and
its plan (never a second planner).

    exported = export(spec, "sbatch", ExportTarget.at("out/train.sbatch"))
    exported.files   # {"train.sbatch": "#!/bin/bash ...", "train.py": "<the cell>"}
    written = write(exported)

Each format (`Format`) is a render function in a module of its own, the manifest's file
ending and the command that runs it. A spec whose code is a notebook cell (`script`) is
exported as a command that runs the cell's code from a file beside the manifest
(`<stem>.py`); a format whose nodes cannot see that file carries it inside (Kubernetes: a
ConfigMap, which carries a small `code` folder too).
What a format cannot express is an `ExportError` naming the setting and the format, never a
manifest that would run something else.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_dist.backends import check_section
from jupyter_dist.code_folder import CodeFolder, read_code_folder
from jupyter_dist.errors import ExportError
from jupyter_dist.export import azureml, kubernetes, sbatch, skypilot
from jupyter_dist.export.target import ExportTarget, command_spec, ours, path_from, script_file
from jupyter_dist.masking import is_secret
from jupyter_dist.spec import JobSpec, spec_from_dict
from jupyter_dist.store import write_atomic

__all__ = ["FORMATS", "ExportTarget", "Exported", "Format", "export", "write"]


@dataclass(frozen=True)
class Format:
    """One export format: `render(spec, target, cell, code)` is the manifest's text (`cell`:
    the notebook cell's script file, or None; `code`: for a format that carries it, what of
    the spec's code folder travels, else None)."""

    render: Callable[[JobSpec, ExportTarget, str | None, CodeFolder | None], str]
    suffix: str  # the manifest's file ending
    how_to_run: str  # the command that runs the manifest, `{name}` its file name
    # Only the code folder reaches the nodes, so a cell's file must be inside it.
    uploads_code: bool = False
    # The manifest carries the cell (and the code folder) to where the command runs.
    carries_code: bool = False
    options: tuple[str, ...] = ()  # the target options it reads (image, accelerator, ...)
    # It starts the whole job again after a failure, as limits.max_restarts asks.
    restarts: bool = False


KUBECTL = "kubectl apply -f {name}"
FORMATS = {
    "sbatch": Format(sbatch.render, sbatch.SUFFIX, sbatch.HOW_TO_RUN),
    "kubeflow": Format(
        kubernetes.render_kubeflow,
        ".kubeflow.yaml",
        KUBECTL,
        carries_code=True,
        options=("image", "code_in_image"),
    ),
    "jobset": Format(
        kubernetes.render_jobset,
        ".jobset.yaml",
        KUBECTL,
        carries_code=True,
        options=("image", "code_in_image"),
        restarts=True,
    ),
    "skypilot": Format(
        skypilot.render,
        ".sky.yaml",
        "sky launch {name}",
        uploads_code=True,
        options=("image", "accelerator"),
    ),
    "azureml": Format(
        azureml.render,
        ".yml",
        "az ml job create --file {name}",
        uploads_code=True,
        options=("image",),
    ),
}


@dataclass(frozen=True)
class Exported:
    """What an export writes: file name -> text, the manifest first, all in `folder`."""

    format: str
    folder: Path
    files: dict[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()  # names of secret variables whose values the files hold
    left_out: str = ""  # what of the code folder the manifest does not carry, and why
    not_carried: tuple[str, ...] = ()  # settings of the spec the format has no way to carry

    @property
    def manifest(self) -> str:
        return next(iter(self.files))

    def notes(self) -> list[str]:
        """What a user should know of the files: kept private, code left out."""
        said = []
        if self.secrets:
            said.append(
                f"Kept readable by you alone (0600): they hold {', '.join(self.secrets)}'s values"
            )
        if self.left_out:
            said.append(f"Not carried from the code folder: {self.left_out}")
        said += self.not_carried
        return said

    def how_to_run(self) -> str:
        """The command that runs the manifest, from its folder."""
        return FORMATS[self.format].how_to_run.format(name=shlex.quote(self.manifest))


def export(spec: JobSpec, fmt: str, target: ExportTarget) -> Exported:
    """The files that run `spec` under `fmt` (a key of FORMATS), named from `target`."""
    if spec.backend:  # its keys, as a run would check them
        check_section(spec.backend)
    chosen = FORMATS.get(fmt)
    if chosen is None:
        raise ExportError(f"unknown export format {fmt!r}; valid formats: {', '.join(FORMATS)}")
    for option in ("image", "accelerator", "code_in_image"):  # given, but of no use here
        if getattr(target, option) and option not in chosen.options:
            users = [name for name, f in FORMATS.items() if option in f.options]
            flag = "--" + option.replace("_", "-")
            raise ExportError(f"{flag} applies to {', '.join(users)} only (not {fmt})")
    manifest_name = target.name(chosen.suffix)
    if manifest_name == target.stem + ".py" and spec.script is not None:
        raise ExportError(
            f"{manifest_name} would hold both the manifest and the cell's code; give the "
            "manifest another name"
        )
    files: dict[str, str] = {}
    script_name = script_file_name = target.stem + ".py"
    if spec.script is not None:  # the cell's code, in a file beside the manifest
        files[script_name] = script_file(spec.script)
        code = spec.code_dir()
        if code is not None and not chosen.carries_code:  # the command runs in the code folder
            script_name = path_from(code, target.folder / script_name)
            if chosen.uploads_code and script_name.startswith(".."):
                raise ExportError(
                    f"{fmt}: the cell's code must be written into the code folder it "
                    f"uploads ({code}); export into it, e.g. --export-to {code}/"
                )
    runnable = _without_agents_own(command_spec(spec, script_name))
    code = None
    if chosen.carries_code and spec.code is not None and not target.code_in_image:
        code = read_code_folder(spec.code_dir(), ignore_files=True)
    manifest = chosen.render(runnable, target, files.get(script_file_name), code)
    secrets = tuple(sorted(name for name in spec.environment_variables if is_secret(name)))
    return Exported(
        format=fmt,
        folder=target.folder,
        files={manifest_name: manifest, **files},
        secrets=secrets,
        left_out=code.left_out() if code else "",
        not_carried=_not_carried(spec, fmt),
    )


# Settings that jupyter-dist's node agent, the ranks' startup hook or its owner act on (a
# node's pool, the debugger, the lines read as metrics), which no export ships: carried,
# they would be keys another scheduler refuses (Azure's schema) or variables nothing reads.
AGENTS_OWN = ("preload", "debug", "metrics")


def _without_agents_own(spec: JobSpec) -> JobSpec:
    data = spec.to_dict()
    if not any(key in data for key in AGENTS_OWN):
        return spec
    for key in AGENTS_OWN:
        data.pop(key, None)
    return spec_from_dict(data, base_dir=spec._base_dir)


def _not_carried(spec: JobSpec, fmt: str) -> tuple[str, ...]:
    """A line for each setting of `spec` that the export to `fmt` cannot carry."""
    said = []
    if spec.max_restarts and not FORMATS[fmt].restarts:
        restarting = ", ".join(name for name, f in FORMATS.items() if f.restarts)
        said.append(
            f"Not carried: limits.max_restarts: {spec.max_restarts} ({fmt} runs the "
            f"job once; {restarting} starts the whole job again)"
        )
    if spec.preload is not None and spec.preload.modules:
        said.append(
            f"Not carried: preload: {', '.join(spec.preload.modules)} (the ranks "
            "start cold: a node's pool is jupyter-dist's own)"
        )
    if spec.metric_patterns():
        said.append(
            "Not carried: metrics.pattern (the lines are read as metrics by "
            "jupyter-dist's owner of the job; the other scheduler keeps them as "
            "output)"
        )
    if spec.post_mortem_wait():
        said.append(
            "Not carried: debug: {post_mortem: true} (a failed rank exits at once: "
            "the debugger is jupyter-dist's own)"
        )
    return tuple(said)


def write(exported: Exported) -> list[Path]:
    """Write the files into their folder (made if missing). A file already there is replaced
    only if an export wrote it; otherwise ExportError, and nothing is written."""
    paths = [exported.folder / name for name in exported.files]
    for path in paths:
        if path.exists() and not ours(path):
            raise ExportError(
                f"{path} exists and was not written by jupyter-dist export; choose another "
                "path, or move that file away"
            )
    exported.folder.mkdir(parents=True, exist_ok=True)
    for path, text in zip(paths, exported.files.values(), strict=True):
        program = text.startswith("#!")
        if exported.secrets:  # the manifest is the job: it holds the secrets' values
            write_atomic(path, text, mode=0o700 if program else None)
            continue
        path.write_text(text)
        if program:
            path.chmod(0o755)
    return paths
