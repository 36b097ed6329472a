"""Every launch option, declared once, and the typed model of what a cell (or the form, or a
command line) asks for.

`OPTIONS` is the one declaration of the options every job has: each `Option` has its flag,
short flag, type, help, the job types it applies to, its bounds (the spec's own caps) and
the fronts that offer it. A backend declares its own the same way, on its class
(`Backend.options`, e.g. Slurm's --partition); `backends.declared_options()` is both
together. The magic's arguments, the CLI's parsers and the form's controls are all built
from that (`add_to`, `argparse_kwargs`), and `LaunchOptions.to_spec` checks against it, so
an option is added, or its help changed, in one place:

    options = LaunchOptions(type="pytorch", nodes=2, procs_per_node=2, env=["A=1"])
    spec = options.to_spec("import torch ...", base_dir=".")

Every option maps to a key of the job spec; a wrong one is a `SpecError` of one line that
names the option as the user wrote it (`--ps-count applies to tensorflow jobs only`).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from jupyter_dist.errors import SpecError
from jupyter_dist.spec import (
    JOB_TYPES,
    LIMIT_KEYS,
    MAX_NODES,
    MAX_PROCS_PER_NODE,
    MAX_RESTARTS,
    MAX_SECONDS,
    JobSpec,
    spec_from_dict,
)

# The fronts an option can appear in: the magic's line, the CLI's commands that read a spec
# (plan, export, run), the CLI's `run` alone, the form.
MAGIC, CLI_SPEC, CLI_RUN, FORM = "magic", "cli", "cli-run", "form"
_EVERYWHERE = frozenset({MAGIC, CLI_SPEC, FORM})
_NOTEBOOK = frozenset({MAGIC, FORM})  # what a spec file says (the CLI reads one)
_RUN = frozenset({MAGIC, CLI_RUN, FORM})  # what only running needs


@dataclass(frozen=True)
class Option:
    """One option as every front shows it.

    `kind` is how a value is written: "str", "int", "float", "flag" (present or not) or
    "list" (repeatable). `bounds` (low, high) are the spec's own caps for a number.
    `job_types` empty means every type; `backend` names the backend whose option it is,
    and `spec_key` its key in the spec's `backend:` section (default: its name). `pattern`
    is what a "str" value must match whole, `expects` the words that say so.
    """

    name: str  # the LaunchOptions field and argparse dest: "procs_per_node"
    help: str
    kind: str = "str"
    short: str | None = None
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    bounds: tuple[int, int] | None = None
    job_types: tuple[str, ...] = ()
    backend: str | None = None
    fronts: frozenset[str] = _EVERYWHERE
    spec_key: str = ""
    pattern: str | None = None
    expects: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def full_help(self) -> str:
        """The help every front prints: what it applies to, then what it does."""
        where = ", ".join(self.job_types) if self.job_types else self.backend
        return f"{where}: {self.help}" if where else self.help

    def argparse_kwargs(self) -> dict[str, Any]:
        """What argparse's add_argument takes for it (besides the flags)."""
        kwargs: dict[str, Any] = {"dest": self.name, "help": self.full_help}
        if self.kind == "flag":
            kwargs["action"] = "store_true"
            return kwargs
        if self.kind == "list":
            kwargs["action"] = "append"
        elif self.kind in ("int", "float"):
            kwargs["type"] = int if self.kind == "int" else float
        if self.choices:
            kwargs["choices"] = self.choices
        if self.metavar:
            kwargs["metavar"] = self.metavar
        return kwargs

    def flags(self) -> list[str]:
        return [self.short, self.flag] if self.short else [self.flag]


