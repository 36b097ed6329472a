"""The job spec: a superset of Azure ML's command job, loaded from YAML, validated, dumped.

Every invalid spec becomes a `SpecError` whose message is one line naming the key, the value
and what would be valid. Azure-only keys are accepted and kept, never acted on.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    ConfigDict,
    Field,
    PrivateAttr,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)

from jupyter_dist.cell_syntax import syntax_problem
from jupyter_dist.env_names import environment_variables
from jupyter_dist.errors import SpecError
from jupyter_dist.spec_dialect import translate
from jupyter_dist.validation import (
    MAX_PROCS_PER_NODE,
    Port,
    StrictSection,
    YamlTooBig,
    check_values,
    count,
    fail,
    load_yaml,
    one_line,
    read_yaml_file,
)

JOB_TYPES = ("pytorch", "tensorflow", "mpi", "dask")
SCRIPT_NAME = "script.py"
SCRIPT_RUNNER_NAME = "cell_runner.py"  # shipped beside every inline script; runs it

_EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
_REFERENCE = re.compile(r"(inputs|outputs)\.([A-Za-z_][A-Za-z0-9_\-]*)\Z")
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
MAX_PRELOAD = 32  # modules a job may preload
PRELOAD_NONE = "none"  # `--preload none`: no pool, whatever was remembered (preload_memory)
_OUTPUT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,99}\Z")  # a file name on every node
OUTPUTS_FOLDER = "outputs"  # in the job's folder on each node: where outputs without a path go


# Sane caps, checked before anything is planned (a typo of 100000000 nodes would otherwise
# be planned, and started): far above what one notebook launches.
MAX_NODES = 4096
MAX_PROCESSES = 16384  # in one job, every node's together
MAX_SECONDS = 31 * 24 * 3600  # a time limit of a month
MAX_RESTARTS = 1000


Count = count(1, MAX_PROCS_PER_NODE)


class PyTorchDistribution(StrictSection):
    type: Literal["pytorch"]
    process_count_per_instance: Count = 1
    launcher: Literal["per_process", "torchrun"] = "per_process"
    master_port: Port | None = None


class TensorFlowDistribution(StrictSection):
    type: Literal["tensorflow"]
    worker_count: count(1, MAX_NODES) | None = None
    parameter_server_count: count(0, MAX_PROCS_PER_NODE) = 0
    chief_count: count(0, 1) = 0
    evaluator_count: count(0, 1) = 0
    base_port: Port | None = None
    # Ours: variables for the tasks of one type only, over the job's (task type -> mapping).
    task_environment_variables: dict[
        Literal["chief", "worker", "ps", "evaluator"], dict[str, str]
    ] = Field(default_factory=dict)

    @field_validator("task_environment_variables", mode="before")
    @classmethod
    def _task_env(cls, value: Any) -> Any:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise fail(
                "mapping",
                "expected a mapping of task types (chief, worker, ps, evaluator) to variables",
            )
        return {kind: environment_variables(env) for kind, env in value.items()}

    def tasks(self, instance_count: int) -> list[tuple[str, int]]:
        """Every task of the job as (kind, index), in order: chief?, workers (one per node
        unless worker_count says), ps, evaluator?. The one home of this rule: the spec caps
        their number, the planner places them, Slurm makes room for them."""
        workers = self.worker_count if self.worker_count is not None else instance_count
        return (
            [("chief", i) for i in range(self.chief_count)]
            + [("worker", i) for i in range(workers)]
            + [("ps", i) for i in range(self.parameter_server_count)]
            + [("evaluator", i) for i in range(self.evaluator_count)]
        )


class MpiDistribution(StrictSection):
    type: Literal["mpi"]
    process_count_per_instance: Count = 1
    launcher: Literal["mpirun", "horovodrun"] = "mpirun"
    mpi_args: list[str] = Field(default_factory=list)
    # Ours: the CPU and memory limits of the launcher's pod where an export has one (a
    # Kubeflow MPIJob's Launcher); a run on nodes does not cap them.
    launcher_limits: dict[Literal["cpu", "memory"], str | int | float] = Field(default_factory=dict)

    @field_validator("mpi_args", mode="before")
    @classmethod
    def _split_args(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return shlex.split(value)
            except ValueError as exc:
                raise fail("mpi_args", "not valid shell words ({err})", err=str(exc)) from None
        if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
            return [str(v) for v in value]
        raise fail("mpi_args", "expected a string or a list of strings")


class DaskDistribution(StrictSection):
    type: Literal["dask"]
    process_count_per_instance: Count = 1
    threads_per_process: Count | None = None
    scheduler_port: Port | None = None
    dashboard_port: Port | None = None


Distribution = Annotated[
    PyTorchDistribution | TensorFlowDistribution | MpiDistribution | DaskDistribution,
    Field(discriminator="type"),
]


class Resources(StrictSection):
    instance_count: count(1, MAX_NODES) = 1
    # Ours: the GPUs each node gives the job, whatever runs it (a backend's own
    # gpus_per_node, where the spec gives one, says what that backend asks for instead).
    gpus_per_node: count(0, MAX_PROCS_PER_NODE) | None = None
    # Azure-only (its job resource configuration): accepted and kept, never acted on.
    instance_type: Any = None
    shm_size: Any = None
    docker_args: Any = None
    properties: Any = None
    locations: Any = None
    max_instance_count: Any = None


class Limits(StrictSection):
    timeout: count(1, MAX_SECONDS) | None = None
    # Ours: seconds without output or CPU use after which the job looks stuck (0: never;
    # default run/stall.DEFAULT_STALL_TIMEOUT_S), and whether it is then only flagged or stopped.
    stall_timeout: count(0, MAX_SECONDS) | None = None
    on_stall: Literal["warn", "kill"] | None = None
    # Ours: seconds a stopped process has between SIGTERM and SIGKILL (to save a checkpoint);
    # default run/job.GRACE_PERIOD_S.
    grace_period: count(0, 3600) | None = None
    # Ours: how many times a failed job starts again under the same id (default 0), and
    # the seconds between a failed attempt's end and the next one's start (default
    # run/job.RESTART_DELAY_S).
    max_restarts: count(0, MAX_RESTARTS) | None = None
    restart_delay: count(0, 3600) | None = None


# The keys of `limits:`, which with_overrides and the fronts' options set one by one.
LIMIT_KEYS = tuple(Limits.model_fields)

DEFAULT_POST_MORTEM_WAIT_S = 300  # how long a failed rank waits for someone to look


class DebugSection(StrictSection):
    """Ours: the debugger (docs/debugging.md). `post_mortem`: a rank whose code raises pauses
    where it raised before it exits with its error; `wait`: how long it waits there for
    someone to look (default DEFAULT_POST_MORTEM_WAIT_S), once nobody is attached."""

    post_mortem: Annotated[bool, Strict()] = False
    wait: count(1, MAX_SECONDS) | None = None


DEFAULT_POOL_IDLE_S = 600  # how long a node's pool with no rank waits for the next job


class PreloadSection(StrictSection):
    """Ours: the nodes' pools (node_side/pool_server.py, docs/pool.md). `modules`: what each node's
    pool imports once; the job's Python ranks start forked from it. `idle`: how long a pool
    with no rank waits for a later job before it ends (default DEFAULT_POOL_IDLE_S). Written
    as a list (`preload: [torch, numpy]`) or as the CLI writes it ("torch,numpy"), it is the
    modules. `none` (or `[]`): no pool for this job, and the preload remembered from an
    earlier job (run/preload_memory.py) is forgotten."""

    modules: list[str]
    idle: count(1, MAX_SECONDS) | None = None

    @field_validator("modules", mode="before")
    @classmethod
    def _module_names(cls, value: Any) -> Any:
        if value == [] or (isinstance(value, str) and value.strip().lower() == PRELOAD_NONE):
            return []  # none: started cold, and the remembered preload forgotten
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise fail("preload", "expected a list of module names, e.g. [torch, numpy], or none")
        for name in value:
            if not _MODULE_NAME.match(name):
                shown = name if len(name) <= 40 else name[:40] + "..."
                raise fail(
                    "preload",
                    "{name!r} is not a module name (e.g. torch, transformers, my_pkg.models)",
                    name=shown,
                )
        if len(value) > MAX_PRELOAD:
            raise fail("preload", "{n} modules; at most {cap}", n=len(value), cap=MAX_PRELOAD)
        return list(dict.fromkeys(value))


MAX_METRIC_PATTERNS = 8  # `metrics.pattern`s a job may name


class MetricsSection(StrictSection):
    """Ours: lines of the job's own to read metrics from (run/metrics.py), beside what it
    reads with no help (report(), trainers' dicts, Keras' and tqdm's progress). `pattern`: a
    regular expression, or a list of them, searched in each line a rank prints; its named
    groups are the metrics (`loss`, `lr`, ...) and `step` the x-axis, e.g. nanoGPT's
    `iter (?P<step>\\d+): loss (?P<loss>[\\d.]+)`."""

    pattern: list[str]

    @field_validator("pattern", mode="before")
    @classmethod
    def _compiled(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise fail(
                "metrics", "metrics.pattern: expected a regular expression, or a list of them"
            )
        if len(value) > MAX_METRIC_PATTERNS:
            raise fail(
                "metrics",
                "metrics.pattern: {n} patterns; at most {cap}",
                n=len(value),
                cap=MAX_METRIC_PATTERNS,
            )
        for text in value:
            shown = text if len(text) <= 60 else text[:60] + "..."
            try:
                groups = re.compile(text).groupindex
            except re.error as exc:
                raise fail(
                    "metrics",
                    "metrics.pattern {text!r} is not a regular expression ({why})",
                    text=shown,
                    why=str(exc),
                ) from None
            if not set(groups) - {"step"}:
                raise fail(
                    "metrics",
                    "metrics.pattern {text!r} names no metric: give each "
                    "value a named group, e.g. loss (?P<loss>[\\d.]+), and the step "
                    "(?P<step>\\d+)",
                    text=shown,
                )
        return value


class BackendSection(StrictSection):
    """Ours: where the job runs (`--backend`), with the backend's own options. Slurm's:
    when no allocation holds the notebook, the one jupyter-dist asks for. Any other
    backend's keys (its declared options' `spec_key`s, e.g. ray's `address`) are kept as
    they are written (`option(key)`); the backend checks them when the job is planned
    (backends.check_section), so a new backend declares them in its own module only."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    type: str
    job: str | None = None  # Slurm: the allocation to run in (its job id), else SLURM_JOB_ID's
    partition: str | None = None
    time: str | None = None  # Slurm's time limit, e.g. "01:00:00"
    gpus_per_node: count(0) | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None

    @field_validator("type", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="before")
    @classmethod
    def _scalar_options(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, value in data.items():
                if key not in cls.model_fields and not isinstance(value, str | int | float):
                    raise fail("backend_option", "{key}: expected a string or a number", key=key)
        return data

    def option(self, key: str) -> Any:
        """A backend's own key as the spec wrote it (None: not written)."""
        return (self.model_extra or {}).get(key)

    @field_validator("job", mode="before")
    @classmethod
    def _job_id(cls, value: Any) -> Any:
        text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
        if text is not None and not (isinstance(text, str) and text.isdigit()):
            raise fail("slurm_job", "expected a Slurm job id (its number, e.g. 1234)")
        return text

    @model_validator(mode="after")
    def _one_allocation(self) -> BackendSection:
        asked = [name for name in SALLOC_KEYS if getattr(self, name) is not None]
        if self.job and asked:
            raise fail(
                "slurm_job",
                "{key} applies to an allocation jupyter-dist asks for; job: {job} "
                "names one that exists",
                key=asked[0],
                job=self.job,
            )
        return self


# The keys of an allocation that jupyter-dist asks Slurm for (salloc's options).
SALLOC_KEYS = ("partition", "time", "gpus_per_node", "account", "qos", "constraint")


InputValue = str | int | float | bool | dict


class Output(StrictSection):
    """Where the job writes a result (`${{outputs.NAME}}` in the command): Azure ML's output,
    written on the nodes. Without a path of the nodes' own, `outputs/NAME` in the job's
    folder on each node (a file there for uri_file), which the runner copies into the store
    when the job ends. An Azure ML location (`azureml://...`) is kept for Azure, not used."""

    # Azure's types; all but uri_file are folders here.
    type: Literal[
        "uri_folder", "uri_file", "mlflow_model", "custom_model", "triton_model", "mltable"
    ] = "uri_folder"
    path: Annotated[str, Strict()] | None = None  # absolute on every node, or Azure's
    # Azure's: accepted and kept, never acted on.
    mode: Any = None
    description: Any = None
    name: Any = None
    version: Any = None

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/") and not _is_azure_location(value):
            raise fail(
                "output_path",
                "{path!r} is not absolute; give an absolute path on the nodes, or leave "
                "path out (the job's folder)",
                path=value,
            )
        return value

    @property
    def node_path(self) -> str | None:
        """The path on the nodes the spec gives (None: the job's folder; an Azure ML
        location is Azure's, not the nodes')."""
        return None if self.path is None or _is_azure_location(self.path) else self.path

    def where(self, name: str) -> str:
        """What `${{outputs.NAME}}` becomes in the command: its path, else the job's."""
        return self.node_path or f"${{DISTRUN_JOB_DIR}}/{OUTPUTS_FOLDER}/{name}"

    def folder(self, name: str) -> str:
        """The folder that must exist before the command runs (as the shell writes it)."""
        if self.type != "uri_file":
            return self.where(name)
        job_outputs = f"${{DISTRUN_JOB_DIR}}/{OUTPUTS_FOLDER}"
        return posixpath.dirname(self.node_path) if self.node_path else job_outputs


def _is_azure_location(path: str) -> bool:
    return "://" in path or path.startswith("azureml:")


class JobSpec(StrictSection):
    """A validated job. Build it with `load_spec`, `parse_spec` or `spec_from_dict`."""

    schema_: Any = Field(default=None, alias="$schema")  # Azure's; first, as Azure writes it
    # Ours and Azure's, acted on.
    # Text as YAML writes text: not a number, not bytes (`!!binary` would pass as text).
    command: Annotated[str, Strict()] | None = None
    script: Annotated[str, Strict()] | None = None  # ours: run as $DISTRUN_JOB_DIR/script.py
    code: str | dict | None = None
    inputs: dict[str, InputValue] = Field(default_factory=dict)
    environment_variables: dict[str, Any] = Field(default_factory=dict)
    resources: Resources = Field(default_factory=Resources)
    distribution: Distribution = Field(default_factory=lambda: PyTorchDistribution(type="pytorch"))
    limits: Limits | None = None
    nodes: list[str] | None = None
    name: str | None = None
    backend: BackendSection | None = None
    # Ours: check before any rank starts that every node reaches where the ranks meet, and
    # has the interfaces the job names (diagnose/network.py); false skips it.
    network_check: Annotated[bool, Strict()] = True
    debug: DebugSection | None = None
    # Ours: what each node's pool imports once, to fork the job's Python ranks from.
    preload: PreloadSection | None = None
    # Ours: the job's own lines to read metrics from (run/metrics.py).
    metrics: MetricsSection | None = None
    # Azure-only: accepted and kept, never acted on.
    type: Any = None
    display_name: Any = None
    experiment_name: Any = None
    description: Any = None
    tags: Any = None
    properties: Any = None
    environment: Any = None
    compute: Any = None
    outputs: dict[str, Output] = Field(default_factory=dict)
    identity: Any = None
    services: Any = None
    queue_settings: Any = None
    is_deterministic: Any = None

    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)
    # What of the design proposal's shape was read as what (spec_dialect.py), one line each.
    _read_as: list[str] = PrivateAttr(default_factory=list)

    @field_validator("script")
    @classmethod
    def _is_python(cls, value: str | None) -> str | None:
        problem = syntax_problem(value) if value is not None else None
        if problem is not None:  # else every rank fails alike, once nodes are taken
            raise fail("script", "{problem}", problem=problem)
        return value

    @field_validator("distribution", mode="before")
    @classmethod
    def _known_type(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise fail("mapping", "expected a mapping with a 'type' key")
        kind = value.get("type")
        if kind is None:
            raise fail("type", "missing 'type'; valid types: " + ", ".join(JOB_TYPES))
        if not isinstance(kind, str) or kind.lower() not in JOB_TYPES:
            raise fail(
                "type",
                "unknown type {given!r}; valid types: {valid}",
                given=kind,
                valid=", ".join(JOB_TYPES),
            )
        return {**value, "type": kind.lower()}

    @field_validator("code", mode="before")
    @classmethod
    def _local_code(cls, value: Any) -> Any:
        path = value.get("path") if isinstance(value, dict) else value
        if value is None:
            return None
        if not isinstance(path, str) or not path:
            raise fail("code", "expected a folder path (a string, or a mapping with 'path')")
        if path.startswith("azureml:"):
            raise fail("code", "an Azure ML asset cannot be shipped; give a local folder")
        return value

    @field_validator("inputs", mode="before")
    @classmethod
    def _input_mapping(cls, value: Any) -> Any:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise fail("mapping", "expected a mapping of input names to values")
        for key, item in value.items():
            if item is None or isinstance(item, list):
                raise fail(
                    "input",
                    "input {key!r} has no usable value; give a literal or {{path: ...}}",
                    key=key,
                )
            if isinstance(item, dict) and not any(k in item for k in ("path", "value", "default")):
                raise fail("input", "input {key!r} needs a 'path', 'value' or 'default'", key=key)
        return value

    @field_validator("outputs", mode="before")
    @classmethod
    def _output_mapping(cls, value: Any) -> Any:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise fail("mapping", "expected a mapping of output names to {{type, path}}")
        for name in value:
            if not isinstance(name, str) or not _OUTPUT_NAME.match(name):
                shown = name if not isinstance(name, str) or len(name) <= 40 else name[:40] + "..."
                raise fail(
                    "output",
                    "{name!r} cannot name an output (letters, digits, _ "
                    "and -, at most 100; not first a digit)",
                    name=shown,
                )
        return {name: {} if item is None else item for name, item in value.items()}

    @field_validator("environment_variables", mode="before")
    @classmethod
    def _env_names(cls, value: Any) -> Any:
        return environment_variables(value)

    @field_validator("preload", mode="before")
    @classmethod
    def _preload_modules(cls, value: Any) -> Any:
        return {"modules": value} if isinstance(value, str | list) else value

    @field_validator("metrics", mode="before")
    @classmethod
    def _metrics_patterns(cls, value: Any) -> Any:
        return {"pattern": value} if isinstance(value, str | list) else value

    def metric_patterns(self) -> list[str]:
        """The job's own metrics patterns (`metrics.pattern`), [] where it names none."""
        return list(self.metrics.pattern) if self.metrics is not None else []

    @field_validator("nodes", mode="before")
    @classmethod
    def _node_names(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise fail("nodes", "expected a non-empty list of node names")
        if len(set(value)) != len(value):
            raise fail("nodes", "a node is listed twice")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if self.command is None and self.script is None and self.distribution.type != "dask":
            raise fail(
                "missing", "command: missing; every job of this type needs a command (or a script)"
            )
        if self.command is not None and not self.command.strip():
            raise fail("missing", "command: empty; give what each process runs")
        if self.command:
            _substitute(self.command, self.inputs, self.outputs)  # unknown names fail here
        count_set = "instance_count" in self.resources.model_fields_set
        if self.nodes is not None:
            if count_set and self.resources.instance_count != len(self.nodes):
                raise fail(
                    "nodes",
                    "nodes: lists {n} node(s) but resources.instance_count is {c}; make them agree",
                    n=len(self.nodes),
                    c=self.resources.instance_count,
                )
            if not count_set:
                self.resources = Resources(instance_count=len(self.nodes))
        dist = self.distribution
        if isinstance(dist, TensorFlowDistribution):
            processes = len(dist.tasks(self.resources.instance_count))
        else:
            processes = self.resources.instance_count * dist.process_count_per_instance
        if processes > MAX_PROCESSES:
            raise fail(
                "size",
                "distribution: {n} processes in one job; at most {cap}",
                n=processes,
                cap=MAX_PROCESSES,
            )
        return self

    # -- derived values ------------------------------------------------------------------

    @property
    def job_type(self) -> str:
        return self.distribution.type

    @property
    def instance_count(self) -> int:
        return self.resources.instance_count

    @property
    def timeout(self) -> int | None:
        return self.limits.timeout if self.limits else None

    @property
    def stall_timeout(self) -> int | None:
        return self.limits.stall_timeout if self.limits else None

    @property
    def on_stall(self) -> str | None:
        return self.limits.on_stall if self.limits else None

    @property
    def grace_period(self) -> int | None:
        return self.limits.grace_period if self.limits else None

    @property
    def max_restarts(self) -> int:
        return (self.limits.max_restarts if self.limits else None) or 0

    @property
    def restart_delay(self) -> int | None:
        return self.limits.restart_delay if self.limits else None

    def processes_per_node(self) -> int:
        """The most processes the job starts on one node: what a node is asked for (Slurm's
        tasks, a Ray bundle's CPUs). Dask: its workers (the scheduler and the client beside
        them on node 0 mostly wait); TensorFlow: its tasks, spread over the nodes."""
        dist = self.distribution
        if isinstance(dist, TensorFlowDistribution):
            return -(-len(dist.tasks(self.instance_count)) // self.instance_count) or 1
        return getattr(dist, "process_count_per_instance", None) or 1

    @property
    def read_as(self) -> list[str]:
        """How the file's proposal-shaped keys were read (`distributed:` and what goes with
        it), one line each; [] for a spec in the canonical shape."""
        return list(self._read_as)

    def gpus_per_node(self) -> int | None:
        """The GPUs a node gives the job: the backend section's, else `resources`'."""
        given = self.backend.gpus_per_node if self.backend else None
        return given if given is not None else self.resources.gpus_per_node

    def resolved_command(self) -> str | None:
        """The command with every `${{inputs.NAME}}` replaced by its value; with only a
        `script`, the command runs it."""
        if self.command:
            return _substitute(self.command, self.inputs, self.outputs)
        return script_command() if self.script is not None else None

    def code_dir(self) -> Path | None:
        """The `code` folder as an absolute path (relative to the YAML file's folder)."""
        if self.code is None:
            return None
        raw = self.code["path"] if isinstance(self.code, dict) else self.code
        return (self._base_dir / Path(raw).expanduser()).resolve()

    def display_name_or_default(self) -> str:
        return str(self.name or self.display_name or self.job_type)

    def preload_env(self) -> dict[str, str]:
        """What tells each node's agent to fork the ranks from a pool (node_side/pool_server.py)."""
        if self.preload is None or not self.preload.modules:
            return {}
        idle = self.preload.idle or DEFAULT_POOL_IDLE_S
        return {"DISTRUN_PRELOAD": ",".join(self.preload.modules), "DISTRUN_POOL_IDLE": str(idle)}

    def post_mortem_wait(self) -> int | None:
        """Seconds a failed rank waits in its debugger; None: it exits at once."""
        if self.debug is None or not self.debug.post_mortem:
            return None
        return self.debug.wait or DEFAULT_POST_MORTEM_WAIT_S

    def to_dict(self) -> dict[str, Any]:
        """The spec as the keys it was given (unset keys left out), in JSON's types: what
        `spec_from_dict` reads back into the same spec."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)

    def to_yaml(self) -> str:
        """`to_dict` as YAML, as the store keeps a job's spec (`spec.yml`)."""
        return dump_yaml(self.to_dict())

    def with_overrides(self, **changes: Any) -> JobSpec:
        """A copy with some keys changed, validated again (the same errors as the YAML).

        Args:
            **changes: Keys to set; a value of None leaves the key as it is.
                `instance_count`, `nodes`, `network_check`, `name`, `preload` (its
                modules), `metrics_pattern` (patterns added to `metrics.pattern`), those of
                `limits:` (LIMIT_KEYS), `post_mortem` (of `debug:`), `backend` (a mapping
                merged into the backend section), and any key of the distribution section.

        Returns:
            A new spec; this one is unchanged.

        Raises:
            SpecError: A changed value is not valid (one line, as for the YAML).
        """
        data = self.to_dict()
        dist = dict(data.get("distribution") or {"type": self.job_type})
        for key, value in changes.items():
            if value is None:
                continue
            if key == "instance_count":
                data["resources"] = {**data.get("resources", {}), "instance_count": value}
            elif key in ("nodes", "network_check", "name"):
                data[key] = value
            elif key == "preload":  # the modules: the section's other keys stay
                data["preload"] = {**(data.get("preload") or {}), "modules": value}
            elif key == "metrics_pattern":  # added to the spec's own
                kept = (data.get("metrics") or {}).get("pattern") or []
                data["metrics"] = {"pattern": [*kept, *value]}
            elif key in LIMIT_KEYS:
                data["limits"] = {**data.get("limits", {}), key: value}
            elif key == "post_mortem":
                data["debug"] = {**data.get("debug", {}), key: value}
            elif key == "backend":  # {type: ..., option: value}: merged into the section
                data["backend"] = {**(data.get("backend") or {}), **value}
            else:
                dist[key] = value
        data["distribution"] = dist
        changed = spec_from_dict(data, base_dir=self._base_dir)
        changed._read_as = list(self._read_as)  # how the file was read still holds
        return changed


class _SpecDumper(yaml.SafeDumper):
    """Multi-line strings (a notebook cell as `script`) as readable `|` blocks; a mapping
    used twice is written out twice (no YAML anchors: other tools' readers differ on them)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_yaml(data: dict[str, Any]) -> str:
    """A spec-like mapping as YAML, keys in their order, multi-line strings as `|` blocks."""
    return yaml.dump(data, Dumper=_SpecDumper, sort_keys=False)


def script_command(outs: list[str] | tuple[str, ...] = ()) -> str:
    """The command that runs a job's inline `script` on a rank (through the runner, which
    also saves the `outs` a notebook cell asked for). `python3`: the agent puts the node's
    Python's folder first on PATH, and a system Python (Debian's) has no `python`."""
    names = f" {shlex.quote(','.join(outs))}" if outs else ""
    return f'python3 "$DISTRUN_JOB_DIR/{SCRIPT_RUNNER_NAME}"{names}'


def _block_strings(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_SpecDumper.add_representer(str, _block_strings)


def _input_text(value: InputValue) -> str:
    if isinstance(value, dict):
        value = next(value[k] for k in ("path", "value", "default") if k in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _substitute(
    command: str, inputs: dict[str, InputValue], outputs: dict[str, Output] | None = None
) -> str:
    outputs = outputs or {}

    def replace(match: re.Match[str]) -> str:
        ref = _REFERENCE.match(match.group(1))
        if not ref:
            raise fail(
                "expression",
                "command: {expr} is not supported; only ${{{{inputs.NAME}}}} and "
                "${{{{outputs.NAME}}}} are",
                expr=match.group(0),
            )
        kind, name = ref.groups()
        defined = inputs if kind == "inputs" else outputs
        if name not in defined:
            known = ", ".join(sorted(defined)) or "none"
            raise fail(
                "input",
                "command: ${{{{{kind}.{name}}}}} is not defined in {kind} "
                "({kind} defined: {known})",
                kind=kind,
                name=name,
                known=known,
            )
        return _input_text(inputs[name]) if kind == "inputs" else outputs[name].where(name)

    return _EXPRESSION.sub(replace, command)


# -- loading -------------------------------------------------------------------------------


def _one_line(exc: ValidationError, data: dict[str, Any]) -> str:
    dist = data.get("distribution")
    tagged = isinstance(dist, dict) and dist.get("type") is not None
    return one_line(
        exc,
        drop_parts=JOB_TYPES if tagged else (),  # the union's tag in the error location
        whole_prefixes=("command:", "nodes:", "distribution:"),
    )


def spec_from_dict(data: Any, base_dir: Path | str | None = None, source: str = "") -> JobSpec:
    """Validate a mapping (a parsed YAML document) into a `JobSpec`.

    Args:
        data: The spec's keys, as Azure ML's command job or the design proposal's shape
            writes them (spec_dialect.translate reads the latter).
        base_dir: The folder a relative `code` is resolved from (default: the working one).
        source: What to name in errors (a file's path), or "".

    Returns:
        The validated spec.

    Raises:
        SpecError: One line naming the key that is wrong and what would be valid.
    """
    prefix = f"{source}: " if source else ""
    if not isinstance(data, dict):
        kind = type(data).__name__ if data is not None else "nothing"
        raise SpecError(f"{prefix}a job spec must be a mapping of keys (found {kind})")
    try:
        check_values(data)
    except YamlTooBig as exc:
        raise SpecError(f"{prefix}{exc}") from None
    try:
        data, read_as = translate(data)
    except SpecError as exc:
        raise SpecError(f"{prefix}{exc}") from None
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(prefix + _one_line(exc, data)) from None
    spec._base_dir = Path(base_dir or Path.cwd()).resolve()
    spec._read_as = read_as
    try:
        code = spec.code_dir()
        usable = code is None or code.is_dir()
    except (OSError, RuntimeError) as exc:  # ~nosuchuser, a name too long for the system
        raw = spec.code["path"] if isinstance(spec.code, dict) else spec.code
        raw = raw if len(raw) <= 60 else raw[:60] + "..."
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SpecError(f"{prefix}code: {raw!r} cannot be used ({reason})") from None
    if not usable:
        raise SpecError(f"{prefix}code: {code} is not a folder; give the folder to ship and run in")
    return spec


def parse_spec(text: str, base_dir: Path | str | None = None, source: str = "") -> JobSpec:
    """Parse YAML text into a `JobSpec` (see `spec_from_dict`).

    Args:
        text: The spec's YAML (bounded in size and depth: validation.load_yaml).
        base_dir: The folder a relative `code` is resolved from (default: the working one).
        source: What to name in errors (a file's path), or "".

    Returns:
        The validated spec.

    Raises:
        SpecError: The text is not YAML (with its line and column), or not a valid spec.
    """
    prefix = f"{source}: " if source else ""
    try:
        data = load_yaml(text)
    except YamlTooBig as exc:
        raise SpecError(f"{prefix}{exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"{prefix}not valid YAML: {where}{problem}") from None
    return spec_from_dict(data, base_dir=base_dir, source=source)


def load_spec(path: Path | str) -> JobSpec:
    """Load a job spec YAML file.

    Args:
        path: The file; a relative `code` in it is resolved from the file's folder.

    Returns:
        The validated spec.

    Raises:
        SpecError: The file is missing, unreadable, too large, or not a valid spec.
    """
    path = Path(path)
    try:
        text = read_yaml_file(path)
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except YamlTooBig as exc:
        raise SpecError(f"{path}: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read it ({exc.__class__.__name__})") from None
    return parse_spec(text, base_dir=path.resolve().parent, source=str(path))
