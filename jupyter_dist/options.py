"""The launch options of a `%%distrun` cell, as one typed model that every view shares (the
magic parses them from its line, the form reads them from its controls), and how they become
a job spec.

    options = LaunchOptions(type="pytorch", nodes=2, procs_per_node=2, env=["A=1"])
    spec = options.to_spec("import torch ...", base_dir=".")

Every option maps to a key of the job spec; a wrong one is a `SpecError` of one line that
names the option as the user wrote it (`--ps-count applies to tensorflow jobs only`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from jupyter_dist.errors import SpecError
from jupyter_dist.spec import SALLOC_KEYS, JobSpec, spec_from_dict

# Distribution keys set by options that only one job type has: key -> (type, flag).
_TYPE_FLAGS = {
    "worker_count": ("tensorflow", "--worker-count"),
    "parameter_server_count": ("tensorflow", "--ps-count"),
    "chief_count": ("tensorflow", "--chief"),
    "evaluator_count": ("tensorflow", "--evaluator"),
    "threads_per_process": ("dask", "--threads"),
    "scheduler_port": ("dask", "--scheduler-port"),
    "dashboard_port": ("dask", "--dashboard-port"),
}


# Options of an allocation the slurm backend asks for: the spec's `backend:` keys (flags
# --partition, --time, ...). `--slurm-job ID` (the key `job`) names an existing one instead.
SLURM_OPTIONS = SALLOC_KEYS


@dataclass
class LaunchOptions:
    """What a cell (or the form) asks for; None means "the spec's default"."""

    type: str = "pytorch"
    nodes: int = 1
    procs_per_node: int | None = None
    launcher: str | None = None
    worker_count: int | None = None  # tensorflow
    ps_count: int | None = None  # tensorflow
    chief: bool = False  # tensorflow
    evaluator: bool = False  # tensorflow
    threads: int | None = None  # dask
    scheduler_port: int | None = None  # dask
    dashboard_port: int | None = None  # dask
    env: list[str] = field(default_factory=list)  # NAME=VALUE
    code: str | None = None
    name: str | None = None
    timeout: int | None = None
    stall_timeout: int | None = None
    grace_period: int | None = None
    on_stall: str | None = None
    backend: str | None = None  # the spec's backend section, with the options below
    slurm_job: str | None = None  # slurm: an allocation to run in (its job id)
    partition: str | None = None  # slurm
    time: str | None = None  # slurm
    gpus_per_node: int | None = None  # slurm
    account: str | None = None  # slurm
    qos: str | None = None  # slurm
    constraint: str | None = None  # slurm

    @classmethod
    def take(cls, source: Any) -> LaunchOptions:
        """The options found as attributes of `source` (an argparse namespace): each that
        is there and not None."""
        found = {f.name: getattr(source, f.name, None) for f in fields(cls)}
        return cls(**{name: value for name, value in found.items() if value is not None})

    def to_spec(self, script: str, base_dir: Path | str, source: str = "%%distrun") -> JobSpec:
        """The job spec these options and the cell's code describe, validated like any YAML.
        An empty script for a dask job means an interactive cluster (no script)."""
        dist: dict[str, Any] = {"type": self.type}
        if self.procs_per_node is not None:
            if self.type == "tensorflow":
                raise SpecError("--procs-per-node does not apply to tensorflow; use --worker-count")
            dist["process_count_per_instance"] = self.procs_per_node
        if self.launcher:
            dist["launcher"] = self.launcher
        typed_options = {
            "worker_count": self.worker_count, "parameter_server_count": self.ps_count,
            "chief_count": 1 if self.chief else None,
            "evaluator_count": 1 if self.evaluator else None,
            "threads_per_process": self.threads, "scheduler_port": self.scheduler_port,
            "dashboard_port": self.dashboard_port,
        }  # fmt: skip
        for key, value in typed_options.items():
            if value is not None:
                job_type, flag = _TYPE_FLAGS[key]
                if self.type != job_type:
                    raise SpecError(f"{flag} applies to {job_type} jobs only (this is {self.type})")
                dist[key] = value
        data: dict[str, Any] = {"resources": {"instance_count": self.nodes}, "distribution": dist}
        if has_code(script) or self.type != "dask":  # an empty dask cell: an interactive cluster
            data["script"] = script
        env = env_pairs(self.env)
        if env:
            data["environment_variables"] = env
        if self.code:
            data["code"] = self.code
        if self.name:
            data["name"] = self.name
        limits = {
            key: value
            for key, value in (("timeout", self.timeout), ("stall_timeout", self.stall_timeout),
                               ("on_stall", self.on_stall), ("grace_period", self.grace_period))
            if value is not None
        }  # fmt: skip
        if limits:
            data["limits"] = limits
        backend = self.backend_section()
        if backend:
            data["backend"] = backend
        return spec_from_dict(data, base_dir=base_dir, source=source)

    def backend_section(self) -> dict[str, Any]:
        """The spec's `backend:` keys these options set ({} when none): the backend's name
        and its options (a Slurm option without --backend means --backend slurm)."""
        options = {key: getattr(self, key) for key in SLURM_OPTIONS if getattr(self, key)}
        if self.slurm_job:
            options = {"job": self.slurm_job, **options}
        if options and self.backend not in (None, "slurm"):
            flag = "--" + next(iter(options)).replace("_", "-").replace("job", "slurm-job")
            raise SpecError(f"{flag} applies to the slurm backend only (this is {self.backend})")
        if options or self.backend:
            return {"type": self.backend or "slurm", **options}
        return {}


def env_pairs(pairs: list[str] | None) -> dict[str, str]:
    """`["A=1", "B=x=y"]` as {"A": "1", "B": "x=y"}; SpecError for a pair without a name."""
    env: dict[str, str] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SpecError(f"--env: {pair!r} is not NAME=VALUE")
        env[name] = value
    return env


def has_code(cell: str) -> bool:
    """Whether a cell has anything to run (blank lines and comments are nothing)."""
    return any(line.strip() and not line.strip().startswith("#") for line in cell.splitlines())