# Laid out by hand: a table, one option in a row or two.
# fmt: off
OPTIONS: tuple[Option, ...] = (
    Option("type", f"the job type: {', '.join(JOB_TYPES)} (default: pytorch)", short="-t",
           metavar="TYPE", fronts=_NOTEBOOK),
    Option("nodes", "number of nodes (the spec's resources.instance_count)", kind="int",
           short="-n", metavar="N", bounds=(1, MAX_NODES)),
    Option("procs_per_node", "processes per node", kind="int", short="-p", metavar="P",
           bounds=(1, MAX_PROCS_PER_NODE), job_types=("pytorch", "mpi", "dask")),
    Option("launcher", "per_process or torchrun (pytorch); mpirun or horovodrun (mpi)",
           metavar="NAME", job_types=("pytorch", "mpi"), fronts=_NOTEBOOK),
    Option("worker_count", "workers (default: one per node)", kind="int", metavar="N",
           bounds=(1, MAX_NODES), job_types=("tensorflow",),
           fronts=_NOTEBOOK),
    Option("ps_count", "parameter servers", kind="int", metavar="N",
           bounds=(0, MAX_PROCS_PER_NODE), job_types=("tensorflow",),
           fronts=_NOTEBOOK),
    Option("chief", "add a chief", kind="flag", job_types=("tensorflow",),
           fronts=_NOTEBOOK),
    Option("evaluator", "add an evaluator", kind="flag", job_types=("tensorflow",),
           fronts=_NOTEBOOK),
    Option("threads", "threads per worker process", kind="int", metavar="N",
           bounds=(1, MAX_PROCS_PER_NODE), job_types=("dask",),
           fronts=_NOTEBOOK),
    Option("scheduler_port", "the scheduler's port (default: a free one)", kind="int",
           metavar="PORT", bounds=(1, 65535), job_types=("dask",),
           fronts=_NOTEBOOK),
    Option("dashboard_port", "the dashboard's port (default: a free one)", kind="int",
           metavar="PORT", bounds=(1, 65535), job_types=("dask",),
           fronts=_NOTEBOOK),
    Option("env", "an environment variable for every process (repeatable)", kind="list",
           short="-e", metavar="NAME=VALUE", fronts=_NOTEBOOK),
    Option("code", "a folder shipped to every node; the processes' working directory",
           metavar="DIR", fronts=_NOTEBOOK),
    Option("name", "the job's name (shown in job lists; the spec's name:)", fronts=_EVERYWHERE),
    Option("nodes_file", "node inventory (default: $DISTRUN_NODES_FILE, else the Jupyter "
           "config dir's distrun/nodes.yml; none means local nodes)", metavar="FILE",
           fronts=frozenset({MAGIC, CLI_SPEC})),
    Option("backend", "where the processes run: local, ssh, slurm, ray or an installed one; "
           "default: the spec's backend, else slurm where SLURM_JOB_ID is set, ssh with a "
           "node inventory, local without", metavar="NAME"),
    Option("timeout", "stop the job after this many seconds", kind="int", metavar="SECONDS",
           bounds=(1, MAX_SECONDS), fronts=_RUN),
    Option("stall_timeout", "flag the job as stuck, with every rank's stack, once no rank "
           "printed or used CPU for this long (default 300; 0: never)", kind="int",
           metavar="SECONDS", bounds=(0, MAX_SECONDS),
           fronts=_RUN),
    Option("on_stall", "what a stall does: warn (the default: say so, with the stacks) or "
           "kill (stop the job too)", choices=("warn", "kill"),
           fronts=_RUN),
    Option("grace_period", "how long a stopped process has between SIGTERM and SIGKILL, to "
           "save its work (default 5)", kind="int", metavar="SECONDS", bounds=(0, 3600),
           fronts=_RUN),
    Option("max_restarts", "start the whole job again, up to this many times, when a rank "
           "fails or a node is lost; ranks read DISTRUN_RESTART_COUNT (default 0)",
           kind="int", metavar="N", bounds=(0, MAX_RESTARTS), fronts=_RUN),
    Option("restart_delay", "seconds between a failed attempt's end and the next one's "
           "start (default 3)", kind="int", metavar="SECONDS", bounds=(0, 3600),
           fronts=_RUN),
    Option("no_preflight", "skip the network check before launch (every node reaches where "
           "the ranks meet, and has the interfaces GLOO/NCCL_SOCKET_IFNAME name; gloo is "
           "given the interface that reaches the master where a hostname would mislead it)",
           kind="flag", fronts=_RUN),
    Option("post_mortem", "a rank whose code raises pauses where it raised, for `jupyter "
           "distrun debug`, then exits with its error once you continue or quit (or once "
           "nobody attached for debug.wait seconds, 300 by default)", kind="flag",
           fronts=_RUN),
    Option("preload", "modules each node's pool imports once (e.g. torch,transformers): the "
           "job's Python ranks start forked from it, with those already imported; the pool "
           "stays for later jobs until idle 10 minutes (`jupyter distrun pool stop` ends it); "
           "later Python jobs that name none take the same for a day; none: start cold, and "
           "forget it", metavar="MODULES"),
    Option("metrics_pattern", "a regular expression whose named groups are metrics, read "
           "from each line a rank prints (step: the x-axis), e.g. 'iter (?P<step>\\d+): "
           "loss (?P<loss>[\\d.]+)'; give it again for more lines", kind="list",
           metavar="REGEX"),
    Option("detach", "keep the job running when this kernel or terminal goes: return once "
           "every rank runs; follow it with attach, stop it with cancel", kind="flag",
           fronts=_RUN),
)
# fmt: on

BY_NAME = {option.name: option for option in OPTIONS}


def offered(front: str, declared: Iterable[Option] = OPTIONS) -> list[Option]:
    """The options of `declared` that `front` offers, in declaration order."""
    return [option for option in declared if front in option.fronts]


def add_to(parser: argparse.ArgumentParser, front: str, declared: Iterable[Option]) -> None:
    """Add the options of `declared` that `front` offers to an argparse parser."""
    for option in offered(front, declared):
        parser.add_argument(*option.flags(), **option.argparse_kwargs())


def markdown_table(options: Iterable[Option]) -> str:
    """The options as a Markdown table (docs/options.md is backends.declared_options()'s,
    written out)."""
    where = {MAGIC: "%%distrun", CLI_SPEC: "CLI", CLI_RUN: "CLI run", FORM: "form"}
    rows = ["| option | applies to | help | offered by |", "|---|---|---|---|"]
    for option in options:
        flags = ", ".join(f"`{flag}`" for flag in option.flags())
        applies = ", ".join(option.job_types) or option.backend or "every job"
        fronts = ", ".join(where[f] for f in where if f in option.fronts)
        rows.append(f"| {flags} | {applies} | {option.help} | {fronts} |")
    return "\n".join(rows) + "\n"


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
    max_restarts: int | None = None
    restart_delay: int | None = None
    no_preflight: bool = False
    post_mortem: bool = False
    preload: str | None = None
    metrics_pattern: list[str] = field(default_factory=list)
    detach: bool = False  # who owns the job (run/supervisor.py), not what the spec says
    backend: str | None = None  # the spec's backend section, with the backends' options:
    backend_options: dict[Option, Any] = field(default_factory=dict)  # declared by backends

    @classmethod
    def take(cls, source: Any, declared: Iterable[Option] = OPTIONS) -> LaunchOptions:
        """The options found as attributes of `source` (an argparse namespace): each that
        is there and not None, the backends' options among `declared` included."""
        found = {f.name: getattr(source, f.name, None) for f in fields(cls)}
        found["backend_options"] = {
            option: getattr(source, option.name)
            for option in declared
            if option.backend and getattr(source, option.name, None) is not None
        }
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
            "worker_count": self.worker_count,
            "parameter_server_count": self.ps_count,
            "chief_count": 1 if self.chief else None,
            "evaluator_count": 1 if self.evaluator else None,
            "threads_per_process": self.threads,
            "scheduler_port": self.scheduler_port,
            "dashboard_port": self.dashboard_port,
        }
        self.check_applies()
        dist.update({key: value for key, value in typed_options.items() if value is not None})
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
        limits = {key: getattr(self, key) for key in LIMIT_KEYS if getattr(self, key) is not None}
        if limits:
            data["limits"] = limits
        backend = self.backend_section()
        if backend:
            data["backend"] = backend
        if self.no_preflight:
            data["network_check"] = False
        if self.post_mortem:
            data["debug"] = {"post_mortem": True}
        if self.preload:
            data["preload"] = self.preload
        if self.metrics_pattern:
            data["metrics"] = {"pattern": list(self.metrics_pattern)}
        return spec_from_dict(data, base_dir=base_dir, source=source)

    def check_applies(self) -> None:
        """SpecError for the first option given that this job type does not have (as
        declared in OPTIONS)."""
        for option in OPTIONS:
            if option.job_types and self.type not in option.job_types and self._given(option):
                types = " and ".join(option.job_types)
                raise SpecError(f"{option.flag} applies to {types} jobs only (this is {self.type})")

    def _given(self, option: Option) -> bool:
        return _is_given(getattr(self, option.name, None))

    def backend_section(self) -> dict[str, Any]:
        """The spec's `backend:` keys these options set ({} when none): the backend's name
        and its options (a backend's option without --backend means that backend)."""
        own = {o: v for o, v in self.backend_options.items() if _is_given(v)}
        for option in own:
            if self.backend not in (None, option.backend):
                raise SpecError(
                    f"{option.flag} applies to the {option.backend} backend only (this is "
                    f"{self.backend})"
                )
        backends = {option.backend for option in own}
        if len(backends) > 1:
            raise SpecError(f"options of two backends at once: {', '.join(sorted(backends))}")
        options = {option.spec_key or option.name: value for option, value in own.items()}
        if options or self.backend:
            return {"type": self.backend or backends.pop(), **options}
        return {}


def _is_given(value: Any) -> bool:
    """Whether an option holds a value (a flag set, a list not empty), not its default."""
    return value not in (None, False, [])


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
